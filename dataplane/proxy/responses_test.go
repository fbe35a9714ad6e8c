package proxy_test

import (
	"encoding/json"
	"fmt"
	"github.com/cartrouter/cart/controlplane/decider"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
)

// responsesPool is a pool of fake replicas that, like vLLM, keep the
// responses they made: each answers a previous_response_id or a stored
// response call for an id of its own, and 404s any other.
type responsesPool struct {
	backends []*backend
	made     atomic.Int64
	wrong    atomic.Int64 // requests for an id a replica never made
}

func newResponsesPool(t *testing.T, n int) *responsesPool {
	t.Helper()
	rp := &responsesPool{}
	for i := range n {
		b := newBackend(t, fmt.Sprint("b", i))
		name := b.name
		owns := func(id string) bool { return strings.HasPrefix(id, "resp_"+name+"_") }
		b.set(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Replica", name)
			if id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
				id, _, _ = strings.Cut(id, "/")
				if !owns(id) {
					rp.wrong.Add(1)
					http.Error(w, `{"error":{"message":"not found","type":"invalid_request_error","code":"not_found"}}`, http.StatusNotFound)
					return
				}
				fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed"}`, id)
				return
			}
			var req struct {
				Prev   string `json:"previous_response_id"`
				Stream bool   `json:"stream"`
			}
			_ = json.Unmarshal(body, &req)
			if req.Prev != "" && !owns(req.Prev) {
				rp.wrong.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","code":"not_found"}}`, req.Prev)
				return
			}
			id := fmt.Sprintf("resp_%s_%d", name, rp.made.Add(1))
			if req.Stream {
				w.Header().Set("Content-Type", "text/event-stream")
				// The id arrives split over two writes, as it may on the wire.
				fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"%s", id[:7])
				w.(http.Flusher).Flush()
				fmt.Fprintf(w, "%s\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n", id[7:])
				fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"%s\",\"status\":\"completed\"}}\n\n", id)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}`, id)
		})
		rp.backends = append(rp.backends, b)
	}
	return rp
}

func (rp *responsesPool) urls() []string {
	var u []string
	for _, b := range rp.backends {
		u = append(u, b.URL)
	}
	return u
}

func respBody(input, prev string, stream bool) string {
	m := map[string]any{"model": "m", "input": input, "stream": stream}
	if prev != "" {
		m["previous_response_id"] = prev
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// newResponse creates a response and returns its id and the replica that
// made it.
func (r *rig) newResponse(t *testing.T, input, prev string, stream bool) (id, replica string) {
	t.Helper()
	resp := r.post("/v1/responses", respBody(input, prev, stream))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/responses: %d %s", resp.StatusCode, body)
	}
	replica = resp.Header.Get("X-Replica")
	if stream {
		_, rest, _ := strings.Cut(body, `"response":{"id":"`)
		id, _, _ = strings.Cut(rest, `"`)
	} else {
		var v struct{ ID string }
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		id = v.ID
	}
	if id == "" {
		t.Fatalf("no id in %s", body)
	}
	return id, replica
}

// decoyPrompt warms the prefix index with a long prompt on a replica
// other than avoid and returns it: a request with that prompt as input
// would be routed there by prefix.
func (r *rig) decoyPrompt(t *testing.T, avoid string) string {
	t.Helper()
	for i := range 20 {
		p := longText(fmt.Sprint("decoy", i), 4000)
		resp := r.post("/v1/responses", respBody(p, "", false))
		got := resp.Header.Get("X-Replica")
		readAll(t, resp)
		if got != avoid {
			return p
		}
	}
	t.Fatalf("every decoy landed on %s", avoid)
	return ""
}

// A chain of previous_response_id requests stays on the replica that made
// the first response, streamed or not, even when the prefix index points
// elsewhere.
func TestResponsesChainPinned(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			pool := newResponsesPool(t, 3)
			r := newRig(t, pool.urls())
			id, owner := r.newResponse(t, "hello", "", stream)
			for turn := range 3 {
				decoy := r.decoyPrompt(t, owner)
				next, replica := r.newResponse(t, decoy, id, stream)
				if replica != owner {
					t.Fatalf("turn %d went to %s, want %s", turn, replica, owner)
				}
				id = next
			}
			if n := pool.wrong.Load(); n != 0 {
				t.Fatalf("%d requests reached a replica without the response", n)
			}
			r.waitLoadZero()
		})
	}
}

