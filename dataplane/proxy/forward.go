package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
)

// The proxy forwards on its own rather than through httputil.ReverseProxy:
// that one clones the whole inbound request (headers included) and then
// deletes and rewrites most of what it copied, adds a Director/Rewrite and
// a ModifyResponse layer, and parses the Content-Type of every answer to
// pick a flush policy. Here the outbound request is built once, holding
// only what the worker should see, and the answer's headers are copied
// once, minus what belongs to the hop.

// hopHeaders are the headers that describe one connection and not the
// message (RFC 9110 section 7.6.1), plus the proxy-auth ones, which are
// addressed to the proxy: none of them crosses CART, in either direction.
// Trailer is announced afresh from the trailers the worker declared.
var hopHeaders = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true, // not standard, but curl still sends it
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// requestReplaced are inbound headers CART writes itself (or never
// forwards): a client must not choose what the worker reads as the
// forwarding chain, the request id or the routed peer, and its credentials
// are never forwarded (clientCredentialHeaders).
var requestReplaced = map[string]bool{
	"Forwarded":         true,
	"X-Forwarded-For":   true,
	"X-Forwarded-Host":  true,
	"X-Forwarded-Proto": true,
	HeaderRoutedPeer:    true,
	HeaderRequestID:     true,
	// The body is in hand before any worker is asked (the client's 100
	// Continue came from CART): a worker's own 100 would be a second one.
	"Expect": true,
}

func init() {
	for _, h := range clientCredentialHeaders {
		requestReplaced[h] = true
	}
}

// connectionNamed returns the headers a Connection header names, which are
// hop-by-hop too; nil (no allocation) when it names none, the usual case.
func connectionNamed(h http.Header) map[string]bool {
	var named map[string]bool
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				if named == nil {
					named = make(map[string]bool, 2)
				}
				named[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	return named
}

// outbound builds c.out, the request the attempts send (each on its own
// copy with the worker's address): the client's end-to-end headers,
// without its credentials or hop-by-hop ones, plus the forwarding headers
// and the request id. The header values are shared with the inbound
// request, which is never modified afterwards, so nothing may append to
// them in place (Set replaces a value; Clone is used where keys differ per
// worker).
func (p *Proxy) outbound(r *http.Request, c *call) {
	named := connectionNamed(r.Header)
	h := make(http.Header, len(r.Header)+5)
	for k, vv := range r.Header {
		if hopHeaders[k] || requestReplaced[k] || named[k] {
			continue
		}
		h[k] = vv
	}
	// One backing array for the values set here: five allocations less.
	vals := make([]string, 0, 6)
	set := func(k, v string) {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if teTrailers(r.Header["Te"]) {
		// The only TE a proxy passes on: the client accepts trailers.
		set("Te", "trailers")
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		// The client's own X-Forwarded-For is dropped, not extended: it is
		// whatever the client chose to write.
		set("X-Forwarded-For", ip)
	}
	set("X-Forwarded-Host", r.Host)
	if r.TLS == nil {
		set("X-Forwarded-Proto", "http")
	} else {
		set("X-Forwarded-Proto", "https")
	}
	set(HeaderRequestID, c.id)
	if _, ok := h["User-Agent"]; !ok {
		// Present but empty: net/http would otherwise write its own.
		set("User-Agent", "")
	}
	c.outURL = url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: cleanQuery(r.URL.RawQuery)}
	c.out = http.Request{
		Method:     r.Method,
		URL:        &c.outURL,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     h,
	}
}

// teTrailers reports whether a TE header accepts trailers.
func teTrailers(vs []string) bool {
	for _, v := range vs {
		for f := range strings.SplitSeq(v, ",") {
			f, _, _ = strings.Cut(f, ";")
			if strings.EqualFold(textproto.TrimString(f), "trailers") {
				return true
			}
		}
	}
	return false
}

// cleanQuery re-encodes a query that a worker could read differently from
// CART (a ';' some servers take for a separator, a malformed escape), so
// that both see the same parameters; a well-formed one passes untouched.
func cleanQuery(q string) string {
	for i := 0; i < len(q); i++ {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 2
		}
	}
	return q
}

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q) // keeps what parses, drops the rest
	return v.Encode()
}

func isHex(b byte) bool {
	return '0' <= b && b <= '9' || 'a' <= b && b <= 'f' || 'A' <= b && b <= 'F'
}

