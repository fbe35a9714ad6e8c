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
	return &hclogAdapter{base: base, log: base.With("component", name).With(implied...), name: name, implied: implied}
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
	a.log.Log(context.Background(), sl, msg, args...)
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
