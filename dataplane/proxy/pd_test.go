package proxy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/proxy"
)

// The transfer parameters fake prefill workers return, spaced oddly: the
// decode leg must get these bytes exactly.
func kvAnswer(name string) string {
	return `{"do_remote_prefill": true,  "do_remote_decode":false,"remote_engine_id":"eng-` + name + `","remote_block_ids":[3, 1,4],"remote_host":"10.9.9.9","remote_port":5600,"tp_size":1}`
}

// pdLog records what fake P/D workers received.
type pdLog struct {
	mu       sync.Mutex
	prefills []map[string]json.RawMessage // bodies the prefill workers got
	decodes  [][]byte                     // kv_transfer_params the decode workers got, raw
	headers  []http.Header                // decode workers' request headers
}

func (l *pdLog) prefillN() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.prefills) }
func (l *pdLog) decodeN() int  { l.mu.Lock(); defer l.mu.Unlock(); return len(l.decodes) }

func topMembers(t testing.TB, r *http.Request) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Errorf("a worker got a body that is not a JSON object: %q", b)
	}
	return m
}

// prefillWorker answers as vLLM's prefill instance does: a one-token
// answer with the kv_transfer_params the decode worker needs.
func prefillWorker(t testing.TB, log *pdLog, name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		m := topMembers(t, r)
		log.mu.Lock()
		log.prefills = append(log.prefills, m)
		log.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}},"kv_transfer_params":%s}`, kvAnswer(name))
	}
}

// decodeWorker records the transfer parameters it got and streams an
// answer in two events, the second only once release is closed (nil: at
// once).
func decodeWorker(t testing.TB, log *pdLog, name string, release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		m := topMembers(t, r)
		log.mu.Lock()
		log.decodes = append(log.decodes, m["kv_transfer_params"])
		log.headers = append(log.headers, r.Header.Clone())
		log.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"first from %s\"}}]}\n\n", name)
		w.(http.Flusher).Flush()
		if release != nil {
			<-release
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"second\"}}],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}
}

// splitRig is a rig over workers of the given roles (by backend), split
// requests on the chat, completions, messages and responses endpoints.
func splitRig(t *testing.T, roles map[*backend]engine.Role, order []*backend, opts ...rigOpt) *rig {
	t.Helper()
	urls := make([]string, len(order))
	for i, b := range order {
		urls[i] = b.URL
	}
	opts = append([]rigOpt{func(o *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
		for i := range s {
			s[i].Role = roles[order[i]]
		}
		o.AddRoutedPeerHeader = true
		o.Disagg.Endpoints = []extract.Endpoint{extract.ChatCompletions, extract.Completions, extract.Messages, extract.Responses}
	}}, opts...)
	return newRig(t, urls, opts...)
}

// A split request: the prefill leg gets vLLM's prefill form of the body,
// the decode leg the client's body with the prefill's kv_transfer_params,
// byte for byte, and its answer streams to the client unbuffered. Both
// workers carry load only while their leg runs. A client's own
// kv_transfer_params and X-Prefiller-Host-Port never reach a worker.
func TestSplitRequestRunsBothLegs(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	release := make(chan struct{})
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", release))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d})

	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":64,"min_tokens":3,` +
		`"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"attacker.example"},"messages":[{"role":"user","content":"` + longText("q", 400) + `"}]}`
	resp := r.post("/v1/chat/completions", body, proxy.HeaderPrefillerHostPort, "attacker.example:80")
	if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPeer) != d.URL || resp.Header.Get(proxy.HeaderRoutedPrefillPeer) != p.URL {
		t.Fatalf("status %d, routed %q / prefill %q", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), resp.Header.Get(proxy.HeaderRoutedPrefillPeer))
	}
	// The first event arrives while the decode worker still holds the
	// second: nothing is buffered.
	first := make([]byte, 64)
	n, err := io.ReadAtLeast(resp.Body, first, 10)
	if err != nil || !strings.Contains(string(first[:n]), "first from d") {
		t.Fatalf("first chunk %q, %v", first[:n], err)
	}
	if got := r.loads(); got[p.URL] != 0 || got[d.URL] != 1 {
		t.Fatalf("loads while decoding: %v (the prefill leg is over)", got)
	}
	close(release)
	rest := readAll(t, resp)
	if !strings.Contains(rest, "second") {
		t.Fatalf("rest of the stream: %q", rest)
	}
	r.waitLoadZero()

	if log.prefillN() != 1 || log.decodeN() != 1 {
		t.Fatalf("prefill legs %d, decode legs %d", log.prefillN(), log.decodeN())
	}
	pre := log.prefills[0]
	var kv map[string]any
	_ = json.Unmarshal(pre["kv_transfer_params"], &kv)
	if kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || kv["remote_host"] != nil {
		t.Errorf("prefill kv_transfer_params %s", pre["kv_transfer_params"])
	}
	for k, want := range map[string]string{"stream": "false", "max_tokens": "1", "max_completion_tokens": "1"} {
		if got := string(pre[k]); got != want {
			t.Errorf("prefill %s = %s, want %s", k, got, want)
		}
	}
	for _, k := range []string{"stream_options", "min_tokens"} {
		if _, ok := pre[k]; ok {
			t.Errorf("prefill body kept %s", k)
		}
	}
	if got := string(log.decodes[0]); got != kvAnswer("p") {
		t.Errorf("decode kv_transfer_params\n got %s\nwant %s", got, kvAnswer("p"))
	}
	if h := log.headers[0].Get(proxy.HeaderPrefillerHostPort); h != "" {
		t.Errorf("the client's X-Prefiller-Host-Port reached the decode worker: %q", h)
	}
	if v := counterValue(t, r, "cart_routing_decisions_total", `reason="pd"`); v != 1 {
		t.Errorf("pd decisions %v", v)
	}
	for _, leg := range []string{"prefill", "handoff", "decode_first_byte"} {
		if v := histCount(t, r, "cart_pd_leg_seconds", `leg="`+leg+`"`); v != 1 {
			t.Errorf("leg %s observed %v times", leg, v)
		}
	}
	// The prefill worker's usage is the one that tells its cache hits.
	if v := counterValue(t, r, "cart_cached_tokens_total", p.URL); v != 32 {
		t.Errorf("prefill worker's cached tokens %v, want 32", v)
	}
}

