package service

import (
	"io"
	"net/http"
	"time"
)

// BodyReadDeadline bounds the time to receive each request body: a caller
// that announces a large message and stalls would otherwise pin its buffer
// (up to MaxMessageBytes) for as long as it likes. The deadline is lifted
// once the body has been read, so a slow handler is never cut off by it,
// and it applies per request (per stream under HTTP/2), unlike
// http.Server.ReadTimeout, which for HTTP/1 also runs during the handler.
func BodyReadDeadline(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(d)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.lifted {
		b.lifted = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
