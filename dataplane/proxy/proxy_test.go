package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/cartrouter/cart/controlplane/decider"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func TestSamePrefixSticksToOneReplica(t *testing.T) {
	a, b, c := newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")
	r := newRig(t, []string{a.URL, b.URL, c.URL}, withOptions(func(o *proxy.Options) {
		o.AddRoutedPeerHeader = true
	}))
	system := longText("sys", 2000)
	var peers []string
	for i := range 10 {
		resp := r.post("/v1/chat/completions", chatBody(system, fmt.Sprintf("question %d", i), false))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, readAll(t, resp))
		}
		peers = append(peers, resp.Header.Get("X-Routed-Peer"))
		readAll(t, resp)
	}
	for _, p := range peers {
		if p == "" || p != peers[0] {
			t.Fatalf("prefix-sharing requests went to different replicas: %v", peers)
		}
	}
	// A different prompt is free to go elsewhere, and is recorded there.
	r.waitLoadZero()
}

func TestOverloadMovesAffinity(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	release := make(chan struct{})
	r := newRig(t, []string{a.URL, b.URL}, func(o *proxy.Options, p *engine.Policy, _ []engine.WorkerSpec) {
		o.AddRoutedPeerHeader = true
		p.BalanceAbsThreshold, p.BalanceRelThreshold = 2, 1.5
	})
	system := longText("sys", 4000)
	resp := r.post("/v1/chat/completions", chatBody(system, "first", false))
	holder := resp.Header.Get("X-Routed-Peer")
	readAll(t, resp)
	hold := a
	if holder == b.URL {
		hold = b
	}
	// Make the holder slow so requests pile up on it.
	hold.set(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{}`)
	})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := r.post("/v1/chat/completions", chatBody(system, fmt.Sprintf("pile %d", i), false))
			readAll(t, resp)
		}()
	}
	testkit.WaitFor(t, 5*time.Second, "hold.hits.Load() >= 4", func() bool { return hold.hits.Load() >= 4 })
	// Holder has load 3, the other 0: 3-0 > 2 and 3 > 0*1.5 → overloaded.
	resp = r.post("/v1/chat/completions", chatBody(system, "overflow", false))
	got := resp.Header.Get("X-Routed-Peer")
	readAll(t, resp)
	close(release)
	wg.Wait()
	if got == holder {
		t.Fatalf("overloaded holder %s still got the request", holder)
	}
	if v := counterValue(t, r, "cart_routing_decisions_total", `reason="hit_overloaded"`); v != 1 {
		t.Fatalf("hit_overloaded decisions = %v, want 1", v)
	}
	r.waitLoadZero()
}

// With flow control off, a worker at max_load is a 503 at once, as before
// flow control.
func TestMaxLoadAnswers503WithFlowOff(t *testing.T) {
	a := newBackend(t, "a")
	release := make(chan struct{})
	a.set(func(w http.ResponseWriter, r *http.Request) { <-release; _, _ = io.WriteString(w, "{}") })
	r := newFlowRig(t, []string{a.URL}, decider.FlowOptions{Off: true}, func(_ *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) { s[0].MaxLoad = 1 })
	done := make(chan struct{})
	go func() {
		defer close(done)
		readAll(t, r.post("/v1/chat/completions", chatBody("s", "one", false)))
	}()
	testkit.WaitFor(t, 5*time.Second, "a.hits.Load() == 1", func() bool { return a.hits.Load() == 1 })
	resp := r.post("/v1/chat/completions", chatBody("s", "two", false))
	body := readAll(t, resp)
	close(release)
	<-done
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	assertOpenAIError(t, body, "max_load")
	r.waitLoadZero()
}

func TestRemoteMediaRefused(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.RemoteMediaPolicy = 403 }))
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"http://169.254.169.254/latest/meta-data"}}]}]}`
	resp := r.post("/v1/chat/completions", body)
	got := readAll(t, resp)
	if resp.StatusCode != 403 {
		t.Fatalf("status %d, want 403", resp.StatusCode)
	}
	assertOpenAIError(t, got, "remote media")
	if a.hits.Load() != 0 {
		t.Fatal("a replica saw a request carrying a remote media URL")
	}
	// Inline data is fine.
	body = `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`
	resp = r.post("/v1/chat/completions", body)
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("data: URL refused with %d", resp.StatusCode)
	}
}

func TestBadInputGetsClearErrors(t *testing.T) {
	a := newBackend(t, "a")
	r := newRig(t, []string{a.URL}, withOptions(func(o *proxy.Options) { o.MaxBodyBytes = 4096 }))
	cases := []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"malformed json", "/v1/chat/completions", `{"messages": [`, 400, ""},
		{"wrong type", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, 400, "messages"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, 400, "prompt"},
		{"anthropic bad system", "/v1/messages", `{"model":"m","max_tokens":5,"system":5,"messages":[{"role":"user","content":"x"}]}`, 400, "system"},
		{"too large", "/v1/chat/completions", chatBody(longText("x", 8000), "q", false), 413, "max_body_bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := r.post(tc.path, tc.body)
			body := readAll(t, resp)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			assertOpenAIError(t, body, tc.want)
		})
	}
	if a.hits.Load() != 0 {
		t.Fatalf("bad requests reached the replica %d times", a.hits.Load())
	}
}

