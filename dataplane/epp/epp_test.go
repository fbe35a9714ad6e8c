package epp_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/epp"
	"github.com/cartrouter/cart/dataplane/epp/epptest"
	"github.com/cartrouter/cart/sim"
)

// The official OpenAI client through a gateway that asks the picker:
// requests sharing a prefix go to one replica and find it cached, a
// stream arrives chunk by chunk with its usage, and every decision's load
// is released when its response ends.
func TestOpenAIClientThroughTheGateway(t *testing.T) {
	p := startPicker(t, 3, nil)
	exchanges := make(chan epptest.Exchange, 8)
	base := p.gateway(t, &epptest.Gateway{Observe: func(ex epptest.Exchange) { exchanges <- ex }})
	client := openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	system := strings.Repeat("You are the CART picker test assistant; answer briefly. ", 40)
	ctx := context.Background()
	var replicas []string
	for i, q := range []string{"What is a prefix cache?", "Why route by prefix?", "What is TTFT?"} {
		var raw *http.Response
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "sim",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage(q)},
		}, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if i > 0 && resp.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Errorf("request %d: the shared system prompt was not cached (replicas so far %v)", i, replicas)
		}
		replicas = append(replicas, raw.Header.Get(sim.HeaderReplica))
		if ex := <-exchanges; ex.Err != nil || !ex.ClearRouteCache || ex.Served != p.endpoint(t, indexOf(t, p, replicas[i])) {
			t.Fatalf("request %d: exchange %+v: want no error, the route cache cleared, served by the replica that answered", i, ex)
		}
	}
	if replicas[1] != replicas[0] || replicas[2] != replicas[0] {
		t.Fatalf("same-prefix requests spread over replicas: %v", replicas)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "sim",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage("stream it")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	chunks, cached := 0, int64(0)
	for stream.Next() {
		chunks++
		if u := stream.Current().Usage; u.PromptTokens > 0 {
			cached = u.PromptTokensDetails.CachedTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 3 || cached == 0 {
		t.Fatalf("stream: %d chunks, %d cached tokens; want several chunks and a cache hit", chunks, cached)
	}
	// The client may hang up once it has read [DONE], before the
	// worker's stream ends: the gateway then resets the stream (a 499,
	// as the proxy counts it).
	<-exchanges
	p.waitIdle(t)
	if got := p.metric(t, `cart_requests_total{endpoint="chat_completions",status="2xx",tenant="anonymous",worker="`+p.Sims[indexOf(t, p, replicas[0])].URL+`"}`); got < 3 {
		t.Errorf("cart_requests_total 2xx on the chosen replica = %v, want at least 3", got)
	}
}

func indexOf(t *testing.T, p *picker, name string) int {
	t.Helper()
	for i := range p.Sims {
		if fmt.Sprint("sim-", i) == name {
			return i
		}
	}
	t.Fatalf("no replica named %q", name)
	return -1
}

// One stream message by message, as Envoy sends it: headers, the body in
// three chunks without waiting, then the answer in order (headers
// response with the destination in the header and the metadata, the body
// back in chunks, the last one ending the stream); the response phase's
// chunks come back one for one, and the load goes at its end.
func TestMessageOrderAndChunks(t *testing.T) {
	p := startPicker(t, 2, nil)
	body := chatBody(strings.Repeat("system prompt ", 20000), "question") // ~280 KB: five chunks back
	s := p.open(t)
	send(t, s, epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", jsonHeaders(len(body)), false))
	third := len(body) / 3
	send(t, s, epptest.RequestBody(body[:third], false), epptest.RequestBody(body[third:2*third], false), epptest.RequestBody(body[2*third:], true))

	hr := recv(t, s)
	if hr.GetRequestHeaders() == nil {
		t.Fatalf("first answer %T, want the request headers response", hr.GetResponse())
	}
	dest, md := epptest.Destination(hr)
	if dest == "" || dest != md {
		t.Fatalf("destination header %q, metadata %q: want one endpoint, equal", dest, md)
	}
	if !hr.GetRequestHeaders().GetResponse().GetClearRouteCache() {
		t.Error("ClearRouteCache not set")
	}
	worker := -1
	for i := range p.Sims {
		if p.endpoint(t, i) == dest {
			worker = i
		}
	}
	if worker < 0 {
		t.Fatalf("destination %q is no replica", dest)
	}
	h := http.Header{}
	epptest.ApplyMutation(h, hr.GetRequestHeaders().GetResponse().GetHeaderMutation())
	if h.Get("Content-Length") != strings.TrimSpace(jsonHeaders(len(body)).Get("Content-Length")) || h.Get("X-Request-Id") == "" {
		t.Errorf("header mutation %v: want the body's content-length and CART's request id", h)
	}
	var got []byte
	for {
		m := recv(t, s)
		b, eos, err := epptest.StreamedBody(m.GetRequestBody().GetResponse())
		if err != nil {
			t.Fatalf("body answer %T: %v", m.GetResponse(), err)
		}
		if len(b) > epp.MaxChunk {
			t.Errorf("a body chunk of %d bytes, over %d", len(b), epp.MaxChunk)
		}
		got = append(got, b...)
		if eos {
			break
		}
	}
	if !bytes.Equal(got, body) {
		t.Fatalf("body sent back: %d bytes, want the %d sent (unchanged)", len(got), len(body))
	}
	if p.load(worker) != 1 {
		t.Fatalf("load on the chosen replica %d, want 1 while the request runs", p.load(worker))
	}
	send(t, s, epptest.ResponseHeaders(200, http.Header{"Content-Type": {"text/event-stream"}}, false, dest))
	if m := recv(t, s); m.GetResponseHeaders() == nil {
		t.Fatalf("answer %T, want the response headers response", m.GetResponse())
	}
	for i, c := range []string{"data: {\"choices\":[]}\n\n", `data: {"usage":{"prompt_tokens":70000,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":0}}}` + "\n\n", "data: [DONE]\n\n"} {
		send(t, s, epptest.ResponseBody([]byte(c), i == 2, dest))
		b, eos, err := epptest.StreamedBody(recv(t, s).GetResponseBody().GetResponse())
		if err != nil || string(b) != c || eos != (i == 2) {
			t.Fatalf("chunk %d came back as %q (eos %v, %v), want it as sent", i, b, eos, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	p.waitIdle(t)
}

// gRPC health answers for liveness, readiness and the ext_proc service.
func TestHealth(t *testing.T) {
	p := startPicker(t, 1, nil)
	hc := healthpb.NewHealthClient(p.Conn)
	for _, name := range []string{"liveness", "readiness", epp.ServiceName} {
		var st healthpb.HealthCheckResponse_ServingStatus
		for range 100 {
			r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if st = r.GetStatus(); st == healthpb.HealthCheckResponse_SERVING {
				break
			}
			waitABit()
		}
		if st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: %v, want SERVING", name, st)
		}
	}
	// The same over HTTP on the metrics listener, for the kubelet.
	for _, path := range []string{"/livez", "/readyz"} {
		resp, err := http.Get(p.Metrics + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, resp.StatusCode)
		}
	}
}

// A picker that knows no worker yet is not ready (a gateway that fails
// open routes on its own meanwhile) and answers 503 to a request.
func TestNotReadyWithoutWorkers(t *testing.T) {
	p := startPicker(t, 0, func(c *config.Config) {
		c.Discovery.DNS.Name, c.Discovery.DNS.Port, c.Discovery.DNS.Resolver = "nothing.invalid", 8000, "127.0.0.1:1"
	})
	hc := healthpb.NewHealthClient(p.Conn)
	for _, name := range []string{"readiness", epp.ServiceName} {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%s: %v %v, want NOT_SERVING", name, r.GetStatus(), err)
		}
	}
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("liveness: %v %v, want SERVING", r.GetStatus(), err)
	}
	resp, err := http.Get(p.Metrics + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz: %d, want 503", resp.StatusCode)
	}
	s := p.open(t)
	send(t, s, epptest.RequestHeaders("POST", "/v1/chat/completions", "gw", jsonHeaders(len(chatBody("s", "q"))), false), epptest.RequestBody(chatBody("s", "q"), true))
	if m := recv(t, s); m.GetImmediateResponse().GetStatus().GetCode() != http.StatusServiceUnavailable {
		t.Errorf("a request with no worker: %v, want a 503 ImmediateResponse", m)
	}
}
