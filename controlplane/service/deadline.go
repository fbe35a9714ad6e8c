package service

import (
	"io"
	"net/http"
	"time"

	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// BodyReadDeadline bounds the time to receive each request body: a caller
// that announces a large message and stalls would otherwise pin its buffer
// (up to MaxMessageBytes) for as long as it likes. The deadline is lifted
// once the body has been read, so a slow handler is never cut off by it,
// and it applies per request (per stream under HTTP/2), unlike
// http.Server.ReadTimeout, which for HTTP/1 also runs during the handler.
//
// A data plane's Route stream (RouterService.Stream) is exempt: its body
// is a stream of small messages that lasts as long as the data plane, so
// any deadline would cut it off. Its callers are authenticated before the
// body is read, and each message is bounded by MaxMessageBytes.
func BodyReadDeadline(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.URL.Path != cartv1connect.RouterServiceStreamProcedure && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(d)) == nil {
				b := &deadlineBody{ReadCloser: r.Body, rc: rc}
				if r.ProtoMajor == 1 {
					b.header = w.Header()
				}
				r.Body = b
			}
		}
		next.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	header http.Header // HTTP/1 only: the answer's headers
	lifted bool
}

// Read lifts the deadline at the end of the body, and only there: after a
// timeout the expired deadline must stay, or a caller that drains the rest
// of the body (connect does, to reuse the connection) would wait for the
// stalled client without limit. An HTTP/1 connection whose body failed is
// closed after the answer: what follows on it is the rest of that body,
// not a next request.
func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF && !b.lifted:
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case err != nil && err != io.EOF && b.header != nil:
		b.header.Set("Connection", "close")
	}
	return n, err
}