// Each endpoint's prefill form: its own token limit, no stream, and for
// the Responses API no stored or background response.
func TestPrefillBodyPerEndpoint(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", nil))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d})
	prompt := longText("e", 300)
	for _, c := range []struct {
		path, body string
		want       map[string]string
		absent     []string
	}{
		{"/v1/completions", `{"model":"m","prompt":"` + prompt + `","max_tokens":50,"stream":true,"stream_options":{"include_usage":true}}`,
			map[string]string{"max_tokens": "1", "stream": "false"}, []string{"stream_options", "max_completion_tokens"}},
		{"/v1/messages", `{"model":"m","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`,
			map[string]string{"max_tokens": "1", "stream": "false"}, nil},
		{"/v1/responses", `{"model":"m","input":"` + prompt + `","max_output_tokens":50,"stream":true,"background":true,"store":true}`,
			map[string]string{"max_output_tokens": "1", "stream": "false", "store": "false", "background": "false"}, []string{"max_tokens"}},
	} {
		before := log.prefillN()
		readAll(t, r.post(c.path, c.body))
		if log.prefillN() != before+1 {
			t.Fatalf("%s: no prefill leg", c.path)
		}
		pre := log.prefills[before]
		for k, want := range c.want {
			if got := string(pre[k]); got != want {
				t.Errorf("%s: prefill %s = %s, want %s", c.path, k, got, want)
			}
		}
		for _, k := range c.absent {
			if _, ok := pre[k]; ok {
				t.Errorf("%s: prefill body has %s", c.path, k)
			}
		}
		if got := string(log.decodes[len(log.decodes)-1]); got != kvAnswer("p") {
			t.Errorf("%s: decode kv %s", c.path, got)
		}
	}
	r.waitLoadZero()
}

