package zmtpguard

import (
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

func discardLog() *log.Logger   { return log.New(io.Discard, "", 0) }
func discardSlog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serve runs zmq4's own handshake and reader (as a SUB socket runs them)
// over a guarded connection fed with stream, until the stream ends or is
// refused. It returns the messages zmq4 read.
func serve(t testing.TB, stream []byte, lim *Limits) []zmq4.Msg {
	client, server := net.Pipe()
	go func() {
		_, _ = client.Write(stream)
		_ = client.Close()
	}()
	go func() { _, _ = io.Copy(io.Discard, client) }() // zmq4's greeting, READY, PONGs
	g := wrap(server, lim, nil)
	defer g.Close()
	zc, err := zmq4.Open(g, Security(), zmq4.Sub, zmq4.SocketIdentity("fuzz"), true, nil)
	if err != nil {
		return nil
	}
	var out []zmq4.Msg
	for {
		m, err := zc.RecvMsg()
		if err != nil {
			return out
		}
		out = append(out, m)
	}
}

// FuzzGuardedConn feeds any byte stream to zmq4's handshake and frame
// reader through the guard: nothing may panic (zmq4 alone panics on the
// seeds), and every message zmq4 reads stays within the limits.
func FuzzGuardedConn(f *testing.F) {
	hs := slices.Concat(greeting(), ready("PUB"))
	f.Add(crashingFrame())
	f.Add(slices.Concat(greeting(), frame(flagCommand, append([]byte{5}, "READY\x05abcd"...))))
	f.Add(slices.Concat(hs, frame(flagMore, []byte("topic")), frame(flagMore, make([]byte, 8)), frame(0, []byte("payload"))))
	f.Add(slices.Concat(hs, frame(flagCommand, []byte("\x04PING\x00\x01"))))
	f.Add(slices.Concat(hs, frame(0, make([]byte, 300))))
	lim := &Limits{MaxMessageBytes: 512, MaxFrames: 4, HandshakeTimeout: 5 * time.Second, Logger: discardSlog()}
	f.Fuzz(func(t *testing.T, stream []byte) {
		for _, m := range serve(t, stream, lim) {
			size := 0
			for _, fr := range m.Frames {
				size += len(fr)
			}
			if size > 512 || len(m.Frames) > 4 {
				t.Fatalf("a message of %d bytes in %d frames passed", size, len(m.Frames))
			}
		}
	})
}

// FuzzParseMetadata: no input panics, and what parses re-encodes to the
// same properties.
func FuzzParseMetadata(f *testing.F) {
	f.Add(slices.Concat(property("Socket-Type", "PUB"), property("Identity", "x")))
	f.Add([]byte{5, 'a', 'b', 'c', 'd'})
	f.Fuzz(func(t *testing.T, p []byte) {
		md, err := ParseMetadata(p)
		if err != nil {
			return
		}
		for k := range md {
			if k == "" || len(k) > 255 {
				t.Fatalf("name %q", k)
			}
		}
	})
}

// BenchmarkGuardedRead: zmq4 reading 3-frame KV event messages of a 2 KiB
// payload over a pipe, bare and guarded.
func BenchmarkGuardedRead(b *testing.B) {
	msg := slices.Concat(frame(flagMore, []byte("kv@pod@model")), frame(flagMore, make([]byte, 8)), frame(0, make([]byte, 2048)))
	for _, guarded := range []bool{false, true} {
		name := "bare"
		if guarded {
			name = "guarded"
		}
		b.Run(name, func(b *testing.B) {
			client, server := net.Pipe()
			go func() { _, _ = io.Copy(io.Discard, client) }()
			go func() {
				_, _ = client.Write(slices.Concat(greeting(), ready("PUB")))
				for range b.N {
					if _, err := client.Write(msg); err != nil {
						return
					}
				}
			}()
			var conn net.Conn = server
			sec := Security()
			if guarded {
				conn = wrap(server, &Limits{}, nil)
			}
			zc, err := zmq4.Open(conn, sec, zmq4.Sub, zmq4.SocketIdentity("b"), true, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			for range b.N {
				if _, err := zc.RecvMsg(); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			_ = client.Close()
			_ = server.Close()
		})
	}
}
