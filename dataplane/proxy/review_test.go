package proxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// A worker answering 101 must not leave the decision unsettled.
func TestUpgradeResponseDoesNotLeakLoad(t *testing.T) {
	a := newBackend(t, "a")
	a.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		w.WriteHeader(http.StatusSwitchingProtocols)
	})
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.PassThroughPaths = []string{"/v1/realtime"}
	}))
	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, r.front.URL+"/v1/realtime", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode == http.StatusSwitchingProtocols {
			t.Fatal("upgrade was proxied")
		}
	}
	if a.hits.Load() != 3 {
		t.Fatalf("the replica saw %d upgrade requests, want 3", a.hits.Load())
	}
	r.waitLoadZero()
}

// An escaped slash must not smuggle a routed endpoint past extraction and
// the remote-media policy.
func TestEncodedSlashIsStillRouted(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.RemoteMediaPolicy = 403 }))
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x"}}]}]}`
	for _, path := range []string{"/v1/chat%2Fcompletions", "/v1/chat%2fcompletions"} {
		resp := r.post(path, body)
		readAll(t, resp)
		if resp.StatusCode != 403 {
			t.Fatalf("%s: status %d, want the remote-media refusal", path, resp.StatusCode)
		}
	}
	if a.hits.Load() != 0 {
		t.Fatal("the replica saw the smuggled request")
	}
}

// A client that stops reading a stream must not pin a load unit: the
// stall timer ends the stream even while the write to the client blocks.
func TestStalledClientReleasesLoad(t *testing.T) {
	a := newBackend(t, "a")
	a.set(streamUntilGone(stopChan(t), "data: "+strings.Repeat("x", 32<<10)+"\n\n", 0))
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) {
		o.StreamIdleTimeout = 300 * time.Millisecond
	}))
	// A raw client that sends a request and never reads the answer.
	conn := dialFront(t, r.front.URL, 0)
	body := chatBody("s", "stream forever", true)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	testkit.WaitFor(t, 5*time.Second, "r.totalLoad() == 1", func() bool { return r.totalLoad() == 1 })
	// The client's receive buffer fills and the proxy's write blocks; the
	// load must still come back.
	deadline := time.Now().Add(10 * time.Second)
	for r.totalLoad() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a client that stopped reading still holds its load after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