// A prefill worker that refuses connections or answers 503 costs a retry
// on the other prefill worker, and the client sees nothing of it.
func TestPrefillFailureRetriesAnotherPrefill(t *testing.T) {
	for _, mode := range []string{"refused", "503"} {
		t.Run(mode, func(t *testing.T) {
			log := &pdLog{}
			bad, good, d := newBackend(t, "bad"), newBackend(t, "good"), newBackend(t, "d")
			good.set(prefillWorker(t, log, "good"))
			d.set(decodeWorker(t, log, "d", nil))
			r := splitRig(t, map[*backend]engine.Role{bad: engine.RolePrefill, good: engine.RolePrefill, d: engine.RoleDecode},
				[]*backend{bad, good, d}, preferOrder(10))
			if mode == "refused" {
				bad.Close()
			} else {
				bad.set(answer503("bad"))
			}
			resp := r.post("/v1/chat/completions", chatBody("s", longText("r", 300), true))
			out := readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPrefillPeer) != good.URL {
				t.Fatalf("status %d prefill peer %q: %s", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPrefillPeer), out)
			}
			if got := string(log.decodes[0]); got != kvAnswer("good") {
				t.Fatalf("decode got %s", got)
			}
			r.waitLoadZero()
		})
	}
}

// With every prefill worker gone the request goes whole to a both worker,
// without any kv_transfer_params.
func TestPrefillDownGoesWholeOnBoth(t *testing.T) {
	log := &pdLog{}
	p, d, b := newBackend(t, "p"), newBackend(t, "d"), newBackend(t, "b")
	d.set(decodeWorker(t, log, "d", nil))
	var got map[string]json.RawMessage
	b.set(func(w http.ResponseWriter, r *http.Request) {
		got = topMembers(t, r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"whole"}}]}`)
	})
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode, b: engine.RoleBoth}, []*backend{p, d, b})
	p.Close()
	resp := r.post("/v1/chat/completions", `{"model":"m","kv_transfer_params":{"do_remote_prefill":true},"messages":[{"role":"user","content":"`+longText("w", 300)+`"}]}`)
	out := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPeer) != b.URL || !strings.Contains(out, "whole") {
		t.Fatalf("status %d peer %q: %s", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), out)
	}
	if _, ok := got["kv_transfer_params"]; ok {
		t.Fatalf("the whole request kept the client's kv_transfer_params")
	}
	if v := counterValue(t, r, "cart_pd_decisions_total", `outcome="no_prefill"`); v != 1 {
		t.Fatalf("no_prefill outcomes %v", v)
	}
	r.waitLoadZero()
}

// A decode worker that refused the connection never took the KV cache:
// the decode leg goes to another decode worker with the same parameters,
// and the prompt is not computed again.
func TestDecodeRefusedRetriesDecodeWithTheSameParams(t *testing.T) {
	log := &pdLog{}
	p, dead, d := newBackend(t, "p"), newBackend(t, "dead"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", nil))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, dead: engine.RoleDecode, d: engine.RoleDecode}, []*backend{p, dead, d}, preferOrder(10))
	dead.Close()
	resp := r.post("/v1/chat/completions", chatBody("s", longText("d", 300), true))
	out := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPeer) != d.URL {
		t.Fatalf("status %d peer %q: %s", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), out)
	}
	if log.prefillN() != 1 || string(log.decodes[0]) != kvAnswer("p") {
		t.Fatalf("prefill legs %d, decode kv %s", log.prefillN(), log.decodes)
	}
	r.waitLoadZero()
}

// A decode worker that took the request and then dropped the connection
// may have pulled (and released) the KV cache: the retry computes the
// prompt again, on a new pair.
func TestDecodeDroppedAfterSendRecomputes(t *testing.T) {
	log := &pdLog{}
	p, flaky, d := newBackend(t, "p"), newBackend(t, "flaky"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", nil))
	flaky.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, flaky: engine.RoleDecode, d: engine.RoleDecode}, []*backend{p, flaky, d}, preferOrder(10))
	resp := r.post("/v1/chat/completions", chatBody("s", longText("f", 300), true))
	out := readAll(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPeer) != d.URL {
		t.Fatalf("status %d peer %q: %s", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer), out)
	}
	if log.prefillN() != 2 {
		t.Fatalf("prefill legs %d, want 2 (the first parameters may be spent)", log.prefillN())
	}
	r.waitLoadZero()
}

// A prefill answer that is not retryable (the prompt is too long) is the
// client's answer; no decode leg is sent. An answer without
// kv_transfer_params (an engine without a KV connector) is a failure of
// that prefill worker: with no other, the decode worker computes the
// request whole.
func TestPrefillAnswersThatEndTheRequest(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	d.set(decodeWorker(t, log, "d", nil))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d})
	p.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"prompt too long","type":"invalid_request_error"}}`)
	})
	resp := r.post("/v1/chat/completions", chatBody("s", longText("x", 300), true))
	if out := readAll(t, resp); resp.StatusCode != 400 || !strings.Contains(out, "prompt too long") {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	p.set(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"x"}}],"kv_transfer_params":null}`)
	})
	if log.decodeN() != 0 {
		t.Fatalf("%d decode legs sent after a 400", log.decodeN())
	}
	resp = r.post("/v1/chat/completions", chatBody("s", longText("y", 300), true))
	if out := readAll(t, resp); resp.StatusCode != 200 || log.decodeN() != 1 || log.decodes[0] != nil {
		t.Fatalf("an answer without kv_transfer_params: status %d, decode requests %d (kv %s): %s", resp.StatusCode, log.decodeN(), log.decodes, out)
	}
	if v := counterValue(t, r, "cart_pd_decisions_total", `outcome="no_prefill"`); v != 1 {
		t.Fatalf("no_prefill outcomes %v", v)
	}
	r.waitLoadZero()
}

// Sidecar mode: the request goes to the decode worker only, naming its
// prefill worker in X-Prefiller-Host-Port (the client's is replaced), and
// the prefill worker's load is released when the answer starts.
func TestSidecarModeNamesThePrefillWorker(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	release := make(chan struct{})
	d.set(decodeWorker(t, log, "d", release))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d},
		withOptions(func(o *proxy.Options) { o.Disagg.Sidecar = true }))
	resp := r.post("/v1/chat/completions", chatBody("s", longText("s", 300), true), proxy.HeaderPrefillerHostPort, "attacker.example:80")
	buf := make([]byte, 32)
	if _, err := io.ReadAtLeast(resp.Body, buf, 5); err != nil {
		t.Fatal(err)
	}
	if got := r.loads(); got[p.URL] != 0 || got[d.URL] != 1 {
		t.Fatalf("loads while decoding: %v", got)
	}
	close(release)
	readAll(t, resp)
	u, _ := url.Parse(p.URL)
	if got := log.headers[0].Get(proxy.HeaderPrefillerHostPort); got != u.Host {
		t.Fatalf("X-Prefiller-Host-Port %q, want %q", got, u.Host)
	}
	if log.prefillN() != 0 || log.decodes[0] != nil {
		t.Fatalf("CART ran a prefill leg (%d) or sent kv_transfer_params (%s) in sidecar mode", log.prefillN(), log.decodes[0])
	}
	r.waitLoadZero()
}

// Below the threshold of uncached prompt tokens a request goes whole.
func TestShortPromptGoesWhole(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", nil))
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d},
		func(_ *proxy.Options, pol *engine.Policy, _ []engine.WorkerSpec) { pol.PDThresholdTokens = 100 })
	readAll(t, r.post("/v1/chat/completions", chatBody("s", "short", true)))
	readAll(t, r.post("/v1/chat/completions", chatBody("s", longText("l", 2000), true)))
	if log.prefillN() != 1 || log.decodeN() != 2 || log.decodes[0] != nil {
		t.Fatalf("prefill legs %d, decode requests %d (first kv %s)", log.prefillN(), log.decodeN(), log.decodes[0])
	}
	if v := counterValue(t, r, "cart_pd_decisions_total", `outcome="short_prompt"`); v != 1 {
		t.Fatalf("short_prompt outcomes %v", v)
	}
	r.waitLoadZero()
}

// A pool that is not split is not touched: the body goes as it came.
func TestUnsplitPoolLeavesBodiesAlone(t *testing.T) {
	var got []byte
	b := newBackend(t, "b")
	b.set(func(w http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{}`)
	})
	r := splitRig(t, map[*backend]engine.Role{b: engine.RoleBoth}, []*backend{b})
	body := `{"model":"m", "kv_transfer_params":{"x":1},"messages":[{"role":"user","content":"hi"}]}`
	readAll(t, r.post("/v1/chat/completions", body))
	if !bytes.Equal(got, []byte(body)) {
		t.Fatalf("body changed: %s", got)
	}
}

