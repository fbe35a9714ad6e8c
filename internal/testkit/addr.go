package testkit

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago, for a server the test cannot hand a listener to (a child process,
// a config file).
//
// The port comes from below the kernel's ephemeral range when there is
// room there (a random free port of 10000 up to the range's start). A
// port the kernel handed out for a listen on :0 could be handed out again
// at once as the source port of any outgoing connection, and a cluster of
// child processes makes many: a node then failed to bind its Raft port
// ("address already in use") in a full test run. Below the range only
// another test's random choice can take it, and within one test binary
// not even that: a port is handed out once (two nodes of one cluster were
// once given the same Raft port).
func FreeAddr(t testing.TB) string {
	t.Helper()
	if lo, ok := ephemeralLow(); ok && lo > minTestPort+1000 {
		for range 100 {
			port := minTestPort + rand.IntN(lo-minTestPort)
			if _, taken := handedOut.LoadOrStore(port, true); taken {
				continue
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			if ln, err := net.Listen("tcp", addr); err == nil {
				_ = ln.Close()
				return addr
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// handedOut are the ports FreeAddr returned (or found busy) in this
// process.
var handedOut sync.Map

// minTestPort keeps test servers off the well-known and common service
// ports.
const minTestPort = 10000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux).
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	lo, err := strconv.Atoi(f[0])
	return lo, err == nil
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	_, p, err := net.SplitHostPort(FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
