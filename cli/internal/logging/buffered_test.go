package logging

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestBufferedFlushesPeriodicallyAndOnClose(t *testing.T) {
	var out lockedBuf
	b := NewBuffered(&out, 20*time.Millisecond)
	log := New(b, "info", "json")
	log.Info("first")
	if strings.Contains(out.String(), "first") {
		t.Fatal("line written through immediately: nothing is buffered")
	}
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(out.String(), "first") {
		if time.Now().After(deadline) {
			t.Fatal("line never flushed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	log.Info("last")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "last") {
		t.Fatal("Close did not flush")
	}
}
