package testkit

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Blackhole is a TCP proxy on 127.0.0.1 that can stop forwarding without
// closing anything, as a network partition does (a firewall dropping
// packets, a link down): while cut, bytes in either direction are held,
// not delivered and not refused, and no connection ends. Connections
// accepted while cut are held the same way.
//
// Heal takes the partition away, as TCP sees it: a connection made after
// the heal works at once, but one that lived through the partition stays
// silent for stale longer, because TCP's retransmission timer backed off
// exponentially while its segments were dropped and fires again only that
// much later (issue 32: 12.5 s after the heal). What was held is then
// delivered, in order, as retransmission would.
type Blackhole struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cut      bool
	changed  chan struct{} // closed and replaced at every change of state
	conns    map[*holeConn]struct{}
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

type holeConn struct {
	client, server net.Conn
	cut            bool      // lived through the current partition
	resume         time.Time // after a heal: nothing flows before this
}

// NewBlackhole starts a proxy to target (host:port), closed at cleanup.
func NewBlackhole(t testing.TB, target string) *Blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &Blackhole{ln: ln, target: target, changed: make(chan struct{}), conns: map[*holeConn]struct{}{}}
	b.wg.Add(1)
	go b.accept()
	t.Cleanup(b.Close)
	return b
}

// Addr is the proxy's host:port.
func (b *Blackhole) Addr() string { return b.ln.Addr().String() }

// Accepted is how many connections the proxy accepted so far.
func (b *Blackhole) Accepted() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.accepted
}

// Cut stops all forwarding.
func (b *Blackhole) Cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	for c := range b.conns {
		c.cut = true
	}
	b.changeLocked()
}

// Heal forwards again: at once on new connections, after stale on those
// that lived through the partition.
func (b *Blackhole) Heal(stale time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = false
	now := time.Now()
	for c := range b.conns {
		if c.cut {
			c.cut, c.resume = false, now.Add(stale)
		}
	}
	b.changeLocked()
}

// Close closes the listener and every connection, and waits for the
// proxy's goroutines.
func (b *Blackhole) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	_ = b.ln.Close()
	for c := range b.conns {
		_ = c.client.Close()
		_ = c.server.Close()
	}
	b.changeLocked()
	b.mu.Unlock()
	b.wg.Wait()
}

func (b *Blackhole) changeLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *Blackhole) accept() {
	defer b.wg.Done()
	for {
		client, err := b.ln.Accept()
		if err != nil {
			return
		}
		// Dialled at once even while cut: the server seeing an idle
		// connection is not something a client can tell apart.
		server, err := net.Dial("tcp", b.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &holeConn{client: client, server: server}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		b.accepted++
		c.cut = b.cut
		b.conns[c] = struct{}{}
		b.wg.Add(2)
		b.mu.Unlock()
		go b.pipe(c, client, server)
		go b.pipe(c, server, client)
	}
}

// pipe copies src to dst while c may flow. The end of src is held like
// its bytes (a FIN is dropped too), then ends both sides.
func (b *Blackhole) pipe(c *holeConn, src, dst net.Conn) {
	defer b.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !b.wait(c) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			b.wait(c)
			b.mu.Lock()
			delete(b.conns, c)
			b.mu.Unlock()
			_ = c.client.Close()
			_ = c.server.Close()
			return
		}
	}
}

// wait returns once c may flow, or false when the proxy closed.
func (b *Blackhole) wait(c *holeConn) bool {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return false
		}
		changed, cut, resume := b.changed, c.cut, c.resume
		b.mu.Unlock()
		if !cut && !time.Now().Before(resume) {
			return true
		}
		if cut {
			<-changed
			continue
		}
		t := time.NewTimer(time.Until(resume))
		select {
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
