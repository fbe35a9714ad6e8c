package zmtpguard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/goleak"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.IgnoreZMQPubWriter)
}

// greeting is a ZMTP 3.0 NULL greeting.
func greeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	return g
}

// frame encodes one frame (short or long form by size).
func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		h := binary.BigEndian.AppendUint64([]byte{flags | flagLong}, uint64(len(body)))
		return append(h, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func property(name, value string) []byte {
	p := append([]byte{byte(len(name))}, name...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(value)))
	return append(p, value...)
}

// ready is a READY command from a socket of type typ.
func ready(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, property("Socket-Type", typ)...)
	return frame(flagCommand, body)
}

// crashingFrame is the 73 bytes of issue 33's attack: a greeting, then a
// long frame header claiming 2^62 bytes, which zmq4 (v0.17.0) allocates
// before reading and panics on.
func crashingFrame() []byte { return testkit.ZMTPCrashingFrame() }

func TestCrashingFrameIs73Bytes(t *testing.T) {
	if n := len(crashingFrame()); n != 73 {
		t.Fatalf("%d bytes", n)
	}
}

func TestChecker(t *testing.T) {
	badSig, oldVersion, plain, server2 := greeting(), greeting(), greeting(), greeting()
	badSig[9] = 0
	oldVersion[10] = 2
	copy(plain[12:], "PLAIN")
	server2[32] = 2
	long := func(flags byte, size uint64) []byte {
		return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
	}
	msg := func(frames ...[]byte) []byte { return slices.Concat(frames...) }
	for _, c := range []struct {
		name   string
		stream []byte
		reason string // "" = accepted whole
	}{
		{"handshake and a message", msg(greeting(), ready("PUB"), frame(flagMore, []byte("t")), frame(flagMore, make([]byte, 8)), frame(0, make([]byte, 300))), ""},
		{"the 73-byte attack", crashingFrame(), ReasonOversize},
		{"a frame one byte too big", msg(greeting(), long(0, 1025)), ReasonOversize},
		{"a frame at the limit", msg(greeting(), frame(0, make([]byte, 1024))), ""},
		{"a message past the limit in parts", msg(greeting(), frame(flagMore, make([]byte, 600)), long(0, 500)), ReasonOversize},
		{"two messages each at the limit", msg(greeting(), frame(0, make([]byte, 1024)), frame(0, make([]byte, 1024))), ""},
		{"too many frames", msg(greeting(), bytes.Repeat(frame(flagMore, nil), 4), frame(0, nil)), ReasonOversize},
		{"reserved flag bits", msg(greeting(), frame(0x80, nil)), ReasonFrame},
		{"a command with more", msg(greeting(), frame(flagCommand|flagMore, nil)), ReasonFrame},
		{"a command inside a message", msg(greeting(), frame(flagMore, nil), frame(flagCommand, nil)), ReasonFrame},
		{"bad signature", badSig, ReasonGreeting},
		{"ZMTP 2", oldVersion, ReasonGreeting},
		{"PLAIN mechanism", plain, ReasonGreeting},
		{"as-server 2", server2, ReasonGreeting},
	} {
		t.Run(c.name, func(t *testing.T) {
			ck := checker{maxMessage: 1024, maxFrames: 4}
			reason := feed(&ck, c.stream)
			if reason != c.reason {
				t.Fatalf("refused for %q, want %q", reason, c.reason)
			}
		})
	}
}

// feed runs a whole stream through a checker as conn does, returning the
// refusal's reason ("" when all of it passed).
func feed(ck *checker, s []byte) string {
	var unit []byte
	for len(s) > 0 {
		if ck.greeted && ck.body > 0 {
			n := int(min(uint64(len(s)), ck.body))
			ck.consumed(n)
			s = s[n:]
			continue
		}
		unit = append(unit, s[0])
		s = s[1:]
		if ck.need(unit) == 0 {
			if err := ck.unit(unit); err != nil {
				var v *Violation
				errors.As(err, &v)
				return v.Reason
			}
			unit = nil
		}
	}
	return ""
}