// interim relays a worker's 1xx answers (103 Early Hints, a 100 Continue)
// to the client while the attempt waits for the real one. net/http's
// Transport calls the hook from its reader goroutine, so once the final
// answer is in, close stops a late one from writing into a response that
// is no longer the hook's.
type interim struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	done bool
}

func (i *interim) got1xx(code int, header textproto.MIMEHeader) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.done {
		return nil
	}
	h := i.w.Header()
	for k, vv := range header {
		h[k] = append(h[k], vv...)
	}
	i.w.WriteHeader(code)
	// WriteHeader does not clear the map after a 1xx: these must not end
	// up on the final answer.
	for k := range header {
		delete(h, k)
	}
	return nil
}

func (i *interim) close() {
	i.mu.Lock()
	i.done = true
	i.mu.Unlock()
}

var errUpgrade = errors.New("protocol upgrades are not proxied")

// relay writes the worker's answer to the client. A body that breaks off
// (the worker's read fails, or the client's write) aborts the handler, so
// that the client sees a truncated response and not a clean end.
func (p *Proxy) relay(sw *statusWriter, r *http.Request, c *call, resp *http.Response) {
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded connection would outlive the body wrapper that
		// settles the decision: closing the body settles it, and the
		// client gets a 502.
		_ = resp.Body.Close()
		p.errorHandler(sw, r, c, errUpgrade)
		return
	}
	h := sw.Header()
	named := connectionNamed(resp.Header)
	for k, vv := range resp.Header {
		if hopHeaders[k] || named[k] || k == HeaderRoutedPeer {
			continue
		}
		if prior, ok := h[k]; ok {
			h[k] = append(prior, vv...)
		} else {
			// The answer's value slices are not used after this.
			h[k] = vv
		}
	}
	if p.o.AddRoutedPeerHeader {
		h[HeaderRoutedPeer] = []string{c.final.Worker}
	}
	announced := len(resp.Trailer)
	if announced > 0 {
		keys := make([]string, 0, announced)
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h["Trailer"] = []string{strings.Join(keys, ", ")}
	}
	sw.WriteHeader(resp.StatusCode)
	if err := p.copyBody(sw, c, resp); err != nil {
		_ = resp.Body.Close()
		// A client that hangs up mid-answer ends the upstream read too
		// (its context closes the worker's connection, which reads as an
		// i/o timeout): that is the client's doing, not the worker's.
		if !errors.Is(err, context.Canceled) && !sw.clientGone && r.Context().Err() == nil {
			p.log.Warn("response body broke off", "request_id", c.id, "worker", c.final.Worker, "error", err.Error())
		}
		if r.Context().Value(http.ServerContextKey) != nil {
			panic(http.ErrAbortHandler)
		}
		return
	}
	// Closed before the trailers are read: net/http fills resp.Trailer
	// when the body reaches its end, which Close makes sure of.
	_ = resp.Body.Close()
	if len(resp.Trailer) == 0 {
		return
	}
	// Flushing first makes the answer chunked even when short, the only
	// framing that carries trailers.
	_ = c.client.Flush()
	if len(resp.Trailer) == announced {
		for k, vv := range resp.Trailer {
			h[k] = append(h[k], vv...)
		}
		return
	}
	// Trailers the worker never announced go out under net/http's prefix
	// for undeclared ones.
	for k, vv := range resp.Trailer {
		k = http.TrailerPrefix + k
		h[k] = append(h[k], vv...)
	}
}

// copyBody copies the answer's body to the client. A stream (server-sent
// events, or any body of unknown length) is flushed after every chunk, so
// each token reaches the client as soon as the worker sends it; a body of
// known length goes through the response buffer and out when the handler
// returns, in as few writes as its size allows.
func (p *Proxy) copyBody(sw *statusWriter, c *call, resp *http.Response) error {
	bp := copyBufferPool.Get().(*[]byte)
	defer copyBufferPool.Put(bp)
	buf := *bp
	stream := resp.ContentLength < 0 || isEventStream(resp.Header.Get("Content-Type"))
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := sw.Write(buf[:n]); werr != nil {
				return werr
			}
			if stream {
				if err := c.client.Flush(); err != nil {
					sw.clientGone = true
					return err
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// isEventStream reports whether a Content-Type is text/event-stream,
// parameters aside, without the allocations of mime.ParseMediaType.
func isEventStream(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// copyBufferPool recycles the 32 KiB buffers bodies are copied through.
var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}
