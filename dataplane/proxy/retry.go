package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/cartrouter/cart/dataplane/router"
)

// roundTrip is the ReverseProxy's transport: it routes, dispatches, and
// retries on another worker while the response has not started. Returning
// from here is the last moment a retry is possible: after it ReverseProxy
// starts writing to the client.
//
// When no other worker can take a retry, the client gets the last real
// failure (the worker's own retryable answer, or a 504/502 for a timeout or
// connection error), not a generic "no worker available".
func (p *Proxy) roundTrip(out *http.Request) (*http.Response, error) {
	c := callFrom(out.Context())
	ctx := out.Context()
	var tokens int64
	defer func() { p.retryTokens.Add(-tokens) }()
	// held is the last retryable answer, kept open until another worker has
	// been found for the retry: if none can be, it is delivered as is.
	var held *http.Response
	var heldD router.Decision
	drop := func() {
		if held != nil {
			_ = held.Body.Close()
			held = nil
		}
	}
	var lastErr error
	unsent := false // the last attempt provably never reached its worker
	for attempt := 0; ; attempt++ {
		// A worker that refused the connection says nothing about the
		// others: retry elsewhere at once rather than back off.
		if attempt > 0 && !unsent {
			if err := sleepCtx(ctx, p.backoff(attempt)); err != nil {
				drop()
				return nil, err
			}
		}
		c.attempts++
		d, err := p.decide(ctx, c)
		if err != nil {
			if held != nil {
				return p.deliver(c, heldD, held, true), nil
			}
			if lastErr != nil {
				return nil, fmt.Errorf("%w (no other worker to retry on: %v)", lastErr, err)
			}
			return nil, err
		}
		drop()
		resp, err := p.dispatch(ctx, out, c, d)
		if err == nil {
			return p.sniffResponseID(c, resp), nil
		}
		var rs *retryableStatus
		errors.As(err, &rs)
		if ctx.Err() != nil {
			if rs != nil {
				_ = rs.resp.Body.Close()
			}
			return nil, ctx.Err()
		}
		unsent = rs == nil && neverSent(err)
		if !c.mayResend(err) || !p.takeRetry(attempt, unsent) {
			if rs != nil {
				// Out of retries: the worker's own answer is the most
				// useful thing to give the client.
				return p.deliver(c, d, rs.resp, true), nil
			}
			return nil, err
		}
		if !unsent {
			tokens++
		}
		lastErr = err
		c.failed = append(c.failed, d.Worker)
		if rs != nil {
			held, heldD = rs.resp, d
		}
	}
}

// takeRetry reports whether the attempt that just failed (0-based) may be
// retried, taking a retry-budget token if so. An attempt that never reached
// its worker (unsent) is retried outside the budget, which exists to keep
// retries from multiplying the load on sick workers: a refused connection
// put no load on anyone, and turning it into a 502 while healthy workers
// remain would make a replica kill visible to clients. MaxRetries and the
// set of workers not yet tried still bound it.
func (p *Proxy) takeRetry(attempt int, unsent bool) bool {
	if attempt >= p.o.MaxRetries {
		return false
	}
	if unsent {
		p.m.Retries.WithLabelValues("not_sent").Inc()
		return true
	}
	if !p.reserveRetryToken() {
		p.m.RetryBudgetExhaus.Inc()
		return false
	}
	p.m.Retries.WithLabelValues("upstream_failure").Inc()
	return true
}

// neverSent reports whether a transport error proves the request never
// left for the worker: the connection was never established (dial errors:
// refused, unreachable, DNS, connect timeout) or its TLS handshake failed,
// which net/http completes before writing a byte of the request.
func neverSent(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var (
		rhe    tls.RecordHeaderError
		alert  tls.AlertError
		verify *tls.CertificateVerificationError
		unkCA  x509.UnknownAuthorityError
		host   x509.HostnameError
		invCrt x509.CertificateInvalidError
	)
	if errors.As(err, &rhe) || errors.As(err, &alert) || errors.As(err, &verify) ||
		errors.As(err, &unkCA) || errors.As(err, &host) || errors.As(err, &invCrt) {
		return true
	}
	// net/http's handshake timeout and its "closed while idle" (the
	// worker closed a keep-alive connection before reading anything more
	// from it) have no exported type.
	msg := err.Error()
	return strings.Contains(msg, "net/http: TLS handshake timeout") || strings.Contains(msg, "http: server closed idle connection")
}

func (p *Proxy) isRetryable(status int) bool {
	return status >= 0 && status < len(p.retryable) && p.retryable[status]
}

// reserveRetryToken caps retries in progress at RetryBudgetRatio of the
// requests in flight (at least RetryBudgetMin), so a sick pool sees at most
// a bounded amplification instead of a retry storm. The check and the
// reservation are one atomic step: in a storm many requests fail at once,
// and checking before taking would let all of them through.
func (p *Proxy) reserveRetryToken() bool {
	limit := int64(math.Floor(p.o.RetryBudgetRatio * float64(p.active.Load())))
	if limit < int64(p.o.RetryBudgetMin) {
		limit = int64(p.o.RetryBudgetMin)
	}
	for {
		n := p.retryTokens.Load()
		if n >= limit {
			return false
		}
		if p.retryTokens.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (p *Proxy) backoff(attempt int) time.Duration {
	b := float64(p.o.InitialBackoff) * math.Pow(p.o.BackoffMultiplier, float64(attempt-1))
	if max := float64(p.o.MaxBackoff); p.o.MaxBackoff > 0 && b > max {
		b = max
	}
	if p.o.JitterFactor > 0 {
		p.rngMu.Lock()
		j := (p.rng.Float64()*2 - 1) * p.o.JitterFactor
		p.rngMu.Unlock()
		b *= 1 + j
	}
	return time.Duration(b)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
