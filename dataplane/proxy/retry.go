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

	"github.com/cartrouter/cart/internal/every"
)

// roundTrip routes, dispatches, and retries on another worker while the
// response has not started. Returning from here is the last moment a retry
// is possible: after it relay starts writing to the client.
//
// When no other worker can take a retry, the client gets the last real
// failure (the worker's own retryable answer, or a 504/502 for a timeout or
// connection error), not a generic "no worker available".
func (p *Proxy) roundTrip(ctx context.Context, c *call) (*http.Response, error) {
	l := retryLoop{c: c}
	defer func() { p.retryTokens.Add(-l.tokens) }()
	for n := 0; ; n++ {
		if resp, done, err := p.tryOnce(ctx, &l, n); done {
			return resp, err
		}
	}
}

// retryLoop is what one call's attempts pass on to the next.
type retryLoop struct {
	c *call
	// held is the last retryable answer, kept open until another worker
	// has been found for the retry: if none can be, it is delivered as is.
	held    *retryableStatus
	lastErr error
	unsent  bool  // the last attempt provably never reached its worker
	tokens  int64 // retry-budget tokens taken, given back when the call ends
}

// drop closes the held answer, which settles its attempt.
func (l *retryLoop) drop() {
	if l.held != nil {
		_ = l.held.resp.Body.Close()
		l.held = nil
	}
}

// tryOnce is one turn of the retry loop (attempt n, 0-based): wait out the
// backoff, get a decision, send it. done reports that resp or err is the
// call's answer; otherwise the loop goes on to attempt n+1.
func (p *Proxy) tryOnce(ctx context.Context, l *retryLoop, n int) (resp *http.Response, done bool, err error) {
	c := l.c
	// A worker that refused the connection says nothing about the
	// others: retry elsewhere at once rather than back off.
	if n > 0 && !l.unsent {
		if err := every.Sleep(ctx, p.backoff(n)); err != nil {
			l.drop()
			return nil, true, err
		}
	}
	c.attempts++
	a, err := p.begin(ctx, c)
	if err != nil {
		if l.held != nil {
			return l.held.a.deliver(l.held.resp), true, nil
		}
		if l.lastErr != nil {
			return nil, true, fmt.Errorf("%w (no other worker to retry on: %v)", l.lastErr, err)
		}
		return nil, true, err
	}
	l.drop()
	resp, err = a.send(ctx)
	if err == nil {
		return p.sniffResponseID(c, resp), true, nil
	}
	var rs *retryableStatus
	errors.As(err, &rs)
	if ctx.Err() != nil {
		if rs != nil {
			_ = rs.resp.Body.Close()
		}
		return nil, true, ctx.Err()
	}
	l.unsent = rs == nil && neverSent(err)
	if !c.mayResend(err) || !p.takeRetry(n, l.unsent) {
		if rs != nil {
			// Out of retries: the worker's own answer is the most
			// useful thing to give the client.
			return rs.a.deliver(rs.resp), true, nil
		}
		return nil, true, err
	}
	if !l.unsent {
		l.tokens++
	}
	l.lastErr = err
	c.failed = append(c.failed, a.failedWorker())
	l.held = rs
	return nil, false, nil
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
