package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

// vllmNotFound is vLLM's answer for a response id its store does not hold
// (OpenAIServingResponses._make_not_found_error), as cart-sim gives it.
func vllmNotFound(id string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": "Response with id '" + id + "' not found.", "type": "invalid_request_error", "param": "response_id", "code": 404}})
	return string(b)
}

// sameJSON reports whether two bodies hold the same JSON value.

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

// createResponse makes a response as the tenant of key and returns its id
// and the replica that made it.
func createResponse(t *testing.T, r *rig, key, input, prev string) (id, replica string) {
	t.Helper()
	resp := r.post("/v1/responses", respBody(input, prev, false), bearer(key)...)
	body := readAll(t, resp)
	var v struct{ ID string }
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || v.ID == "" {
		t.Fatalf("POST /v1/responses: %d %s", resp.StatusCode, body)
	}
	return v.ID, resp.Header.Get("X-Replica")
}

func (rp *responsesPool) hits() int64 {
	var n int64
	for _, b := range rp.backends {
		n += b.hits.Load()
	}
	return n
}

// Found by attack (#4): tenant B holding tenant A's response id could read,
// delete, cancel, list and continue it. Now B gets what vLLM answers for an
// id it does not know, and no replica hears of the request; A is served
// from the replica holding the response, as before.
func TestStoredResponseBelongsToItsTenant(t *testing.T) {
	pool := newResponsesPool(t, 3)
	r := newRig(t, pool.urls(), withClientKeys(teamKeys...))
	a, b := teamKeys[0].Key, teamKeys[1].Key
	id, owner := createResponse(t, r, a, "hello", "")
	calls := []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/" + id, ""},
		{http.MethodGet, "/v1/responses/" + id + "/input_items", ""},
		{http.MethodPost, "/v1/responses/" + id + "/cancel", ""},
		{http.MethodDelete, "/v1/responses/" + id, ""},
		{http.MethodPost, "/v1/responses", respBody("go on", id, false)},
		{http.MethodPost, "/v1/responses", respBody("go on", id, true)},
	}
	before := pool.hits()
	for _, c := range calls {
		resp, body := do(t, c.method, r.front.URL+c.path, c.body, bearer(b)...)
		if resp.StatusCode != http.StatusNotFound || !testkit.SameJSON(body, vllmNotFound(id)) {
			t.Errorf("tenant B: %s %s: %d %s, want 404 %s", c.method, c.path, resp.StatusCode, body, vllmNotFound(id))
		}
	}
	if n := pool.hits() - before; n != 0 {
		t.Fatalf("%d of tenant B's requests reached a replica", n)
	}
	for _, c := range calls {
		resp, body := do(t, c.method, r.front.URL+c.path, c.body, bearer(a)...)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Replica") != owner {
			t.Errorf("tenant A: %s %s: %d from %q (%s), want 200 from %s", c.method, c.path, resp.StatusCode, resp.Header.Get("X-Replica"), body, owner)
		}
	}
	// A continuation belongs to its tenant too.
	next, _ := createResponse(t, r, a, "more", id)
	if resp, body := do(t, http.MethodGet, r.front.URL+"/v1/responses/"+next, "", bearer(b)...); resp.StatusCode != http.StatusNotFound || !testkit.SameJSON(body, vllmNotFound(next)) {
		t.Fatalf("tenant B on A's continuation: %d %s", resp.StatusCode, body)
	}
	if n := pool.wrong.Load(); n != 0 {
		t.Fatalf("%d requests reached a replica without the response", n)
	}
	r.waitLoadZero()
}

// noting returns a backend that notes what note says of every request
// and answers a small JSON body, and what it noted so far.
func noting(t *testing.T, note func(*http.Request) string) (*backend, func() []string) {
	var mu sync.Mutex
	var noted []string
	b := newBackend(t, "a")
	b.set(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		noted = append(noted, note(r))
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","choices":[]}`)
	})
	return b, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), noted...)
	}
}