// GET, DELETE, input_items and cancel on a stored response reach the
// replica that made it.
func TestStoredResponseCallsPinned(t *testing.T) {
	pool := newResponsesPool(t, 3)
	r := newRig(t, pool.urls())
	owners := map[string]string{}
	for i := range 6 {
		id, owner := r.newResponse(t, longText(fmt.Sprint("q", i), 300), "", false)
		owners[id] = owner
	}
	for id, owner := range owners {
		for _, c := range []struct{ method, path string }{
			{http.MethodGet, "/v1/responses/" + id},
			{http.MethodGet, "/v1/responses/" + id + "/input_items"},
			{http.MethodPost, "/v1/responses/" + id + "/cancel"},
			{http.MethodDelete, "/v1/responses/" + id},
		} {
			req, _ := http.NewRequest(c.method, r.front.URL+c.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Replica") != owner {
				t.Fatalf("%s %s: %d from %s (%s), want 200 from %s", c.method, c.path, resp.StatusCode, resp.Header.Get("X-Replica"), body, owner)
			}
		}
	}
	if n := pool.wrong.Load(); n != 0 {
		t.Fatalf("%d calls reached a replica without the response", n)
	}
}

// An id this router never saw produced is routed like any request.
func TestUnknownPreviousResponseRoutedNormally(t *testing.T) {
	pool := newResponsesPool(t, 1)
	r := newRig(t, pool.urls())
	resp := r.post("/v1/responses", respBody("x", "resp_b0_999", false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// A response whose replica left the pool is reported, not sent elsewhere.
func TestPreviousResponseOnRemovedReplica(t *testing.T) {
	pool := newResponsesPool(t, 2)
	r := newRig(t, pool.urls())
	id, owner := r.newResponse(t, "hello", "", false)
	var keep []engine.WorkerSpec
	for _, b := range pool.backends {
		if b.name != owner {
			keep = append(keep, engine.WorkerSpec{URL: b.URL})
		}
	}
	r.router.SetWorkers(keep)
	before := pool.backends[0].hits.Load() + pool.backends[1].hits.Load()
	resp := r.post("/v1/responses", respBody("more", id, false))
	body := readAll(t, resp)
	var e struct {
		Error struct{ Type, Code, Param, Message string }
	}
	_ = json.Unmarshal([]byte(body), &e)
	if resp.StatusCode != http.StatusNotFound || e.Error.Code != "previous_response_not_found" || e.Error.Param != "previous_response_id" ||
		e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, id) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, err := http.Get(r.front.URL + "/v1/responses/" + id)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "previous_response_not_found") {
		t.Fatalf("GET: %d %s", resp.StatusCode, body)
	}
	if after := pool.backends[0].hits.Load() + pool.backends[1].hits.Load(); after != before {
		t.Fatalf("%d requests were sent to a replica anyway", after-before)
	}
}

// A pinned request never moves: the replica's own failure reaches the
// client after its retries there, and a replica at max_load gives 503
// (flow control off; with it on, the request waits for its replica:
// TestPinnedRequestWaitsForItsReplica).
func TestPinnedRequestNeverMoves(t *testing.T) {
	pool := newResponsesPool(t, 3)
	r := newFlowRig(t, pool.urls(), decider.FlowOptions{Off: true}, func(_ *proxy.Options, _ *engine.Policy, specs []engine.WorkerSpec) {
		for i := range specs {
			specs[i].MaxLoad = 1
		}
	})
	id, owner := r.newResponse(t, "hello", "", false)
	var ob *backend
	for _, b := range pool.backends {
		if b.name == owner {
			ob = b
		}
	}
	others := func() int64 {
		n := int64(0)
		for _, b := range pool.backends {
			if b != ob {
				n += b.hits.Load()
			}
		}
		return n
	}
	before := others()

	// Failing: 503 from the owner; no retry elsewhere.
	prev := ob.handler
	ob.set(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
	})
	resp := r.post("/v1/responses", respBody("more", id, false))
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("failing owner: %d %s", resp.StatusCode, body)
	}

	// At max_load: a request hangs on the owner, the pinned one gets 503.
	entered, release := ob.holdThen(prev, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp := r.post("/v1/responses", respBody("held", id, false))
		readAll(t, resp)
	}()
	<-entered
	resp = r.post("/v1/responses", respBody("more", id, false))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "response_replica_unavailable") {
		t.Fatalf("owner at max load: %d %s", resp.StatusCode, body)
	}
	close(release)
	<-done
	if n := others() - before; n != 0 {
		t.Fatalf("%d pinned requests moved to another replica", n)
	}
	r.waitLoadZero()
}

