package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/epp"
	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/internal/testkit"
)

// request sends a whole request (headers, then the body in two chunks)
// and returns the picker's first answer.
func request(t *testing.T, s *epptest.Stream, h http.Header, body []byte, first func(*extprocv3.ProcessingRequest)) *extprocv3.ProcessingResponse {
	t.Helper()
	hs := jsonHeaders(len(body))
	for k, vv := range h {
		hs[k] = vv
	}
	m := epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", hs, false)
	if first != nil {
		first(m)
	}
	half := len(body) / 2
	send(t, s, m, epptest.RequestBody(body[:half], false), epptest.RequestBody(body[half:], true))
	return recv(t, s)
}

// drainBody reads the body answers up to the one ending the stream.
func drainBody(t *testing.T, s *epptest.Stream) []byte {
	t.Helper()
	var out []byte
	for {
		b, eos, err := epptest.StreamedBody(recv(t, s).GetRequestBody().GetResponse())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
		if eos {
			return out
		}
	}
}

func immediateStatus(t *testing.T, m *extprocv3.ProcessingResponse) (int, http.Header, string) {
	t.Helper()
	ir := m.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("answer %T, want an ImmediateResponse", m.GetResponse())
	}
	h := http.Header{}
	epptest.ApplyMutation(h, ir.GetHeaders())
	return int(ir.GetStatus().GetCode()), h, string(ir.GetBody())
}

// The subset hint restricts the answer to the endpoints it lists; an
// empty one, or one naming no worker, is answered 503 (the protocol's
// rule), with the proxy's JSON error body.
func TestSubsetHint(t *testing.T) {
	p := startPicker(t, 3, nil)
	for i := range 3 {
		s := p.open(t)
		m := request(t, s, nil, chatBody("same system prompt for every request", "q"), func(m *extprocv3.ProcessingRequest) {
			m.MetadataContext = epptest.Subset(p.endpoint(t, i))
		})
		if dest, _ := epptest.Destination(m); dest != p.endpoint(t, i) {
			t.Fatalf("subset {%s}: answer %q", p.endpoint(t, i), dest)
		}
		drainBody(t, s)
		s.Reset()
	}
	for name, sub := range map[string][]string{"empty": {}, "unknown endpoint": {"10.255.255.1:9"}, "malformed": {"not an address"}} {
		s := p.open(t)
		m := request(t, s, nil, chatBody("s", "q"), func(m *extprocv3.ProcessingRequest) { m.MetadataContext = epptest.Subset(sub...) })
		code, h, body := immediateStatus(t, m)
		if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "no_worker_available") {
			t.Errorf("%s subset: %d %v %s, want 503 no_worker_available with Retry-After", name, code, h, body)
		}
	}
	p.waitIdle(t)
	if got := p.metric(t, `cart_epp_immediate_responses_total{status="503"}`); got != 3 {
		t.Errorf("immediate 503s counted %v, want 3", got)
	}
}

// A sheddable request (its key's priority below 0) finds the pool
// saturated: flow control refuses it at once, and the gateway gets 429
// with Retry-After, in the proxy's error shape.
func TestShedRequestIs429(t *testing.T) {
	p := startPicker(t, 1, func(c *config.Config) {
		c.Workers[0].MaxLoad = 1
		c.Auth.ClientKeys = []config.ClientKey{{Name: "batch", Key: "k-batch", Priority: -1}, {Name: "chat", Key: "k-chat"}}
	})
	held := p.open(t)
	if m := request(t, held, http.Header{"Authorization": {"Bearer k-chat"}}, chatBody("s", "holds the only slot"), nil); m.GetRequestHeaders() == nil {
		t.Fatalf("first request: %T, want an answer", m.GetResponse())
	}
	drainBody(t, held)
	shed := p.open(t)
	code, h, body := immediateStatus(t, request(t, shed, http.Header{"X-Api-Key": {"k-batch"}}, chatBody("s", "sheddable"), nil))
	if code != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(body, "request_shed") {
		t.Fatalf("sheddable request on a saturated pool: %d %v %s, want 429 request_shed with Retry-After", code, h, body)
	}
	held.Reset()
	p.waitIdle(t)
}

