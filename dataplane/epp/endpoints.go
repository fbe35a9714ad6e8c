package epp

import (
	"cmp"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/cartrouter/cart/dataplane/router"
)

// Endpoint returns a worker URL's address as the gateway's endpoint,
// "ip:port" (an IPv6 address in brackets), and false when the URL names
// no IP address: a gateway dials the address as given (Envoy's
// ORIGINAL_DST cluster takes an IP), so a host name cannot be an answer.
// A URL without a port gets its scheme's.
func Endpoint(workerURL string) (string, bool) {
	u, err := url.Parse(workerURL)
	if err != nil || u.Host == "" {
		return "", false
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return "", false
	}
	return canonical(ap), true
}

// canonical writes an address as every side of the protocol compares it:
// the address unmapped (a v4-in-v6 form names the v4 host) and zone-less.
func canonical(ap netip.AddrPort) string {
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()).String()
}

// parseEndpoint reads an "ip:port" the gateway sent, canonically.
func parseEndpoint(s string) (string, bool) {
	ap, err := netip.ParseAddrPort(strings.TrimSpace(s))
	if err != nil {
		return "", false
	}
	return canonical(ap), true
}

// pool maps the gateway's endpoints to the router's workers.
type pool struct {
	workers []router.WorkerStatus
	byAddr  map[string]string // endpoint -> worker URL
	addrOf  map[string]string // worker URL -> endpoint
}

func newPool(ws []router.WorkerStatus) *pool {
	p := &pool{workers: ws, byAddr: make(map[string]string, len(ws)), addrOf: make(map[string]string, len(ws))}
	for _, w := range ws {
		if a, ok := Endpoint(w.URL); ok {
			p.byAddr[a] = w.URL
			p.addrOf[w.URL] = a
		}
	}
	return p
}

// excluded returns the workers outside subset (endpoints the gateway
// allows), and the workers that have no endpoint at all: neither can be
// an answer. A nil subset allows every worker with an endpoint.
func (p *pool) excluded(subset []string) []string {
	var allowed map[string]bool
	if subset != nil {
		allowed = make(map[string]bool, len(subset))
		for _, s := range subset {
			if a, ok := parseEndpoint(s); ok {
				allowed[a] = true
			}
		}
	}
	var out []string
	for _, w := range p.workers {
		a, ok := p.addrOf[w.URL]
		if !ok || (allowed != nil && !allowed[a]) {
			out = append(out, w.URL)
		}
	}
	return out
}

// worker names the worker at the gateway's endpoint addr, or addr itself
// when no worker is there.
func (p *pool) worker(addr string) string {
	if a, ok := parseEndpoint(addr); ok {
		if w, ok := p.byAddr[a]; ok {
			return w
		}
	}
	return addr
}

// choice is what fallbacks chooses from.
type choice struct {
	Primary, Candidate string
	// Exclude and Avoid are the decision's: workers that may not serve the
	// request, and those with an open breaker.
	Exclude, Avoid []string
	// SameKey reports whether a worker takes the credentials sent with the
	// request (the primary's worker key): the gateway sends the same
	// headers to every endpoint it tries.
	SameKey func(worker string) bool
	N       int
}

// fallbacks are the workers after the primary, in the order the gateway
// should try them: the worker holding the longest prefix when load made
// the decision choose another, then the least loaded (load plus penalty,
// ties in random order so that pickers do not all name the same one),
// among the healthy, undrained workers below their max_load that the
// decision could have named. shuffle orders the ties (rand.Shuffle; a
// seeded one in tests).
func (p *pool) fallbacks(c choice, shuffle func(n int, swap func(i, j int))) []string {
	if c.N <= 0 {
		return nil
	}
	skip := make(map[string]bool, len(c.Exclude)+len(c.Avoid)+1)
	for _, w := range c.Exclude {
		skip[w] = true
	}
	for _, w := range c.Avoid {
		skip[w] = true
	}
	skip[c.Primary] = true
	type cand struct {
		url  string
		load int
	}
	var cs []cand
	var first string
	for _, w := range p.workers {
		if skip[w.URL] || !w.Healthy || w.Draining || (w.MaxLoad > 0 && w.Load >= w.MaxLoad) {
			continue
		}
		if _, ok := p.addrOf[w.URL]; !ok || (c.SameKey != nil && !c.SameKey(w.URL)) {
			continue
		}
		if w.URL == c.Candidate {
			first = w.URL
			continue
		}
		cs = append(cs, cand{w.URL, w.Load + w.LoadPenalty})
	}
	shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	slices.SortStableFunc(cs, func(a, b cand) int { return cmp.Compare(a.load, b.load) })
	out := make([]string, 0, c.N)
	if first != "" {
		out = append(out, first)
	}
	for _, x := range cs {
		if len(out) == c.N {
			break
		}
		out = append(out, x.url)
	}
	return out
}

// answer is the destination value: the primary's endpoint, then the
// fallbacks', comma-separated; false when the primary has no endpoint.
func (p *pool) answer(primary string, fallbacks []string) (string, bool) {
	a, ok := Endpoint(primary)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.WriteString(a)
	for _, f := range fallbacks {
		b.WriteByte(',')
		b.WriteString(p.addrOf[f])
	}
	return b.String(), true
}