func TestParseMetadata(t *testing.T) {
	md, err := ParseMetadata(slices.Concat(property("socket-type", "PUB"), property("IDENTITY", "x"), property("X-Other", "")))
	if err != nil || md[socketTypeKey] != "PUB" || md[identityKey] != "x" || md["X-Other"] != "" || len(md) != 3 {
		t.Fatalf("%v, %v", md, err)
	}
	// zmq4's own parser slices past the end of these and panics.
	for _, bad := range [][]byte{{5, 'a', 'b', 'c', 'd'}, {1, 'a', 0, 0}, {1, 'a', 0, 0, 0, 9, 'v'}, {0, 0, 0, 0, 0}} {
		if _, err := ParseMetadata(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// listenSub binds a guarded SUB socket on 127.0.0.1 and reads it into a
// channel until the test ends.
func listenSub(t *testing.T, lim Limits) (zmq4.Socket, <-chan zmq4.Msg) {
	t.Helper()
	Register()
	ctx, cancel := context.WithCancel(Context(context.Background(), lim))
	sub := zmq4.NewSub(ctx, zmq4.WithSecurity(Security()), zmq4.WithLogger(discardLog()))
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Listen(Endpoint("tcp://127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	got := make(chan zmq4.Msg, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Recv()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				got <- m
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
		time.Sleep(100 * time.Millisecond) // zmq4 adds connections accepted during Close after it
		_ = sub.Close()
	})
	return sub, got
}

// goodPublisher dials addr with a plain zmq4 PUB and publishes until a
// message arrives on got.
func goodPublisher(t *testing.T, addr string, got <-chan zmq4.Msg) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	// Kept open until the test ends: it holds a connection slot.
	t.Cleanup(func() {
		cancel()
		_ = pub.Close()
	})
	if err := pub.Dial("tcp://" + addr); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(15 * time.Second)
	for {
		_ = pub.Send(zmq4.NewMsgFrom([]byte("topic"), []byte("seq"), []byte("payload")))
		select {
		case m := <-got:
			if len(m.Frames) != 3 || string(m.Frames[2]) != "payload" {
				t.Fatalf("received %q", m.Frames)
			}
			return
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("nothing from the good publisher")
		}
	}
}

// attack sends b to addr and reports whether the listener closed that
// connection.
func attack(t *testing.T, addr string, b []byte) bool { return testkit.SendAndWaitClosed(t, addr, b) }

type rejects struct {
	mu  sync.Mutex
	got []string
}

func (r *rejects) add(reason string) {
	r.mu.Lock()
	r.got = append(r.got, reason)
	r.mu.Unlock()
}

func (r *rejects) has(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.got, reason)
}

// The attacks of issue 33 against a listening SUB: each connection is
// closed, and a good publisher still gets through afterwards.
func TestAttacksCloseThePeerAndTheSocketLives(t *testing.T) {
	badReady := append(greeting(), frame(flagCommand, append([]byte{5}, "READY\x05abcd"...))...)
	for _, c := range []struct {
		name   string
		bytes  []byte
		reason string
	}{
		{"73-byte frame claiming 2^62 bytes", crashingFrame(), ReasonOversize},
		{"a 1 GiB frame after the handshake", slices.Concat(greeting(), ready("PUB"), binary.BigEndian.AppendUint64([]byte{flagLong}, 1<<30)), ReasonOversize},
		{"READY metadata running past its end", badReady, ""},
		{"an HTTP request", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 40))), ReasonGreeting},
		{"a SUB peer", slices.Concat(greeting(), ready("SUB")), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rj rejects
			sub, got := listenSub(t, Limits{OnReject: rj.add, Logger: discardSlog()})
			addr := sub.Addr().String()
			if !attack(t, addr, c.bytes) {
				t.Fatal("the attacking connection was left open")
			}
			if c.reason != "" && !rj.has(c.reason) {
				t.Fatalf("rejects %v, want %q", rj.got, c.reason)
			}
			goodPublisher(t, addr, got)
		})
	}
}

// A peer that connects and says nothing is closed after the handshake
// deadline, and does not hold up the publishers behind it for longer.
func TestSilentPeerIsClosedAfterTheHandshakeDeadline(t *testing.T) {
	var rj rejects
	sub, got := listenSub(t, Limits{HandshakeTimeout: 300 * time.Millisecond, OnReject: rj.add, Logger: discardSlog()})
	addr := sub.Addr().String()
	start := time.Now()
	if !attack(t, addr, nil) {
		t.Fatal("the silent connection was left open")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
	if !rj.has(ReasonHandshake) {
		t.Fatalf("rejects %v", rj.got)
	}
	goodPublisher(t, addr, got)
}

func TestAllowListAndConnectionCap(t *testing.T) {
	t.Run("source not allowed", func(t *testing.T) {
		var rj rejects
		sub, _ := listenSub(t, Limits{Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, OnReject: rj.add, Logger: discardSlog()})
		if !attack(t, sub.Addr().String(), slices.Concat(greeting(), ready("PUB"))) || !rj.has(ReasonNotAllowed) {
			t.Fatalf("not refused: %v", rj.got)
		}
	})
	t.Run("source allowed", func(t *testing.T) {
		sub, got := listenSub(t, Limits{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
		goodPublisher(t, sub.Addr().String(), got)
	})
	t.Run("one connection too many", func(t *testing.T) {
		var rj rejects
		sub, got := listenSub(t, Limits{MaxConns: 1, OnReject: rj.add, Logger: discardSlog()})
		goodPublisher(t, sub.Addr().String(), got)
		if !attack(t, sub.Addr().String(), nil) || !rj.has(ReasonTooMany) {
			t.Fatalf("second connection not refused: %v", rj.got)
		}
	})
}

func TestIPCSocketMode(t *testing.T) {
	Register()
	path := filepath.Join(t.TempDir(), "kv.sock")
	ctx, cancel := context.WithCancel(Context(context.Background(), Limits{IPCMode: 0o600}))
	defer cancel()
	sub := zmq4.NewSub(ctx, zmq4.WithSecurity(Security()))
	if err := sub.Listen(Endpoint("ipc://" + path)); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("mode %v", fi.Mode())
	}
}

func TestEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://127.0.0.1:5557": "guarded-tcp://127.0.0.1:5557",
		"ipc:///tmp/x":         "guarded-ipc:///tmp/x",
		"inproc://x":           "inproc://x",
	} {
		if got := Endpoint(in); got != want {
			t.Errorf("Endpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// A peer that never reads stalls zmq4's greeting write: the handshake
// deadline cuts it and the connection is closed, freeing its slot.
func TestPeerThatNeverReadsIsClosed(t *testing.T) {
	client, server := net.Pipe() // unbuffered: a write waits for a read
	defer client.Close()
	released := make(chan struct{})
	g := wrap(server, &Limits{HandshakeTimeout: 200 * time.Millisecond}, func() { close(released) })
	_, err := zmq4.Open(g, Security(), zmq4.Sub, zmq4.SocketIdentity("x"), true, nil)
	if err == nil {
		t.Fatal("handshake succeeded with a peer that never answered")
	}
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was left open")
	}
}
