package server_test

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// server.own_http1_loop does what it says: on, a plain chat request is
// served by h1server's loop, which does not report connections to
// net/http's ConnState hook; off, net/http serves it and reports it.
func TestOwnHTTP1LoopSwitch(t *testing.T) {
	rep := newReplica(t, "w")
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprint("own_http1_loop ", own), func(t *testing.T) {
			a := newAllInOne(t, configFiles(t, workersYAML(rep.URL)+fmt.Sprintf("server:\n  own_http1_loop: %v\n", own)))
			var active atomic.Int32
			a.HTTP.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateActive {
					active.Add(1)
				}
			}
			base := runAllInOne(t, a)
			if code, _, b := chat(t, base, chatBody("system", "hello", false, 1)); code != http.StatusOK {
				t.Fatalf("status %d: %s", code, b)
			}
			if served := active.Load() > 0; served == own {
				t.Fatalf("net/http served the request: %v, want %v", served, !own)
			}
		})
	}
}
