package raftnode

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"slices"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter routes hashicorp/raft's hclog output into the process's slog
// logger. Raft is chatty at info and below (every election, every snapshot,
// every pipeline restart), so only warnings and errors are forwarded: those
// are the ones an operator must see, and the node itself logs the
// transitions that matter (leadership, shutdown) at info.
type hclogAdapter struct {
	base    *slog.Logger // without this adapter's name and implied args
	log     *slog.Logger // base with them, ready to use
	name    string
	implied []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func newHCLogAdapter(l *slog.Logger, name string) *hclogAdapter {
	return derive(l, name, nil)
}

func derive(base *slog.Logger, name string, implied []any) *hclogAdapter {
	return &hclogAdapter{base: base, log: base.With("component", name).With(safeArgs(implied)...), name: name, implied: implied}
}

// reservedKeys are the keys slog's handlers write for every record. raft
// names some of its own fields the same (the "failed to contact" warning
// carries a duration called "time"), and a JSON line with two "time" keys
// makes log tools read raft's value instead of the timestamp.
var reservedKeys = map[string]bool{slog.TimeKey: true, slog.LevelKey: true, slog.MessageKey: true, slog.SourceKey: true}

// safeArgs returns hclog's alternating key/value args with every key that
// would collide with a record's own keys prefixed "raft_". args is not
// modified: hclog callers may reuse it.
func safeArgs(args []any) []any {
	var out []any
	for i := 0; i < len(args); i += 2 {
		k, ok := args[i].(string)
		if !ok || !reservedKeys[k] {
			continue
		}
		if out == nil {
			out = slices.Clone(args)
		}
		out[i] = "raft_" + k
	}
	if out == nil {
		return args
	}
	return out
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	var sl slog.Level
	switch level {
	case hclog.Warn:
		sl = slog.LevelWarn
	case hclog.Error:
		sl = slog.LevelError
	default:
		return
	}
	a.log.Log(context.Background(), sl, msg, safeArgs(args)...)
}

func (a *hclogAdapter) Trace(string, ...any)                {}
func (a *hclogAdapter) Debug(string, ...any)                {}
func (a *hclogAdapter) Info(string, ...any)                 {}
func (a *hclogAdapter) Warn(msg string, args ...any)        { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any)       { a.Log(hclog.Error, msg, args...) }
func (a *hclogAdapter) IsTrace() bool                       { return false }
func (a *hclogAdapter) IsDebug() bool                       { return false }
func (a *hclogAdapter) IsInfo() bool                        { return false }
func (a *hclogAdapter) IsWarn() bool                        { return true }
func (a *hclogAdapter) IsError() bool                       { return true }
func (a *hclogAdapter) ImpliedArgs() []any                  { return a.implied }
func (a *hclogAdapter) Name() string                        { return a.name }
func (a *hclogAdapter) GetLevel() hclog.Level               { return hclog.Warn }
func (a *hclogAdapter) SetLevel(hclog.Level)                {} // fixed at warn, see the type comment
func (a *hclogAdapter) ResetNamed(name string) hclog.Logger { return derive(a.base, name, a.implied) }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return derive(a.base, a.name, append(slices.Clone(a.implied), args...))
}

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

// StandardWriter forwards whole lines at warn: code that wants a standard
// library logger from raft only uses it for problems.
func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return lineWriter{a}
}

type lineWriter struct{ a *hclogAdapter }

func (w lineWriter) Write(p []byte) (int, error) {
	if msg := bytes.TrimSpace(p); len(msg) > 0 {
		w.a.Log(hclog.Warn, string(msg))
	}
	return len(p), nil
}
