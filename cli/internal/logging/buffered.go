package logging

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// Buffered batches log writes: one decision line per request would
// otherwise cost one write(2) per request on the hot path. Lines reach w
// within the flush interval, or at once when 64 KiB have accumulated, and
// Close flushes what is left. A crash may lose the last interval's lines.
type Buffered struct {
	mu   sync.Mutex
	bw   *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

// NewBuffered starts a writer that flushes to w every interval.
func NewBuffered(w io.Writer, interval time.Duration) *Buffered {
	b := &Buffered{bw: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-b.stop:
				return
			case <-t.C:
				b.Flush()
			}
		}
	}()
	return b
}

// Write implements io.Writer; slog handlers write one whole line per call.
func (b *Buffered) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bw.Write(p)
}

// Flush writes out buffered lines.
func (b *Buffered) Flush() {
	b.mu.Lock()
	_ = b.bw.Flush()
	b.mu.Unlock()
}

// Close stops the flusher and flushes.
func (b *Buffered) Close() error {
	close(b.stop)
	<-b.done
	b.Flush()
	return nil
}