func (r *rig) loads() map[string]int {
	out := map[string]int{}
	for _, w := range r.router.Workers() {
		out[w.URL] = w.Load
	}
	return out
}

// histCount is the sample count of a histogram's children whose labels
// contain labelSubstr.
func histCount(t *testing.T, r *rig, name, labelSubstr string) uint64 {
	t.Helper()
	mfs, err := r.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if strings.Contains(labelString(m), labelSubstr) {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// Each leg carries its own worker's key, by that worker's source: the
// pool's key only where its source is trusted, a worker's own key always.
func TestSplitLegsCarryTheirWorkersKeys(t *testing.T) {
	for _, tc := range []struct {
		name                string
		prefillOwn          bool
		wantPrefill, wantDe string
	}{
		{"discovered prefill worker, not trusted", false, "", "Bearer pool-key"},
		{"discovered prefill worker with its own key", true, "Bearer own-key", "Bearer pool-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &pdLog{}
			p, d := newBackend(t, "p"), newBackend(t, "d")
			var mu sync.Mutex
			auth := map[string][]string{}
			rec := func(name string, h http.HandlerFunc) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					mu.Lock()
					auth[name] = append(auth[name], strings.Join(r.Header["Authorization"], ","))
					mu.Unlock()
					h(w, r)
				}
			}
			p.set(rec("p", prefillWorker(t, log, "p")))
			d.set(rec("d", decodeWorker(t, log, "d", nil)))
			keys := proxy.WorkerKeys{Default: "pool-key", DefaultSources: []string{"static"}}
			if tc.prefillOwn {
				keys.PerWorker = map[string]string{p.URL: "own-key"}
			}
			r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d},
				func(o *proxy.Options, _ *engine.Policy, s []engine.WorkerSpec) {
					s[0].Source, s[1].Source = "dns", "static"
					o.WorkerKeys = keys
				})
			resp := r.post("/v1/chat/completions", chatBody(longText("k", 300), "u", true))
			if resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderRoutedPrefillPeer) != p.URL {
				t.Fatalf("status %d, prefill peer %q", resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPrefillPeer))
			}
			readAll(t, resp)
			r.waitLoadZero()
			mu.Lock()
			defer mu.Unlock()
			if got := auth["p"]; len(got) != 1 || got[0] != tc.wantPrefill {
				t.Errorf("prefill leg Authorization %q, want %q", got, tc.wantPrefill)
			}
			if got := auth["d"]; len(got) != 1 || got[0] != tc.wantDe {
				t.Errorf("decode leg Authorization %q, want %q", got, tc.wantDe)
			}
		})
	}
}

