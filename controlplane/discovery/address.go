package discovery

import (
	"net"
	"net/netip"
	"net/url"
	"strconv"
)

// Why a discovered endpoint was refused: the reason label of
// cart_discovery_refused_total.
const (
	RefusedInvalid     = "invalid"      // not a URL with an IP host
	RefusedUnspecified = "unspecified"  // 0.0.0.0, ::
	RefusedMulticast   = "multicast"    // 224.0.0.0/4, ff00::/8 (and the broadcast address)
	RefusedLoopback    = "loopback"     // 127.0.0.0/8, ::1
	RefusedLinkLocal   = "link_local"   // 169.254.0.0/16 (cloud metadata services), fe80::/10
	RefusedOwn         = "own_listener" // one of this process's listeners
	RefusedNotAllowed  = "not_allowed"  // outside discovery.allowed_networks
)

// AddressPolicy decides which discovered endpoints may become workers. A
// record in DNS or a Kubernetes object is not the operator's word: whoever
// can write one could otherwise point the pool at this host's own ports or
// at a metadata service, which would then receive tenants' prompts and
// probes.
//
//   - Never: unspecified and multicast addresses, and this process's own
//     listeners (Own; an unspecified host there stands for every address
//     in Local).
//   - Allowed empty: every other address except loopback and link-local.
//   - Allowed set: only addresses inside it; a loopback or link-local one
//     only through a network that lies inside that range itself (so
//     127.0.0.0/8 admits loopback, but 0.0.0.0/0 does not).
//
// It is pure: the watcher gathers Local (this host's interface addresses).
type AddressPolicy struct {
	Allowed []netip.Prefix
	Own     []netip.AddrPort
	Local   []netip.Addr
}

var (
	loopback4  = netip.MustParsePrefix("127.0.0.0/8")
	loopback6  = netip.MustParsePrefix("::1/128")
	linkLocal4 = netip.MustParsePrefix("169.254.0.0/16")
	linkLocal6 = netip.MustParsePrefix("fe80::/10")
	broadcast4 = netip.MustParseAddr("255.255.255.255")
)

// OwnListeners turns host:port listen addresses into what Check compares
// with; entries that are not an IP (or empty) host and a port are skipped:
// a name's addresses are among Local when it names this host.
func OwnListeners(addrs ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			continue
		}
		ip := netip.IPv4Unspecified()
		if host != "" {
			if ip, err = netip.ParseAddr(host); err != nil {
				continue
			}
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), uint16(p)))
	}
	return out
}

// Check returns why endpoint (a worker URL) is refused, or "" when it may
// be added.
func (p *AddressPolicy) Check(endpoint string) string {
	addr, port, ok := endpointAddr(endpoint)
	if !ok {
		return RefusedInvalid
	}
	switch {
	case addr.IsUnspecified():
		return RefusedUnspecified
	case addr.IsMulticast() || addr == broadcast4:
		return RefusedMulticast
	case p.own(addr, port):
		return RefusedOwn
	}
	class, special := specialRange(addr)
	if len(p.Allowed) == 0 {
		if special != "" {
			return special
		}
		return ""
	}
	for _, n := range p.Allowed {
		if !n.Contains(addr) {
			continue
		}
		if special == "" || (n.Bits() >= class.Bits() && class.Contains(n.Addr())) {
			return ""
		}
	}
	if special != "" {
		return special
	}
	return RefusedNotAllowed
}

// specialRange is the loopback or link-local range addr lies in, and the
// refusal reason that goes with it; "" for other addresses.
func specialRange(addr netip.Addr) (netip.Prefix, string) {
	for _, r := range []struct {
		p      netip.Prefix
		reason string
	}{{loopback4, RefusedLoopback}, {loopback6, RefusedLoopback}, {linkLocal4, RefusedLinkLocal}, {linkLocal6, RefusedLinkLocal}} {
		if r.p.Contains(addr) {
			return r.p, r.reason
		}
	}
	return netip.Prefix{}, ""
}

// own reports whether addr:port is one of this process's listeners.
func (p *AddressPolicy) own(addr netip.Addr, port uint16) bool {
	for _, l := range p.Own {
		if l.Port() != port {
			continue
		}
		if l.Addr() == addr {
			return true
		}
		if l.Addr().IsUnspecified() {
			// Bound to every interface: any address of this host, loopback
			// included, reaches it.
			if addr.IsLoopback() {
				return true
			}
			for _, a := range p.Local {
				if a == addr {
					return true
				}
			}
		}
	}
	return false
}

// endpointAddr is the IP and port a worker URL names (the scheme's port
// when it names none).
func endpointAddr(endpoint string) (netip.Addr, uint16, bool) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	addr, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return netip.Addr{}, 0, false
	}
	addr = addr.WithZone("") // fe80::1%eth0 is link-local like fe80::1
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		default:
			return netip.Addr{}, 0, false
		}
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return netip.Addr{}, 0, false
	}
	return addr.Unmap(), uint16(n), true
}
