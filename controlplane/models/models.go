package models

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
)

// Card is one entry of a /v1/models answer, kept as the worker sent it.
type Card struct {
	ID  string
	Raw json.RawMessage
}

// Registry is safe for concurrent use; reads are lock-free.
type Registry struct {
	mu       sync.Mutex
	workers  []string
	declared map[string][]string
	learned  map[string][]Card
	snap     atomic.Pointer[snapshot]
}

type snapshot struct {
	// known: at least one worker has a known list; otherwise no request
	// is filtered.
	known bool
	// exclude[model] are the workers a request for model must not go to.
	exclude map[string][]string
	// knownWorkers are excluded for a model no known worker serves: it may
	// still be served by a worker whose list is unknown.
	knownWorkers []string
	hasUnknown   bool
	workers      []string          // in configured order, for List
	cards        map[string][]Card // per worker, declared models synthesized
}

// New returns an empty registry.
func New() *Registry {
	r := &Registry{declared: map[string][]string{}, learned: map[string][]Card{}}
	r.snap.Store(&snapshot{})
	return r
}

// Worker is one worker and the models configured for it.
type Worker struct {
	URL      string
	Declared []string
}

// SetWorkers replaces the worker set. Learned lists of kept workers stay.
func (r *Registry) SetWorkers(ws []Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.EqualFunc(r.workers, ws, func(u string, w Worker) bool { return u == w.URL && slices.Equal(r.declared[u], w.Declared) }) {
		return // the periodic refresh of an unchanged set
	}
	keep := make(map[string]bool, len(ws))
	r.workers = r.workers[:0]
	r.declared = make(map[string][]string, len(ws))
	for _, w := range ws {
		keep[w.URL] = true
		r.workers = append(r.workers, w.URL)
		if len(w.Declared) > 0 {
			r.declared[w.URL] = slices.Clone(w.Declared)
		}
	}
	for u := range r.learned {
		if !keep[u] {
			delete(r.learned, u)
		}
	}
	r.rebuild()
}

// SetLearned records the cards a worker's /v1/models returned. It reports
// whether the worker's list changed.
func (r *Registry) SetLearned(worker string, cards []Card) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.workers, worker) {
		return false // removed while its probe was in flight
	}
	old, had := r.learned[worker]
	if had && slices.EqualFunc(old, cards, func(a, b Card) bool { return a.ID == b.ID && bytes.Equal(a.Raw, b.Raw) }) {
		return false
	}
	r.learned[worker] = slices.Clone(cards)
	r.rebuild()
	return true
}

// SetLearnedIDs records a worker's model ids when only the ids are known
// (a data plane learns them from the control plane).
func (r *Registry) SetLearnedIDs(worker string, ids []string) bool {
	cards := make([]Card, len(ids))
	for i, id := range ids {
		cards[i] = Card{ID: id, Raw: synthCard(id)}
	}
	return r.SetLearned(worker, cards)
}

func synthCard(id string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"id": id, "object": "model", "owned_by": "cart"})
	return b
}

// rebuild recomputes the snapshot; r.mu is held.
func (r *Registry) rebuild() {
	s := &snapshot{exclude: map[string][]string{}, cards: map[string][]Card{}, workers: slices.Clone(r.workers)}
	serves := map[string]map[string]bool{} // model -> workers
	adapters := map[string]bool{}          // ids some worker lists as a LoRA adapter
	for _, w := range r.workers {
		var cards []Card
		seen := map[string]bool{}
		for _, c := range r.learned[w] {
			if !seen[c.ID] {
				seen[c.ID] = true
				cards = append(cards, c)
			}
		}
		for _, id := range r.declared[w] {
			if !seen[id] {
				seen[id] = true
				cards = append(cards, Card{ID: id, Raw: synthCard(id)})
			}
		}
		if len(cards) == 0 {
			s.hasUnknown = true
			continue
		}
		s.known = true
		s.knownWorkers = append(s.knownWorkers, w)
		s.cards[w] = cards
		for _, c := range cards {
			if isAdapter(c) {
				adapters[c.ID] = true
			}
		}
		for id := range seen {
			if serves[id] == nil {
				serves[id] = map[string]bool{}
			}
			serves[id][w] = true
		}
	}
	for id, ws := range serves {
		// A LoRA adapter lives where it was loaded: a worker with an
		// unknown list is excluded too, since one known to have it beats a
		// guess. A base model is what a worker is started with, so a worker
		// whose list is not read yet (just added, or mid first probe
		// round) most likely serves it like its peers: excluding it would
		// pile every request on the first workers probed and break their
		// prefix affinity for that moment.
		strict := adapters[id]
		var ex []string
		for _, w := range r.workers {
			if !ws[w] && (strict || s.cards[w] != nil) {
				ex = append(ex, w)
			}
		}
		s.exclude[id] = ex
	}
	r.snap.Store(s)
}

