package proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// bodyBudget bounds the request body bytes held by all requests at once
// (proxy.max_inflight_body_bytes). Without it, memory grows with the number
// of concurrent uploads times max_body_bytes: a handful of clients sending,
// or merely announcing and stalling, large bodies could exhaust the host.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
	peak  atomic.Int64 // highest used ever seen, for tests and diagnostics
}

// take reserves n bytes, or reports false without reserving anything. The
// check and the reservation are one atomic step, so concurrent requests can
// never overshoot the limit together.
func (b *bodyBudget) take(n int64) bool {
	for {
		u := b.used.Load()
		if u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			for {
				p := b.peak.Load()
				if u+n <= p || b.peak.CompareAndSwap(p, u+n) {
					return true
				}
			}
		}
	}
}

// InflightBodyBytes reports the request body bytes reserved now and the
// most ever reserved at once (both 0 without a budget).
func (p *Proxy) InflightBodyBytes() (now, peak int64) {
	if p.budget == nil {
		return 0, 0
	}
	return p.budget.used.Load(), p.budget.peak.Load()
}

// bodyHold is one request's share of the budget.
type bodyHold struct {
	b *bodyBudget
	n atomic.Int64
}

func (h *bodyHold) grow(n int64) bool {
	if h.b == nil {
		return true
	}
	if !h.b.take(n) {
		return false
	}
	h.n.Add(n)
	return true
}

// free gives the request's bytes back; safe to call more than once.
func (h *bodyHold) free() {
	if h.b != nil {
		h.b.used.Add(-h.n.Swap(0))
	}
}

// overBudget is the refusal when the budget is spent: 503, because the
// request is fine and the same request will be accepted once others finish.
func overBudget(w http.ResponseWriter) error {
	w.Header().Set("Retry-After", "1")
	return apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "server_busy",
		"too many request bytes are being received at once; retry shortly (proxy.max_inflight_body_bytes)")
}

// minChunkedBuf is the first buffer for a body of unknown length.
const minChunkedBuf = 16 << 10

// readBody buffers the request body once, within the size limit and the
// shared budget; it is needed for the key anyway and replayed on retries.
// The bytes stay reserved in c.hold until the request no longer needs them.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request, c *call) (_ []byte, err error) {
	defer func() {
		if err != nil && r.ProtoMajor < 2 {
			// Close the connection after the error: otherwise net/http
			// drains the unread body before sending the answer, waiting
			// (without a deadline) for bytes a slow or lying client may
			// never send, and the refusal never goes out.
			w.Header().Set("Connection", "close")
		}
	}()
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := p.o.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	c.hold.b = p.budget
	// A declared length is reserved in full before a byte is read: a
	// client that announces a large body and stalls must not get the
	// memory first and the refusal later.
	if r.ContentLength > 0 && !c.hold.grow(r.ContentLength) {
		return nil, overBudget(w)
	}
	// A socket deadline is wall-clock time, whatever clock Options.Now is.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(p.o.BodyReadTimeout))
	defer func() {
		// Lifted only after a complete body: after a failure the expired
		// deadline stays, so nothing can wait on that client again.
		if err == nil {
			_ = rc.SetReadDeadline(time.Time{})
		}
	}()
	var buf []byte
	if r.ContentLength > 0 {
		// net/http ends the body after exactly ContentLength bytes.
		buf = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, buf)
	} else {
		buf, err = p.readChunked(w, r, c)
	}
	if err != nil {
		var ae *apierr.Error
		var mbe *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &ae):
			return nil, ae
		case errors.As(err, &mbe):
			return nil, tooLarge(limit)
		case errors.As(err, &ne) && ne.Timeout():
			return nil, apierr.New(http.StatusRequestTimeout, apierr.TypeInvalidRequest, "body_timeout", "request body not received within %s", p.o.BodyReadTimeout)
		}
		return nil, apierr.BadRequest("body_read_error", "", "could not read request body: %v", err)
	}
	return buf, nil
}

// readChunked reads a body of unknown length, reserving each buffer
// before allocating it, so a chunked upload is refused as soon as it no
// longer fits rather than after it was buffered.
func (p *Proxy) readChunked(w http.ResponseWriter, r *http.Request, c *call) ([]byte, error) {
	limit := p.o.MaxBodyBytes
	rd := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			// One byte past the limit leaves room for MaxBytesReader to
			// notice a body that is too large.
			size := min(max(2*int64(cap(buf)), minChunkedBuf), limit+1)
			if !c.hold.grow(size - int64(cap(buf))) {
				return nil, overBudget(w)
			}
			nb := make([]byte, len(buf), size)
			copy(nb, buf)
			buf = nb
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
