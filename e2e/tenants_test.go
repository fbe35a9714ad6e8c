package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
)

// seenReplica is a cart-sim replica that notes every request it gets
// besides health and model probes: the method, the request line's target
// as it came and the X-Request-Id.
type seenReplica struct {
	url string
	mu  sync.Mutex
	got []string
}

func newSeenReplica(t *testing.T, cfg sim.Config) *seenReplica {
	t.Helper()
	s := sim.New(cfg)
	h := s.Handler()
	sr := &seenReplica{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" && r.URL.Path != "/v1/models" && r.URL.Path != "/metrics" {
			sr.mu.Lock()
			sr.got = append(sr.got, r.Method+" "+r.RequestURI+" id="+r.Header.Get("X-Request-Id"))
			sr.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { _ = s.Close(); ts.Close() })
	sr.url = ts.URL
	return sr
}

func (s *seenReplica) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// seenAll is what every replica got, in one list.
func seenAll(rs []*seenReplica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.seen()...)
	}
	return out
}

// tenantKeys are the client keys the tenant tests configure: team-a's
// cache isolated, team-b and team-c not.
const tenantKeys = `auth:
  client_keys:
    - {name: team-a, key: e2e-key-team-a-5b1e, isolate_cache: true}
    - {name: team-b, key: e2e-key-team-b-9c2f}
    - {name: team-c, key: e2e-key-team-c-1d7a}
`

var keyA, keyB, keyC = []string{"Authorization", "Bearer e2e-key-team-a-5b1e"}, []string{"Authorization", "Bearer e2e-key-team-b-9c2f"}, []string{"Authorization", "Bearer e2e-key-team-c-1d7a"}