// Found by attack (#7): "/v1/responses/{id}" with %2F in the id reached the
// worker as GET /v1/responses/../../sim/stats, because the outbound URL
// lost the escaping. An id that no engine makes is answered as unknown and
// reaches no worker; an escaped '/' in a forwarded path stays escaped.
func TestResponseIDCannotLeaveItsPath(t *testing.T) {
	b, seen := noting(t, func(r *http.Request) string { return r.Method + " " + r.RequestURI })
	r := newRig(t, []string{b.URL}, withOptions(func(o *proxy.Options) {
		o.PassThroughPaths = append(o.PassThroughPaths, "/v1/files/*")
	}))
	for _, id := range []string{"resp_x%2F..%2F..%2Fsim%2Fstats", "..%2F..%2Fsim%2Freset", "resp_%00", "resp_a.b", "resp_%2e%2e", strings.Repeat("r", 257)} {
		for _, c := range []struct{ method, path string }{
			{http.MethodGet, "/v1/responses/" + id},
			{http.MethodDelete, "/v1/responses/" + id},
			{http.MethodGet, "/v1/responses/" + id + "/input_items"},
			{http.MethodPost, "/v1/responses/" + id + "/cancel"},
		} {
			resp, body := do(t, c.method, r.front.URL+c.path, "")
			var e struct {
				Error struct {
					Message, Type, Param string
					Code                 int
				}
			}
			if resp.StatusCode != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != 404 ||
				e.Error.Param != "response_id" || !strings.HasSuffix(e.Error.Message, "' not found.") {
				t.Errorf("%s %s: %d %s, want vLLM's 404 for an unknown id", c.method, c.path, resp.StatusCode, body)
			}
		}
	}
	if got := seen(); len(got) != 0 {
		t.Fatalf("the worker received %v", got)
	}
	if resp, body := do(t, http.MethodGet, r.front.URL+"/v1/files/a%2Fb", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("pass-through: %d %s", resp.StatusCode, body)
	}
	if got := seen(); len(got) != 1 || got[0] != "GET /v1/files/a%2Fb" {
		t.Fatalf("the worker received %v, want GET /v1/files/a%%2Fb as the client sent it", got)
	}
}

// Found by attack (#8): a client-chosen X-Request-Id reached the worker
// and the logs as CART's request id. CART's own id goes to the worker; the
// client's is logged apart, as client_request_id, printable and bounded.
func TestClientRequestIDIsNotCARTs(t *testing.T) {
	b, noted := noting(t, func(r *http.Request) string { return strings.Join(r.Header.Values("X-Request-Id"), ",") })
	rec := testkit.NewLogRecorder()
	r := newRig(t, []string{b.URL}, withOptions(func(o *proxy.Options) { o.Logger = slog.New(rec) }))
	long := "victim-request-7\xff" + strings.Repeat("x", 300)
	for _, chosen := range []string{"victim-request-7", long, ""} {
		var hdr []string
		if chosen != "" {
			hdr = []string{"X-Request-Id", chosen}
		}
		readAll(t, r.post("/v1/chat/completions", chatBody("s", "q", false), hdr...))
	}
	hexID := regexp.MustCompile(`^[0-9a-f]{24}$`)
	got := noted()
	if len(got) != 3 || !hexID.MatchString(got[0]) || !hexID.MatchString(got[1]) || !hexID.MatchString(got[2]) || got[0] == got[1] || got[1] == got[2] {
		t.Fatalf("the worker got X-Request-Id %q, want CART's own, a fresh one per request", got)
	}
	ids, clientIDs := rec.Values("route", "request_id"), rec.Values("route", "client_request_id")
	wantClient := []string{"victim-request-7", "victim-request-7?" + strings.Repeat("x", 128-len("victim-request-7?"))}
	if fmt.Sprint(ids) != fmt.Sprint(got) || fmt.Sprint(clientIDs) != fmt.Sprint(wantClient) {
		t.Fatalf("route logs: request_id %q, client_request_id %q; want %q and %q", ids, clientIDs, got, wantClient)
	}
}

// saltsSeen records the cache_salt of every body a backend receives ("-"
// when there is none) and the bodies themselves.
type saltsSeen struct {
	mu     sync.Mutex
	salts  []string
	bodies []map[string]json.RawMessage
}

func (s *saltsSeen) handler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var m map[string]json.RawMessage
		_ = json.Unmarshal(raw, &m)
		salt := "-"
		if v, ok := m["cache_salt"]; ok {
			_ = json.Unmarshal(v, &salt)
		}
		s.mu.Lock()
		s.salts = append(s.salts, salt)
		s.bodies = append(s.bodies, m)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"resp_%s_%d","object":"response","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}`, name, len(raw))
	}
}

func (s *saltsSeen) last() (string, map[string]json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.salts[len(s.salts)-1], s.bodies[len(s.bodies)-1]
}

func (s *saltsSeen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.salts)
}

