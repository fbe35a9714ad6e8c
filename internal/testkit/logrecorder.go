package testkit

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// LogRecorder is a slog.Handler that keeps every record so a test can
// assert what was logged (and at which level) rather than parse text
// output. It records all levels. Handlers derived by WithAttrs and
// WithGroup share the recorder's store; attributes added by WithAttrs are
// kept on the records, group names are dropped (tests look attributes up
// by their plain key).
type LogRecorder struct {
	store *recStore
	attrs []slog.Attr
}

type recStore struct {
	mu   sync.Mutex
	recs []slog.Record
}

// NewLogRecorder returns an empty recorder.
func NewLogRecorder() *LogRecorder { return &LogRecorder{store: &recStore{}} }

func (h *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *LogRecorder) Handle(_ context.Context, r slog.Record) error {
	// Clone: the caller may reuse the record's attribute storage.
	r = r.Clone()
	if len(h.attrs) > 0 {
		r.AddAttrs(h.attrs...)
	}
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	h.store.recs = append(h.store.recs, r)
	return nil
}

func (h *LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &LogRecorder{store: h.store, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *LogRecorder) WithGroup(string) slog.Handler { return h }

// Records returns a copy of the records kept so far, oldest first.
func (h *LogRecorder) Records() []slog.Record {
	h.store.mu.Lock()
	defer h.store.mu.Unlock()
	return slices.Clone(h.store.recs)
}

// Count returns how many records have the level and a message containing
// substr.
func (h *LogRecorder) Count(level slog.Level, substr string) int {
	n := 0
	for _, r := range h.Records() {
		if r.Level == level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

// Values returns, for each record whose message is exactly msg, the value
// of its attribute key as text (records without it are skipped).
func (h *LogRecorder) Values(msg, key string) []string {
	var out []string
	for _, r := range h.Records() {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.String())
				return false
			}
			return true
		})
	}
	return out
}
