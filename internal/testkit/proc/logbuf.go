package proc

import (
	"strings"
	"sync"
)

// LogCap bounds what a LogBuffer keeps: a chatty child must not eat the
// test's memory. Past it the older half is dropped.
const LogCap = 1 << 20

// LogBuffer collects a child's output. It is safe to read while the child
// writes, and keeps at most the last LogCap bytes.
type LogBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > LogCap {
		l.b = append([]byte("...\n"), l.b[len(l.b)-LogCap/2:]...)
	}
	return len(p), nil
}

// String returns everything kept.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// Tail returns the last n bytes kept.
func (l *LogBuffer) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.b) > n {
		return "...\n" + string(l.b[len(l.b)-n:])
	}
	return string(l.b)
}

// Contains reports whether the output kept holds s.
func (l *LogBuffer) Contains(s string) bool { return strings.Contains(l.String(), s) }