// Attack #6: tenant B replaying A's prompt hit A's cached blocks (and
// cached_tokens told it so). A tenant whose key isolates its cache gets a
// cache_salt of its own, derived from its key, on every endpoint vLLM
// reads it on; a salt the client sends is mixed in, never sent as it
// came; the body is otherwise unchanged; other tenants' bodies go as sent.
func TestIsolatedTenantGetsItsOwnCacheSalt(t *testing.T) {
	var seen saltsSeen
	b := newBackend(t, "a")
	b.set(seen.handler("a"))
	keys := []proxy.ClientKey{{Name: "team-a", Key: "key-a-0123456789", IsolateCache: true}, {Name: "team-b", Key: "key-b-0123456789"}}
	r := newRig(t, []string{b.URL}, withClientKeys(keys...))
	a, bKey := keys[0].Key, keys[1].Key
	send := func(key, path, body string) (int, string) {
		t.Helper()
		resp := r.post(path, body, bearer(key)...)
		return resp.StatusCode, readAll(t, resp)
	}
	salt64 := regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`,
		"/v1/completions":      `{"model":"m","prompt":"hi","max_tokens":3}`,
		"/v1/responses":        `{"model":"m","input":"hi","store":true}`,
	}
	var tenantSalt string
	for path, body := range bodies {
		if code, out := send(a, path, body); code != http.StatusOK {
			t.Fatalf("%s: %d %s", path, code, out)
		}
		salt, got := seen.last()
		if !salt64.MatchString(salt) {
			t.Fatalf("%s: the worker got cache_salt %q, want a 43-character derived salt", path, salt)
		}
		if tenantSalt == "" {
			tenantSalt = salt
		} else if salt != tenantSalt {
			t.Fatalf("%s: salt %q, want the tenant's one salt %q on every endpoint", path, salt, tenantSalt)
		}
		var sent map[string]json.RawMessage
		_ = json.Unmarshal([]byte(body), &sent)
		delete(got, "cache_salt")
		if fmt.Sprint(got) != fmt.Sprint(sent) {
			t.Fatalf("%s: the body changed beyond cache_salt: %v, sent %v", path, got, sent)
		}
	}
	// The client's own salt splits the tenant's cache further and never
	// goes out as it came: B cannot reach A's blocks by sending A's salt.
	if code, out := send(a, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"mine"}`); code != http.StatusOK {
		t.Fatalf("%d %s", code, out)
	}
	if salt, _ := seen.last(); !salt64.MatchString(salt) || salt == tenantSalt || salt == "mine" {
		t.Fatalf("with the client's salt: %q, want a derived salt other than %q", salt, tenantSalt)
	}
	for _, body := range []string{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"` + tenantSalt + `"}`} {
		if code, out := send(bKey, "/v1/chat/completions", body); code != http.StatusOK {
			t.Fatalf("%d %s", code, out)
		}
		var sent map[string]json.RawMessage
		_ = json.Unmarshal([]byte(body), &sent)
		want := "-"
		if v, ok := sent["cache_salt"]; ok {
			_ = json.Unmarshal(v, &want)
		}
		if salt, _ := seen.last(); salt != want {
			t.Fatalf("tenant B (not isolated): the worker got cache_salt %q, want %q as sent", salt, want)
		}
	}
	// vLLM ignores cache_salt on /v1/messages: refused, in Anthropic's
	// shape, rather than sent unisolated.
	n := seen.count()
	code, out := send(a, "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`)
	var ae struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if code != http.StatusBadRequest || json.Unmarshal([]byte(out), &ae) != nil || ae.Type != "error" || ae.Error.Type != "invalid_request_error" ||
		!strings.Contains(ae.Error.Message, "isolate_cache") {
		t.Fatalf("isolated tenant on /v1/messages: %d %s, want an Anthropic-shaped 400 naming isolate_cache", code, out)
	}
	if seen.count() != n {
		t.Fatal("the refused /v1/messages request reached the worker")
	}
	if code, out := send(bKey, "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`); code != http.StatusOK {
		t.Fatalf("tenant B on /v1/messages: %d %s", code, out)
	}
}

// The index is seeded with the isolated tenant's salt too: another tenant's
// request with the same prompt finds none of its blocks, so it is not sent
// to the replica that holds them for the cache's sake.
func TestIsolatedTenantSharesNoPrefixInTheIndex(t *testing.T) {
	var seen saltsSeen
	a, b := newBackend(t, "a"), newBackend(t, "b")
	a.set(seen.handler("a"))
	b.set(seen.handler("b"))
	keys := []proxy.ClientKey{{Name: "team-a", Key: "key-a-0123456789", IsolateCache: true}, {Name: "team-b", Key: "key-b-0123456789"}, {Name: "team-c", Key: "key-c-0123456789"}}
	rec := testkit.NewLogRecorder()
	r := newRig(t, []string{a.URL, b.URL}, withClientKeys(keys...), withOptions(func(o *proxy.Options) { o.Logger = slog.New(rec) }),
		func(_ *proxy.Options, p *engine.Policy, _ []engine.WorkerSpec) { p.MatchAbsThreshold = 0 })
	prompt := longText("a system prompt the tenants share", 4000)
	reason := func(key string) string {
		t.Helper()
		resp := r.post("/v1/chat/completions", chatBody(prompt, "q", false), bearer(key)...)
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		rs := rec.Values("route", "reason")
		return rs[len(rs)-1]
	}
	if got := reason(keys[0].Key); got != "cache_miss" {
		t.Fatalf("first request: %s", got)
	}
	if got := reason(keys[0].Key); got != "cache_hit" {
		t.Fatalf("team-a again: %s, want its own blocks hit", got)
	}
	if got := reason(keys[1].Key); got != "cache_miss" {
		t.Fatalf("team-b with team-a's prompt: %s, want a miss (team-a is isolated)", got)
	}
	if got := reason(keys[2].Key); got != "cache_hit" {
		t.Fatalf("team-c with team-b's prompt: %s, want a hit (neither is isolated)", got)
	}
	r.waitLoadZero()
}
