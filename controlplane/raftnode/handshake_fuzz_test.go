package raftnode

import (
	"bytes"
	"testing"
)

// FuzzServerHandshake feeds a listener in the upgrade (both generations)
// whatever a dialer may send: it never panics, never acknowledges and never
// accepts a dialer, since no input can hold a proof for the listener's
// fresh nonce.
func FuzzServerHandshake(f *testing.F) {
	client := mustAuthWith(f, "n2", testToken, clusterToken)
	for _, k := range client.keys {
		hello, _ := client.hello(k.gen)
		f.Add(hello)
		f.Add(append(bytes.Clone(hello), make([]byte, macLen)...))
	}
	f.Add([]byte(magicV2))
	f.Add([]byte(magicV1 + "\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add(append([]byte(magicV2), bytes.Repeat([]byte{0xff}, nonceLen+1+255+macLen)...))
	server := mustAuthWith(f, "n1", testToken, clusterToken)
	f.Fuzz(func(t *testing.T, in []byte) {
		conn := &scripted{Reader: bytes.NewReader(in)}
		id, gen, err := server.serverHandshake(conn)
		if err == nil {
			t.Fatalf("accepted dialer %q (%v) from %x", id, gen, in)
		}
		if len(id) > maxPeerIDLen {
			t.Fatalf("claimed id of %d bytes", len(id))
		}
		// The listener writes nothing, or its hello and proof, never an ack.
		if n := conn.out.Len(); n != 0 && n != magicLen+nonceLen+1+len(server.nodeID)+macLen {
			t.Fatalf("listener wrote %d bytes to a refused dialer", n)
		}
	})
}