// A leg's copy of the body (here the client's kv_transfer_params stripped,
// in sidecar mode) counts in the in-flight body budget as the body does:
// one that does not fit is a 503 that reaches no worker and holds no load;
// the same request with nothing to strip, no copy, fits.
func TestLegCopiesCountInTheBodyBudget(t *testing.T) {
	log := &pdLog{}
	p, d := newBackend(t, "p"), newBackend(t, "d")
	p.set(prefillWorker(t, log, "p"))
	d.set(decodeWorker(t, log, "d", nil))
	plain := chatBody("s", longText("s", 3000), false)
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode}, []*backend{p, d},
		withOptions(func(o *proxy.Options) {
			o.Disagg.Sidecar = true
			o.MaxInflightBodyBytes = int64(len(plain)) * 3 / 2
		}))
	withKV := `{"kv_transfer_params":{"do_remote_prefill":true},` + plain[1:]
	resp := r.post("/v1/chat/completions", withKV)
	if out := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(out, "server_busy") {
		t.Fatalf("a body and its stripped copy over the budget: %d %s, want 503 server_busy", resp.StatusCode, out)
	}
	if np, nd := log.prefillN(), log.decodeN(); np != 0 || nd != 0 {
		t.Fatalf("%d prefill and %d decode requests reached a worker", np, nd)
	}
	r.waitLoadZero()
	resp = r.post("/v1/chat/completions", plain)
	if out := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("the body alone within the budget: %d %s", resp.StatusCode, out)
	}
	r.waitLoadZero()
}
