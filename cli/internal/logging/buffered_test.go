package logging

import (
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestBufferedFlushesPeriodicallyAndOnClose(t *testing.T) {
	var out testkit.SyncBuffer
	b := NewBuffered(&out, 20*time.Millisecond)
	log := New(b, "info", "json")
	log.Info("first")
	if strings.Contains(out.String(), "first") {
		t.Fatal("line written through immediately: nothing is buffered")
	}
	testkit.WaitFor(t, 2*time.Second, "the buffered line flushed", func() bool { return strings.Contains(out.String(), "first") })
	log.Info("last")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "last") {
		t.Fatal("Close did not flush")
	}
}