// Client keys are checked as the proxy checks them (401 with
// WWW-Authenticate), and credentials are never forwarded: the client's
// are removed, the worker's own key (api_key_file) is set instead.
func TestCredentials(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "worker.key")
	if err := os.WriteFile(keyFile, []byte("worker-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startPicker(t, 1, func(c *config.Config) {
		c.Auth.ClientKeys = []config.ClientKey{{Name: "team", Key: "k-team"}}
		c.Proxy.WorkerAPIKeyFile = keyFile
	})
	s := p.open(t)
	code, h, _ := immediateStatus(t, request(t, s, http.Header{"Authorization": {"Bearer wrong"}}, chatBody("s", "q"), nil))
	if code != http.StatusUnauthorized || h.Get("Www-Authenticate") == "" {
		t.Fatalf("wrong key: %d %v, want 401 with WWW-Authenticate", code, h)
	}
	s = p.open(t)
	m := request(t, s, http.Header{"X-Api-Key": {"k-team"}, "Authorization": {"Bearer k-team"}}, chatBody("s", "q"), nil)
	out := http.Header{"X-Api-Key": {"k-team"}, "Authorization": {"Bearer k-team"}}
	epptest.ApplyMutation(out, m.GetRequestHeaders().GetResponse().GetHeaderMutation())
	if out.Get("X-Api-Key") != "" || out.Get("Authorization") != "Bearer worker-secret" {
		t.Fatalf("headers to the worker %v: want the client's key gone, the worker's key set", out)
	}
	drainBody(t, s)
	s.Reset()
	p.waitIdle(t)
}

// A tenant with an isolated cache gets its cache_salt in the body the
// worker receives: the picker sends the rewritten body back, in chunks of
// at most 62,000 bytes, with its new Content-Length.
func TestRewrittenBodyGoesBack(t *testing.T) {
	p := startPicker(t, 1, func(c *config.Config) {
		c.Auth.ClientKeys = []config.ClientKey{{Name: "team", Key: "k-team", IsolateCache: true}}
	})
	body := chatBody(strings.Repeat("long system prompt ", 8000), "q") // ~150 KB
	s := p.open(t)
	m := request(t, s, http.Header{"Authorization": {"Bearer k-team"}}, body, nil)
	h := http.Header{}
	epptest.ApplyMutation(h, m.GetRequestHeaders().GetResponse().GetHeaderMutation())
	var got []byte
	chunks := 0
	for {
		b, eos, err := epptest.StreamedBody(recv(t, s).GetRequestBody().GetResponse())
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > epp.MaxChunk {
			t.Fatalf("chunk of %d bytes", len(b))
		}
		chunks++
		got = append(got, b...)
		if eos {
			break
		}
	}
	var v struct {
		CacheSalt string `json:"cache_salt"`
	}
	if err := json.Unmarshal(got, &v); err != nil || v.CacheSalt == "" {
		t.Fatalf("body sent back has no cache_salt (%v)", err)
	}
	if h.Get("Content-Length") != fmt.Sprint(len(got)) || bytes.Equal(got, body) || chunks < 3 {
		t.Fatalf("Content-Length %q for %d bytes in %d chunks: want the rewritten body's length", h.Get("Content-Length"), len(got), chunks)
	}
	s.Reset()
	p.waitIdle(t)
}

// Fallbacks follow the primary after commas, distinct, in the header and
// the metadata alike; a request pinned to the replica storing its
// response gets none.
func TestFallbacks(t *testing.T) {
	p := startPicker(t, 3, func(c *config.Config) { c.EPP.FallbackEndpoints = 2 })
	s := p.open(t)
	m := request(t, s, nil, chatBody("s", "q"), nil)
	dest, md := epptest.Destination(m)
	eps := strings.Split(dest, ",")
	all := []string{p.endpoint(t, 0), p.endpoint(t, 1), p.endpoint(t, 2)}
	slices.Sort(all)
	sorted := slices.Sorted(slices.Values(eps))
	if dest != md || !slices.Equal(sorted, all) {
		t.Fatalf("answer %q (metadata %q): want the three replicas, each once", dest, md)
	}
	drainBody(t, s)
	s.Reset()
	if got := p.metric(t, `cart_epp_answers_total{fallbacks="2"}`); got != 1 {
		t.Errorf("answers with 2 fallbacks: %v", got)
	}
	p.waitIdle(t)
}