// Responses bodies get the remote-media policy and the key checks of every
// routed endpoint.
func TestResponsesMediaPolicy(t *testing.T) {
	pool := newResponsesPool(t, 1)
	r := newRig(t, pool.urls(), withOptions(func(o *proxy.Options) { o.RemoteMediaPolicy = http.StatusBadRequest }))
	for _, body := range []string{
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://169.254.169.254/x"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_url":"http://x/a.pdf"}]}]}`,
		`{"model":"m","input":"x","Input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]}`,
	} {
		resp := r.post("/v1/responses", body)
		if b := readAll(t, resp); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	if n := pool.backends[0].hits.Load(); n != 0 {
		t.Fatalf("%d refused bodies reached the replica", n)
	}
}

// The affinity table forgets ids after the TTL.
func TestResponseAffinityExpires(t *testing.T) {
	pool := newResponsesPool(t, 3)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	r := newRig(t, pool.urls(), withOptions(func(o *proxy.Options) {
		o.ResponseAffinityTTL = time.Minute
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
	}))
	id, owner := r.newResponse(t, "hello", "", false)
	now.Add(int64(2 * time.Minute))
	// Forgotten: routed by prefix, to the decoy's replica.
	decoy := r.decoyPrompt(t, owner)
	resp := r.post("/v1/responses", respBody(decoy, id, false))
	readAll(t, resp)
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Replica") == owner {
		t.Fatalf("expired id still pinned: %d from %s", resp.StatusCode, resp.Header.Get("X-Replica"))
	}
}

// The id sniffer does not hold the stream back: the client reads the
// response.created event while the replica is still generating, and a
// continuation sent right then is already pinned.
func TestResponsesStreamUnbuffered(t *testing.T) {
	pool := newResponsesPool(t, 2)
	r := newRig(t, pool.urls())
	gate := make(chan struct{})
	for _, b := range pool.backends {
		prev := b.handler
		b.set(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path != "/v1/responses" || strings.Contains(req.Header.Get("X-Test"), "follow") {
				prev(w, req)
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Replica", b.name)
			fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_%s_live\",\"status\":\"in_progress\"}}\n\n", b.name)
			w.(http.Flusher).Flush()
			select {
			case <-gate:
			case <-req.Context().Done():
			}
			fmt.Fprint(w, "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n")
		})
	}
	resp := r.post("/v1/responses", respBody("hello", "", true))
	defer resp.Body.Close()
	owner := resp.Header.Get("X-Replica")
	buf := make([]byte, 4096)
	var got []byte
	for !strings.Contains(string(got), "\n\n") {
		n, err := resp.Body.Read(buf)
		if err != nil {
			t.Fatalf("stream ended before its first event: %v (%q)", err, got)
		}
		got = append(got, buf[:n]...)
	}
	id := "resp_" + owner + "_live"
	if !strings.Contains(string(got), id) {
		t.Fatalf("first event %q", got)
	}
	// The first response is still streaming; its id is already known.
	for range 3 {
		follow := r.post("/v1/responses", respBody(longText("other", 2000), id, false), "X-Test", "follow")
		body := readAll(t, follow)
		if follow.StatusCode != http.StatusOK || follow.Header.Get("X-Replica") != owner {
			t.Fatalf("continuation during the stream: %d from %s (%s), want 200 from %s", follow.StatusCode, follow.Header.Get("X-Replica"), body, owner)
		}
	}
	close(gate)
	readAll(t, resp)
}
