package epp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// The feed holds at most a window the reader has not read: the writer
// waits past it (the gateway is held back by gRPC's flow control), goes
// on when the reader reads or is done, and gives up when the stream ends.
func TestFeedHoldsAWindow(t *testing.T) {
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	f := newFeed(32 << 20)
	ctx := context.Background()
	for f.buffered < feedWindow {
		if err := f.write(ctx, chunk); err != nil {
			t.Fatal(err)
		}
	}
	wrote := make(chan error, 1)
	go func() { wrote <- f.write(ctx, chunk) }()
	select {
	case err := <-wrote:
		t.Fatalf("a write past the window went through at once (%v): %d bytes held", err, f.buffered)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := io.ReadFull(f, make([]byte, len(chunk))); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Recv(t, wrote, 10*time.Second, "the waiting write's result"); err != nil {
		t.Fatalf("the write after a read: %v", err)
	}

	// A reader that is done (returned, or picked) drops the rest.
	go func() { wrote <- f.write(ctx, chunk) }()
	time.Sleep(20 * time.Millisecond)
	_ = f.Close()
	if err := testkit.Recv(t, wrote, 10*time.Second, "the waiting write's result"); err != nil || f.buffered != 0 {
		t.Fatalf("a write after Close: %v, %d bytes held", err, f.buffered)
	}

	// A stream that ends frees a waiting writer.
	g := newFeed(32 << 20)
	for g.buffered < feedWindow {
		_ = g.write(ctx, chunk)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { wrote <- g.write(cctx, chunk) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	if err := testkit.Recv(t, wrote, 10*time.Second, "the waiting write's result"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiting write when the stream ends: %v", err)
	}
}

// The body read deadline: a Read waiting for a chunk fails with a timeout
// once it passes, a chunk in the feed is still read after it, and the
// zero time lifts it.
func TestFeedReadDeadline(t *testing.T) {
	f := newFeed(1 << 20)
	f.setReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := f.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a Read past the deadline: %v, want a timeout", err)
	}
	if err := f.write(context.Background(), []byte("late")); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("a buffered chunk after the deadline: %d, %v", n, err)
	}
	f.setReadDeadline(time.Time{})
	go func() {
		time.Sleep(100 * time.Millisecond)
		f.close()
	}()
	if _, err := f.Read(make([]byte, 8)); err != io.EOF {
		t.Fatalf("after the deadline was lifted: %v, want io.EOF at the end", err)
	}
	_ = f.Close()
}
