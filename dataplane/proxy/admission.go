package proxy

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/router"
)

// FlowPolicy is how the proxy tells flow control who a request is: its
// tenant, priority, weight and deadline (flow.* and the client keys'
// priority settings).
type FlowPolicy struct {
	// PriorityHeaders are read in order for a request's priority.
	PriorityHeaders []string
	// TenantHeader refines the tenant for fairness ("" = the key's name).
	TenantHeader string
	// DeadlineHeader carries the request's deadline in ms from arrival.
	DeadlineHeader string
	// Keys are the client keys' settings by name; Default applies to
	// requests without a configured key (AnonymousTenant).
	Keys    map[string]TenantFlow
	Default TenantFlow
	// EnginePriority sets vLLM's request field priority to minus the
	// request's priority on the routed endpoints that read it, so the
	// engine's own queue (--scheduling-policy priority) agrees with CART.
	EnginePriority bool
}

// TenantFlow is one client key's flow-control settings.
type TenantFlow struct {
	Priority    int
	MaxPriority int // a header may ask for at most this
	Weight      float64
}

// MinPriority is the lowest priority a header may ask for (config's bound).
const MinPriority = -100

// maxTenantSuffix bounds the header part of a refined tenant: it is a key
// of the queue's fairness table, whose size flow control bounds anyway.
const maxTenantSuffix = 128

// admission fills c's flow-control identity from its client key and
// headers; a malformed priority or deadline header is a 400.
func (p *Proxy) admission(w http.ResponseWriter, r *http.Request, c *call) error {
	f := &p.o.Flow
	tf, ok := f.Keys[c.tenant]
	if !ok {
		tf = f.Default
	}
	a := router.Admission{Tenant: c.tenant, Label: c.tenant, Priority: tf.Priority, Weight: tf.Weight, Arrival: c.start}
	for _, h := range f.PriorityHeaders {
		v := r.Header.Get(h)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return apierr.BadRequest("invalid_priority", h, "header %s must be an integer priority, got %q", h, truncate(v, 64))
		}
		// A tenant may lower its priority, and raise it only as far as
		// its key allows.
		a.Priority = min(max(n, MinPriority), tf.MaxPriority)
		break
	}
	if f.TenantHeader != "" {
		if v := r.Header.Get(f.TenantHeader); v != "" {
			a.Tenant = c.tenant + "/" + truncate(v, maxTenantSuffix)
		}
	}
	if f.DeadlineHeader != "" {
		if v := r.Header.Get(f.DeadlineHeader); v != "" {
			ms, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || ms <= 0 || ms > int64(24*time.Hour/time.Millisecond) {
				return apierr.BadRequest("invalid_deadline", f.DeadlineHeader, "header %s must be a positive number of milliseconds (at most a day), got %q", f.DeadlineHeader, truncate(v, 64))
			}
			a.Deadline = c.start.Add(time.Duration(ms) * time.Millisecond)
		}
	}
	if f.EnginePriority && c.routed && c.endpoint != extract.Messages.String() {
		out, err := extract.SetPriority(c.body, -a.Priority)
		if err != nil {
			return err
		}
		if n := int64(len(out) - len(c.body)); n > 0 && !c.hold.grow(n) {
			return overBudget(w)
		}
		c.body = out
	}
	a.Bytes = int64(len(c.body))
	// Fairness counts tokens; the prompt's are estimated at ~4 characters
	// each until the worker's usage report says.
	a.Cost = int64(c.keyLen/4 + 1)
	c.admission = a
	return nil
}

// refusal is flow control's 429, with Retry-After set on w.
func refusal(w http.ResponseWriter, err error) (*apierr.Error, bool) {
	var re *router.RefusedError
	if !errors.As(err, &re) {
		return nil, false
	}
	if re.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(re.RetryAfter.Round(time.Second)/time.Second))))
	}
	code := "pool_saturated"
	switch re.Reason {
	case router.RefusedShed:
		code = "request_shed"
	case router.RefusedTimeout:
		code = "queue_timeout"
	case router.RefusedQueueFull, router.RefusedTenantFull:
		code = "queue_full"
	}
	return apierr.New(http.StatusTooManyRequests, apierr.TypeRateLimit, code, "%s", re.Error()), true
}