// isAdapter reports whether a card describes a LoRA adapter: vLLM lists
// one with its base model as parent.
func isAdapter(c Card) bool {
	var v struct {
		Parent *string `json:"parent"`
	}
	if len(c.Raw) == 0 || json.Unmarshal(c.Raw, &v) != nil || v.Parent == nil {
		return false
	}
	return *v.Parent != "" && *v.Parent != c.ID
}

// ErrNotServed is returned for a model no worker of the pool serves.
var ErrNotServed = errors.New("model not served")

// Exclude returns the workers a request for model must not be routed to,
// or ErrNotServed when none may take it. A request without a model, and a
// pool where no worker's list is known, are not filtered.
func (r *Registry) Exclude(model string) ([]string, error) {
	if r == nil || model == "" {
		return nil, nil
	}
	s := r.snap.Load()
	if !s.known {
		return nil, nil
	}
	if ex, ok := s.exclude[model]; ok {
		return ex, nil
	}
	if s.hasUnknown {
		return s.knownWorkers, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrNotServed, model)
}

// Known reports whether any worker's list is known.
func (r *Registry) Known() bool { return r != nil && r.snap.Load().known }

// IDs returns the model ids a worker is known to serve (learned and
// declared), nil when unknown.
func (r *Registry) IDs(worker string) []string {
	if r == nil {
		return nil
	}
	cs := r.snap.Load().cards[worker]
	if len(cs) == 0 {
		return nil
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ID
	}
	return out
}

// List is the /v1/models answer for the workers for which include is true
// (the healthy ones): the union of their cards in worker order, first card
// of each id wins.
func (r *Registry) List(include func(worker string) bool) []byte {
	s := r.snap.Load()
	seen := map[string]bool{}
	data := []json.RawMessage{}
	for _, w := range s.workers {
		if include != nil && !include(w) {
			continue
		}
		for _, c := range s.cards[w] {
			if !seen[c.ID] {
				seen[c.ID] = true
				data = append(data, c.Raw)
			}
		}
	}
	b, _ := json.Marshal(struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{"list", data})
	return b
}

// MaxBody bounds a /v1/models answer read from a worker.
const MaxBody = 8 << 20

// Parse reads a /v1/models answer ({"object":"list","data":[{"id":...}]}).
func Parse(body []byte) ([]Card, error) {
	var v struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("models list: %w", err)
	}
	if v.Data == nil {
		return nil, errors.New("models list: no data array")
	}
	out := make([]Card, 0, len(v.Data))
	for _, raw := range v.Data {
		var c struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || c.ID == "" {
			return nil, errors.New("models list: an entry has no string id")
		}
		out = append(out, Card{ID: c.ID, Raw: slices.Clone(raw)})
	}
	return out, nil
}

// Path is where an OpenAI-compatible worker lists its models: probed by
// health rounds, asked by the proxy for a pool-wide /v1/models.
const Path = "/v1/models"

// Learner returns a health.Config.Models callback recording each worker's
// /v1/models answer in r; an unparsable answer keeps the last list.
func Learner(r *Registry, log *slog.Logger) func(worker string, body []byte) {
	return func(worker string, body []byte) {
		cards, err := Parse(body)
		if err != nil {
			log.Warn("worker model list ignored", "worker", worker, "error", err.Error())
			return
		}
		if r.SetLearned(worker, cards) {
			log.Info("worker models changed", "worker", worker, "models", r.IDs(worker))
		}
	}
}