func TestStreamingFirstByteBeforeReplicaFinishes(t *testing.T) {
	a := newBackend(t, "a")
	finish := make(chan struct{})
	a.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-finish
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	r := newRig(t, []string{a.URL})
	resp := r.post("/v1/chat/completions", chatBody("s", "stream please", true))
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "first") {
		t.Fatalf("first line %q", line)
	}
	// finish is still open here: the replica has not finished, yet the
	// first event arrived (a buffering proxy would block ReadString).
	if r.totalLoad() != 1 {
		t.Fatalf("load during stream = %d, want 1", r.totalLoad())
	}
	close(finish)
	_, _ = io.Copy(io.Discard, resp.Body)
	r.waitLoadZero()
}

func TestClientDisconnectMidStreamReleasesLoad(t *testing.T) {
	a := newBackend(t, "a")
	a.set(streamUntilGone(stopChan(t), "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n", 5*time.Millisecond))
	r := newRig(t, []string{a.URL})
	resp, cancel := r.streaming(t, chatBody("s", "endless", true))
	if r.totalLoad() != 1 {
		t.Fatalf("load during stream = %d, want 1", r.totalLoad())
	}
	cancel() // the client hangs up mid-stream
	resp.Body.Close()
	r.waitLoadZero()
	testkit.WaitFor(t, 5*time.Second, "cart_client_disconnects_total == 1", func() bool { return counterValue(t, r, "cart_client_disconnects_total", "") == 1 })
	// Hang-ups have their own class: filed under 4xx they would hide
	// among malformed requests, or pass for them.
	testkit.WaitFor(t, 5*time.Second, "cart_requests_total{status=499} == 1", func() bool { return counterValue(t, r, "cart_requests_total", `status="499"`) == 1 })
	if v := counterValue(t, r, "cart_requests_total", `status="4xx"`); v != 0 {
		t.Fatalf("client disconnect also counted as 4xx: %v", v)
	}
	// A hang-up is not the replica's fault.
	if st := r.breaks.State(a.URL); st.String() != "closed" {
		t.Fatalf("breaker %s after a client hang-up", st)
	}
}

func TestLoadNeverNegativeUnderConcurrency(t *testing.T) {
	backends := []*backend{newBackend(t, "a"), newBackend(t, "b"), newBackend(t, "c")}
	backends[1].set(func(w http.ResponseWriter, r *http.Request) {
		// Half the answers fail so the retry and release paths run too.
		http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
	})
	r := newRig(t, []string{backends[0].URL, backends[1].URL, backends[2].URL})
	var wg sync.WaitGroup
	stopWatch := make(chan struct{})
	var negative bool
	go func() {
		for {
			select {
			case <-stopWatch:
				return
			default:
			}
			for _, w := range r.router.Workers() {
				if w.Load < 0 {
					negative = true
				}
			}
		}
	}()
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.front.URL+"/v1/chat/completions",
				strings.NewReader(chatBody(longText("s", 300), fmt.Sprint(i%7), i%2 == 0)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			if i%5 == 0 {
				cancel() // some clients hang up early
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	close(stopWatch)
	r.waitLoadZero()
	if negative {
		t.Fatal("a load counter went negative")
	}
	if v := counterValue(t, r, "cart_load_release_underflows_total", ""); v != 0 {
		t.Fatalf("release underflows = %v: some decision was released twice", v)
	}
}

func TestHealthAndWorkersEndpoints(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	r := newRig(t, []string{a.URL, b.URL})
	resp, err := http.Get(r.front.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"healthy_workers":2`) {
		t.Fatalf("/health: %d %s", resp.StatusCode, body)
	}
	r.router.SetHealthy(a.URL, false)
	r.router.SetHealthy(b.URL, false)
	resp, _ = http.Get(r.front.URL + "/health")
	body = readAll(t, resp)
	if resp.StatusCode != 503 {
		t.Fatalf("/health with no healthy workers: %d %s", resp.StatusCode, body)
	}
	resp, _ = http.Get(r.front.URL + "/workers")
	var ws struct{ Workers []proxy.WorkerView }
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(ws.Workers) != 2 || ws.Workers[0].Healthy || ws.Workers[0].BreakerState != "closed" || ws.Workers[0].URL != a.URL {
		t.Fatalf("/workers = %+v", ws.Workers)
	}
	// With nobody healthy, a routed request gets a clear 503.
	resp = r.post("/v1/chat/completions", chatBody("s", "q", false))
	assertOpenAIError(t, readAll(t, resp), "no healthy workers")
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func assertOpenAIError(t *testing.T, body, contains string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body is not OpenAI-shaped JSON: %q: %v", body, err)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("error body lacks message/type: %s", body)
	}
	if contains != "" && !strings.Contains(strings.ToLower(e.Error.Message), strings.ToLower(contains)) {
		t.Fatalf("error message %q does not mention %q", e.Error.Message, contains)
	}
}