func call(t *testing.T, method, url, body string, hdr ...string) (int, string) {
	t.Helper()
	resp, b, err := testkit.Do(t, method, url, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// startCPAndDataPlanes runs one control-plane node over workers and two
// data planes with the tenant keys, and returns the data planes' URLs.
func startCPAndDataPlanes(t *testing.T, workers []string) (dp1, dp2 string) {
	t.Helper()
	cartBin, _ := buildBinaries(t)
	dir := t.TempDir()
	cp := &cpNode{id: "n1", api: testkit.FreeAddr(t), raft: testkit.FreeAddr(t)}
	var sb strings.Builder
	sb.WriteString("server: {min_open_files: 0}\nlog: {level: info, format: text}\nhealth: {interval_secs: 0.5, timeout_secs: 0.4}\n")
	fmt.Fprintf(&sb, "controlplane:\n  node_id: n1\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n  placement_batch_ms: 5\n  bootstrap: true\nworkers:\n",
		cp.api, cp.raft, filepath.Join(dir, "raft-n1"))
	for _, w := range workers {
		fmt.Fprintf(&sb, "  - url: %s\n", w)
	}
	writeFile(t, filepath.Join(dir, "n1.yaml"), sb.String())
	cp.Proc = proc.Start(t, proc.Cmd{Name: "cp-n1", Path: cartBin, Args: []string{"controlplane", "-c", filepath.Join(dir, "n1.yaml")}})
	var dps []*httpNode
	for _, id := range []string{"dp1", "dp2"} {
		d := &httpNode{id: id, addr: testkit.FreeAddr(t)}
		_, port, _ := net.SplitHostPort(d.addr)
		cfg := filepath.Join(dir, id+".yaml")
		writeFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}
log: {level: info, format: text}
proxy: {add_routed_peer_header: true}
dataplane:
  id: %s
  control_plane: [%s]
  route_timeout_ms: %d
`, port, id, cp.url(), routeTimeoutMs)+tenantKeys)
		d.Proc = proc.Start(t, proc.Cmd{Name: id, Path: cartBin, Args: []string{"dataplane", "-c", cfg}})
		dps = append(dps, d)
	}
	for _, d := range dps {
		d.WaitFor(t, 30*time.Second, "ready with every worker", func() (bool, string) {
			if ok, last := proc.HTTPOK(d.url() + "/health")(); !ok {
				return false, last
			}
			// /workers answers loopback callers without an admin token.
			got, err := routerWorkers(d.url())
			return err == nil && sameSet(got, workers), fmt.Sprint("workers ", got, err)
		})
	}
	return dps[0].url(), dps[1].url()
}

// Attacks #4, #7 and #8 against a distributed deployment (one control-plane
// node, two data planes, cart-sim replicas, the tenant keys on both data
// planes). A response team-a made through one data plane is team-a's
// through the other too: team-b gets, for GET, DELETE, cancel and
// previous_response_id, exactly what the engine answers for an id nobody
// made, and no replica hears of it; team-a is pinned to the replica holding
// it. A response id that is no id reaches no replica whatever it decodes
// to. The replicas get CART's X-Request-Id, not the client's.
func TestTenantsAcrossDataPlanes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts cart processes; skipped with -short")
	}
	reps := []*seenReplica{
		newSeenReplica(t, sim.Config{Name: "r1", BlockTokens: 16, OutputTokens: 4}),
		newSeenReplica(t, sim.Config{Name: "r2", BlockTokens: 16, OutputTokens: 4}),
	}
	dp1, dp2 := startCPAndDataPlanes(t, []string{reps[0].url, reps[1].url})

	code, body := call(t, http.MethodPost, dp1+"/v1/responses", `{"model":"cart-sim","input":"team-a's private question"}`, keyA...)
	var made struct{ ID string }
	if code != http.StatusOK || json.Unmarshal([]byte(body), &made) != nil || made.ID == "" {
		t.Fatalf("team-a creates a response through dp1: %d %s", code, body)
	}
	// What the engine answers for an id it does not know: ask for one that
	// nobody made (CART routes it to a replica, which answers).
	const unknownID = "resp_nobodymadethis0"
	code, unknown := call(t, http.MethodGet, dp2+"/v1/responses/"+unknownID, "", keyA...)
	if code != http.StatusNotFound {
		t.Fatalf("unknown id: %d %s", code, unknown)
	}
	want := strings.ReplaceAll(unknown, unknownID, made.ID)

	before := len(seenAll(reps))
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/" + made.ID, ""},
		{http.MethodGet, "/v1/responses/" + made.ID + "/input_items", ""},
		{http.MethodPost, "/v1/responses/" + made.ID + "/cancel", ""},
		{http.MethodDelete, "/v1/responses/" + made.ID, ""},
		{http.MethodPost, "/v1/responses", `{"model":"cart-sim","input":"and then?","previous_response_id":"` + made.ID + `"}`},
	} {
		for _, dp := range []string{dp2, dp1} {
			if code, got := call(t, c.method, dp+c.path, c.body, keyB...); code != http.StatusNotFound || !testkit.SameJSON(got, want) {
				t.Errorf("team-b %s %s via %s: %d %s, want the engine's 404 for an unknown id: %s", c.method, c.path, dp, code, got, want)
			}
		}
	}
	if got := seenAll(reps)[before:]; len(got) != 0 {
		t.Fatalf("team-b's requests reached replicas: %v", got)
	}
	// team-a, through the other data plane, is served from its replica.
	code, body = call(t, http.MethodPost, dp2+"/v1/responses", `{"model":"cart-sim","input":"and then?","previous_response_id":"`+made.ID+`"}`, keyA...)
	if code != http.StatusOK {
		t.Fatalf("team-a continues through dp2: %d %s", code, body)
	}
	if code, body = call(t, http.MethodGet, dp2+"/v1/responses/"+made.ID, "", keyA...); code != http.StatusOK || !strings.Contains(body, made.ID) {
		t.Fatalf("team-a reads its response through dp2: %d %s", code, body)
	}

	// Attack #7: an "id" that decodes to another path.
	before = len(seenAll(reps))
	for _, dp := range []string{dp1, dp2} {
		for _, c := range []struct{ method, path string }{
			{http.MethodGet, "/v1/responses/resp_x%2F..%2F..%2Fsim%2Fstats"},
			{http.MethodDelete, "/v1/responses/..%2F..%2Fsim%2Fstats"},
			{http.MethodPost, "/v1/responses/..%2F..%2Fsim%2Freset/cancel"},
		} {
			if code, got := call(t, c.method, dp+c.path, "", keyA...); code != http.StatusNotFound || !strings.Contains(got, `"code":404`) {
				t.Errorf("%s %s via %s: %d %s, want the engine's 404 for an unknown id", c.method, c.path, dp, code, got)
			}
		}
	}
	if got := seenAll(reps)[before:]; len(got) != 0 {
		t.Fatalf("replicas received %v", got)
	}

	// Attack #8: the client's X-Request-Id never reaches a replica.
	before = len(seenAll(reps))
	code, body = call(t, http.MethodPost, dp1+"/v1/chat/completions", `{"model":"cart-sim","messages":[{"role":"user","content":"hi"}]}`,
		append(keyB, "X-Request-Id", "chosen-by-the-client")...)
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, body)
	}
	got := seenAll(reps)[before:]
	if len(got) != 1 || strings.Contains(got[0], "chosen-by-the-client") || strings.HasSuffix(got[0], "id=") {
		t.Fatalf("replicas received %v, want one request with CART's own X-Request-Id", got)
	}
}

// Attack #6, and auth.client_keys[].isolate_cache in the real process: an
// all-in-one cart in front of one cart-sim replica (so every request meets
// the same cache). team-b replaying isolated team-a's prompt gets 0 cached
// tokens; team-b replaying team-c's (neither isolated) gets its cache hit;
// team-a still hits its own. The process idles past several index
// maintenance passes (cache.eviction_interval_secs) and health probes, and
// the same holds after.
func TestIsolatedCacheInTheRealProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the cart binary; skipped with -short")
	}
	cartBin, _ := buildBinaries(t)
	rep := newSeenReplica(t, sim.Config{Name: "one", BlockTokens: 16, OutputTokens: 4})
	dir := t.TempDir()
	n := &httpNode{id: "aio-tenants", addr: testkit.FreeAddr(t)}
	_, port, _ := net.SplitHostPort(n.addr)
	cfg := filepath.Join(dir, "cart.yaml")
	writeFile(t, cfg, fmt.Sprintf(`server: {host: 127.0.0.1, port: %s, min_open_files: 0, shutdown_grace_secs: 1}
log: {level: info, format: text}
health: {interval_secs: 0.2, timeout_secs: 0.2}
cache: {eviction_interval_secs: 0.2}
workers: [{url: %q}]
`, port, rep.url)+tenantKeys)
	n.Proc = proc.Start(t, proc.Cmd{Name: n.id, Path: cartBin, Args: []string{"-c", cfg}})
	n.WaitFor(t, 20*time.Second, "/health", proc.HTTPOK(n.url()+"/health"))

	cached := func(key []string, prompt string) int {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"model": "cart-sim", "max_tokens": 2, "messages": []map[string]string{{"role": "user", "content": prompt}}})
		code, body := call(t, http.MethodPost, n.url()+"/v1/chat/completions", string(b), key...)
		var v struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || v.Usage.PromptTokens == 0 {
			t.Fatalf("chat: %d %s", code, body)
		}
		return v.Usage.PromptTokensDetails.CachedTokens
	}
	check := func(round int) {
		t.Helper()
		secret := strings.Repeat(fmt.Sprintf("team-a's confidential plan, round %d. ", round), 30)
		shared := strings.Repeat(fmt.Sprintf("team-c's ordinary prompt, round %d. ", round), 30)
		cached(keyA, secret)
		if got := cached(keyB, secret); got != 0 {
			t.Fatalf("round %d: team-b replaying isolated team-a's prompt: %d cached tokens, want 0", round, got)
		}
		if got := cached(keyA, secret); got == 0 {
			t.Fatalf("round %d: team-a's own replay cached nothing", round)
		}
		cached(keyC, shared)
		if got := cached(keyB, shared); got == 0 {
			t.Fatalf("round %d: team-b replaying team-c's prompt (neither isolated): 0 cached tokens, want a hit", round)
		}
	}
	check(1)
	// Idle past several maintenance passes (0.2 s each) and probes.
	time.Sleep(time.Second)
	if !n.Running() {
		t.Fatalf("cart exited while idle:\n%s", n.Log.Tail(4096))
	}
	check(2)
	if code, body := call(t, http.MethodPost, n.url()+"/v1/messages", `{"model":"cart-sim","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, keyA...); code != http.StatusBadRequest || !strings.Contains(body, "isolate_cache") {
		t.Fatalf("isolated tenant on /v1/messages: %d %s, want 400 naming isolate_cache", code, body)
	}
}
