// Package simtest serves simulated replicas to the tests of other packages:
// the replica, its loopback test server and the cleanup that stops both.
package simtest

import (
	"net/http/httptest"
	"testing"

	"github.com/cartrouter/cart/sim"
)

// Replica is a simulated replica served over HTTP for the rest of a test.
type Replica struct {
	*sim.Server
	HTTP *httptest.Server
	URL  string
}

// Start serves a replica built from cfg until the test ends.
func Start(t testing.TB, cfg sim.Config) *Replica {
	t.Helper()
	return Serve(t, sim.New(cfg))
}

// Serve serves s, a replica the test has already built (to keep a handle
// on what it was given, such as a KV event publisher), until the test ends.
func Serve(t testing.TB, s *sim.Server) *Replica {
	t.Helper()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		// The replica first, so that long generations end before the
		// server waits for its handlers.
		_ = s.Close()
		ts.Close()
	})
	return &Replica{Server: s, HTTP: ts, URL: ts.URL}
}

// URLs serves n replicas, the i-th built from cfg(i), and returns their
// URLs in that order.
func URLs(t testing.TB, n int, cfg func(i int) sim.Config) []string {
	t.Helper()
	urls := make([]string, n)
	for i := range n {
		urls[i] = Start(t, cfg(i)).URL
	}
	return urls
}
