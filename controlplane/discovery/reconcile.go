package discovery

import (
	"slices"
	"time"
)

// Options are the reconciler's damping and timing rules.
type Options struct {
	AddAfter     int
	RemoveAfter  int
	DrainTimeout time.Duration
	// MinInterval and MaxInterval bound the re-resolution interval the
	// answers' TTL asks for; errors and empty answers retry after
	// MinInterval.
	MinInterval time.Duration
	MaxInterval time.Duration
}

// Answer is one resolution: the endpoints (worker URLs) found, the
// smallest TTL among the records, or the error.
type Answer struct {
	Endpoints []string
	TTL       time.Duration
	Err       error
	// Roles are the roles of endpoints that serve one leg of split
	// requests ("prefill", "decode"); an endpoint not in it serves whole
	// requests. A worker's role is read when it is added.
	Roles map[string]string
}

// Changes is what one answer asks of the worker set.
type Changes struct {
	Add     []string
	Drain   []string
	Undrain []string
	// Stale is true when the answer was unusable (error or empty) and the
	// last good set was kept.
	Stale bool
	// Next is when to resolve again.
	Next time.Duration
}

type member struct {
	missing    int // consecutive usable answers without it
	draining   bool
	drainSince time.Time
}

// Reconciler holds the damping state of one source. Not safe for
// concurrent use.
type Reconciler struct {
	o       Options
	pending map[string]int // seen but not yet added: consecutive sightings
	members map[string]*member
	stale   bool
}

// NewReconciler starts from the members already in the pool (for a new
// control-plane leader: the replicated set of this source), so nothing is
// re-added and absences are counted from here on.
func NewReconciler(o Options, known []string) *Reconciler {
	o.AddAfter = max(o.AddAfter, 1)
	o.RemoveAfter = max(o.RemoveAfter, 1)
	if o.MaxInterval < o.MinInterval {
		o.MaxInterval = o.MinInterval
	}
	r := &Reconciler{o: o, pending: map[string]int{}, members: map[string]*member{}}
	for _, u := range known {
		r.members[u] = &member{}
	}
	return r
}

// Observe folds one answer in at time now.
func (r *Reconciler) Observe(a Answer, now time.Time) Changes {
	if a.Err != nil || len(a.Endpoints) == 0 {
		r.stale = true
		return Changes{Stale: true, Next: r.o.MinInterval}
	}
	r.stale = false
	var ch Changes
	present := make(map[string]bool, len(a.Endpoints))
	for _, u := range a.Endpoints {
		if present[u] {
			continue
		}
		present[u] = true
		if m, ok := r.members[u]; ok {
			m.missing = 0
			if m.draining {
				m.draining = false
				ch.Undrain = append(ch.Undrain, u)
			}
			continue
		}
		r.pending[u]++
		if r.pending[u] >= r.o.AddAfter {
			delete(r.pending, u)
			r.members[u] = &member{}
			ch.Add = append(ch.Add, u)
		}
	}
	for u := range r.pending {
		if !present[u] {
			delete(r.pending, u) // sightings must be consecutive
		}
	}
	for u, m := range r.members {
		if present[u] || m.draining {
			continue
		}
		m.missing++
		if m.missing >= r.o.RemoveAfter {
			m.draining, m.drainSince = true, now
			ch.Drain = append(ch.Drain, u)
		}
	}
	slices.Sort(ch.Add)
	slices.Sort(ch.Drain)
	slices.Sort(ch.Undrain)
	ch.Next = min(max(a.TTL, r.o.MinInterval), r.o.MaxInterval)
	return ch
}

// Due lists the draining members to remove at now: idle ones (load 0) and
// those draining for DrainTimeout or longer. They stay members until
// Removed confirms, so a failed removal is retried.
func (r *Reconciler) Due(now time.Time, load func(url string) int) []string {
	var out []string
	for u, m := range r.members {
		if m.draining && (load(u) <= 0 || now.Sub(m.drainSince) >= r.o.DrainTimeout) {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// Removed forgets a member after its removal took effect.
func (r *Reconciler) Removed(url string) { delete(r.members, url) }

// Active lists the members that should be in the pool taking requests.
func (r *Reconciler) Active() []string { return r.list(false) }

// Draining lists the members on their way out.
func (r *Reconciler) Draining() []string { return r.list(true) }

func (r *Reconciler) list(draining bool) []string {
	var out []string
	for u, m := range r.members {
		if m.draining == draining {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// Unsettled reports whether an endpoint is partway through damping: seen
// but not yet added, or absent but not yet drained. A watching source
// answers only on changes, so the watcher re-asks it at MinInterval while
// this holds, or a damped change would wait for MaxInterval.
func (r *Reconciler) Unsettled() bool {
	if len(r.pending) > 0 {
		return true
	}
	for _, m := range r.members {
		if !m.draining && m.missing > 0 {
			return true
		}
	}
	return false
}

// Stale reports whether the last answer was unusable.
func (r *Reconciler) Stale() bool { return r.stale }