// The Responses API through the gateway: the id of a stored response is
// learned from the answer's body as it passes, and a request continuing
// it is pinned to that replica, with no fallback.
func TestResponsesFollowUpIsPinned(t *testing.T) {
	p := startPicker(t, 3, func(c *config.Config) { c.EPP.FallbackEndpoints = 2 })
	exchanges := make(chan epptest.Exchange, 1)
	base := p.gateway(t, &epptest.Gateway{Observe: func(ex epptest.Exchange) { exchanges <- ex }})
	var last epptest.Exchange
	post := func(body string) map[string]any {
		t.Helper()
		defer func() { last = <-exchanges }()
		resp, err := http.Post(base+"/v1/responses", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		return v
	}
	first := post(`{"model":"sim","input":"remember this","max_output_tokens":4}`)
	origin := last.Served
	for i := range 4 {
		post(fmt.Sprintf(`{"model":"sim","input":"and then %d","previous_response_id":%q,"max_output_tokens":4}`, i, first["id"]))
		if last.Served != origin || strings.Contains(last.Destination, ",") {
			t.Fatalf("follow-up %d: answer %q served by %s, want %s alone (it stores the response)", i, last.Destination, last.Served, origin)
		}
	}
	p.waitIdle(t)
}

// Messages out of Envoy's order, or a gateway set up for another body
// mode, end the stream with InvalidArgument and are counted.
func TestProtocolErrors(t *testing.T) {
	p := startPicker(t, 1, nil)
	buffered := epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", jsonHeaders(2), false)
	buffered.ProtocolConfig.RequestBodyMode = 2 // BUFFERED
	cases := map[string][]*extprocv3.ProcessingRequest{
		"body before headers":          {epptest.RequestBody([]byte("{}"), true)},
		"buffered body mode":           {buffered},
		"response before the answer":   {epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", nil, false), epptest.ResponseHeaders(200, nil, true, "")},
		"headers twice":                {epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", nil, false), epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", nil, false)},
		"no path":                      {epptest.RequestHeaders("POST", "", "gw", nil, false)},
		"an empty message":             {{}},
		"a bad content-length":         {epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", http.Header{"Content-Length": {"-1"}}, false)},
		"body after its end":           {epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", nil, false), epptest.RequestBody(chatBody("s", "q"), true), epptest.RequestBody(nil, true)},
		"response body before headers": {epptest.ResponseBody([]byte("x"), true, "")},
		"trailers twice": {epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", nil, false), epptest.RequestBody(chatBody("s", "q"), false),
			{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
			{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}},
	}
	for name, msgs := range cases {
		s := p.open(t)
		for _, m := range msgs {
			_ = s.Send(m)
		}
		var err error
		for err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: stream ended with %v, want InvalidArgument", name, err)
		}
	}
	if got := p.metric(t, "cart_epp_protocol_errors_total"); got != float64(len(cases)) {
		t.Errorf("protocol errors counted %v, want %d", got, len(cases))
	}
	p.waitIdle(t)
}

// What the proxy answers itself reaches the client as an
// ImmediateResponse: the pool's model list, a 404 for a path outside the
// pass-through list, a 404 for a model no worker serves.
func TestAnswersOfTheProxyItself(t *testing.T) {
	p := startPicker(t, 1, nil)
	s := p.open(t)
	send(t, s, epptest.RequestHeaders("GET", "/v1/models", "gw", nil, true))
	code, _, body := immediateStatus(t, recv(t, s))
	if code != 200 || !strings.Contains(body, `"sim"`) {
		t.Errorf("GET /v1/models: %d %s", code, body)
	}
	s = p.open(t)
	send(t, s, epptest.RequestHeaders("POST", "/sim/fault", "gw", jsonHeaders(2), false), epptest.RequestBody([]byte("{}"), true))
	if code, _, body := immediateStatus(t, recv(t, s)); code != 404 || !strings.Contains(body, "unknown_url") {
		t.Errorf("POST /sim/fault: %d %s, want 404 unknown_url (never a worker's admin path)", code, body)
	}
	s = p.open(t)
	if code, _, body := immediateStatus(t, request(t, s, nil, []byte(`{"model":"other","messages":[{"role":"user","content":"x"}]}`), nil)); code != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("unknown model: %d %s, want 404 model_not_found", code, body)
	}
}

// A gateway that stalls mid-body gets the proxy's 408 body_timeout within
// proxy.body_read_timeout_secs, as a client of the proxy does; the stream is
// not held until the gateway resets it.
func TestStalledBodyTimesOut(t *testing.T) {
	p := startPicker(t, 1, func(c *config.Config) { c.Proxy.BodyReadTimeoutSecs = 1 })
	// Bounded, so that a picker that waits for the body forever fails the
	// test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := epptest.Open(ctx, p.Conn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Reset()
	body := chatBody("s", "a body whose end never comes")
	start := time.Now()
	send(t, s, epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", http.Header{"Content-Type": {"application/json"}}, false),
		epptest.RequestBody(body[:len(body)/2], false))
	code, _, msg := immediateStatus(t, recv(t, s))
	if took := time.Since(start); code != http.StatusRequestTimeout || !strings.Contains(msg, "body_timeout") || took > 5*time.Second {
		t.Fatalf("stalled body: %d %s after %v, want 408 body_timeout after about 1 s", code, msg, took)
	}
	if p.load(0) != 0 {
		t.Errorf("load %d after a refused request", p.load(0))
	}
	// A body that arrives in time is unaffected by the deadline it ran under.
	s = p.open(t)
	if dest := answered(t, s, chatBody("s", "in time")); dest != p.endpoint(t, 0) {
		t.Errorf("destination %q", dest)
	}
	s.Reset()
	p.waitIdle(t)
}

// A request with trailers: the body ends with them, and the answer keeps
// the order headers, body (its last chunk not ending the stream), then
// the trailers' response.
func TestRequestTrailers(t *testing.T) {
	p := startPicker(t, 1, nil)
	s := p.open(t)
	body := chatBody("s", "with trailers")
	send(t, s, epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", http.Header{"Content-Type": {"application/json"}}, false),
		epptest.RequestBody(body, false),
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	if m := recv(t, s); m.GetRequestHeaders() == nil {
		t.Fatalf("%T, want the headers response", m.GetResponse())
	}
	b, eos, err := epptest.StreamedBody(recv(t, s).GetRequestBody().GetResponse())
	if err != nil || eos || !bytes.Equal(b, body) {
		t.Fatalf("body answer: %d bytes, eos %v, %v: want the body, not ending the stream", len(b), eos, err)
	}
	if m := recv(t, s); m.GetRequestTrailers() == nil {
		t.Fatalf("%T, want the trailers response", m.GetResponse())
	}
	s.Reset()
	p.waitIdle(t)
}

// answered sends a request and reads its whole answer, returning the
// destination.
func answered(t *testing.T, s *epptest.Stream, body []byte) string {
	t.Helper()
	m := request(t, s, nil, body, nil)
	dest, _ := epptest.Destination(m)
	if dest == "" {
		t.Fatalf("answer %T, want a destination", m.GetResponse())
	}
	drainBody(t, s)
	return dest
}

// A client that hangs up mid-stream (Envoy resets the ext_proc stream):
// the request's load is released at once and it is counted as a 499.
func TestResetMidStreamReleasesLoad(t *testing.T) {
	p := startPicker(t, 1, nil)
	s := p.open(t)
	dest := answered(t, s, chatBody("s", "a long answer"))
	send(t, s, epptest.ResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}, false, dest))
	recv(t, s)
	send(t, s, epptest.ResponseBody([]byte("data: {\"choices\":[]}\n\n"), false, dest))
	recv(t, s)
	if p.load(0) != 1 {
		t.Fatalf("load %d mid-stream, want 1", p.load(0))
	}
	s.Reset()
	p.waitIdle(t)
	testkit.WaitForMsg(t, 10*time.Second, "the reset counted", func() (bool, string) {
		early := p.metric(t, `cart_epp_streams_ended_early_total`)
		gone := p.metric(t, `cart_requests_total{endpoint="chat_completions",status="499",tenant="anonymous",worker="`+p.Sims[0].URL+`"}`)
		return early == 1 && gone == 1, fmt.Sprintf("ended early %v, 499s %v", early, gone)
	})
}

// The gateway reports that another endpoint than the primary served the
// request (it fell back): the primary's load is released at that report,
// not at the end of the response.
func TestServedElsewhereReleasesThePrimary(t *testing.T) {
	p := startPicker(t, 2, func(c *config.Config) { c.EPP.FallbackEndpoints = 1 })
	s := p.open(t)
	dest := answered(t, s, chatBody("s", "q"))
	eps := strings.Split(dest, ",")
	if len(eps) != 2 {
		t.Fatalf("answer %q, want a primary and a fallback", dest)
	}
	primary := 0
	if p.endpoint(t, 1) == eps[0] {
		primary = 1
	}
	if p.load(primary) != 1 {
		t.Fatalf("primary's load %d, want 1", p.load(primary))
	}
	send(t, s, epptest.ResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}, false, eps[1]))
	recv(t, s)
	if p.load(primary) != 0 {
		t.Fatalf("primary's load %d after the gateway reported %s served, want 0", p.load(primary), eps[1])
	}
	send(t, s, epptest.ResponseBody([]byte("data: [DONE]\n\n"), true, eps[1]))
	recv(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	p.waitIdle(t)
	if got := p.metric(t, "cart_epp_served_elsewhere_total"); got != 1 {
		t.Errorf("served elsewhere counted %v, want 1", got)
	}
}

// A worker known by a host name cannot be an answer (a gateway dials the
// address it is given): it is left out, and a pool of only such workers
// answers 503.
func TestWorkersWithoutAnAddress(t *testing.T) {
	p := startPicker(t, 1, func(c *config.Config) {
		c.Workers[0].URL = strings.Replace(c.Workers[0].URL, "127.0.0.1", "localhost", 1)
	})
	s := p.open(t)
	code, _, body := immediateStatus(t, request(t, s, nil, chatBody("s", "q"), nil))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no_worker_available") {
		t.Fatalf("only a host-named worker: %d %s, want 503 no_worker_available", code, body)
	}
}
