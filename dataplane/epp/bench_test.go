package epp

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// exchange is one request's messages as Envoy sends them: headers, the
// body in one chunk, the response's headers and body.
func exchange(body []byte) []*extprocv3.ProcessingRequest {
	return []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions", ":authority", "gw", "content-type", "application/json",
				"content-length", fmt.Sprint(len(body)), "user-agent", "bench", "x-request-id", "r1")}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200", "content-type", "application/json")}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: []byte(`{"id":"c1","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":130,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":112}}}`), EndOfStream: true}}},
	}
}

// benchBodies are 64 chat requests sharing a system prompt.
func benchBodies() [][]byte {
	out := make([][]byte, 64)
	for i := range out {
		out[i] = []byte(fmt.Sprintf(`{"model":"m","max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
			strings.Repeat("shared system prompt ", 25), i))
	}
	return out
}

// BenchmarkProcess is the picker's own work per request (the proxy's
// handler included), without gRPC: one exchange replayed through Process.
func BenchmarkProcess(b *testing.B) {
	s, _ := fuzzServer(b)
	bodies := benchBodies()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		st := &replay{ctx: context.Background(), in: exchange(bodies[i%len(bodies)]), wait: []int{0, 0, 2, 3}, sent: make(chan struct{}, 1)}
		if err := s.Process(st); err != nil {
			b.Fatal(err)
		}
		if len(st.out) != 4 {
			b.Fatalf("%d answers", len(st.out))
		}
		i++
	}
}

// BenchmarkGRPCExchange is a whole exchange over a real gRPC connection
// (h2c on loopback), the gateway's side included: what a request costs on
// the picker path end to end on one machine.
func BenchmarkGRPCExchange(b *testing.B) {
	s, _ := fuzzServer(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(g, s)
	go func() { _ = g.Serve(ln) }()
	defer func() { g.Stop(); s.Wait() }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	bodies := benchBodies()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		msgs := exchange(bodies[i%len(bodies)])
		i++
		ctx, cancel := context.WithCancel(context.Background())
		c, err := client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs[:2] {
			if err := c.Send(m); err != nil {
				b.Fatal(err)
			}
		}
		for range 2 {
			if _, err := c.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		for _, m := range msgs[2:] {
			if err := c.Send(m); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		_ = c.CloseSend()
		if _, err := c.Recv(); err == nil {
			b.Fatal("stream not ended after the response")
		}
		cancel()
	}
}
