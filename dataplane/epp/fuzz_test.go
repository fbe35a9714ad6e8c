package epp

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/controlplane/models"
	"github.com/cartrouter/cart/dataplane/breaker"
	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/dataplane/router"
)

// replay is a gateway's side of a stream from a list: Recv hands out the
// messages, then EOF; Send keeps the answers.
type replay struct {
	grpc.ServerStream
	ctx context.Context
	in  []*extprocv3.ProcessingRequest
	// wait, when set, holds the i-th message back until the picker has
	// sent wait[i] answers (Envoy sends the response only once the
	// request is answered); the fuzzer sends everything at once.
	wait []int

	mu   sync.Mutex
	sent chan struct{}
	out  []*extprocv3.ProcessingResponse
	next int
}

func (r *replay) Context() context.Context { return r.ctx }

func (r *replay) Send(m *extprocv3.ProcessingResponse) error {
	r.mu.Lock()
	r.out = append(r.out, m)
	r.mu.Unlock()
	if r.sent != nil {
		select {
		case r.sent <- struct{}{}:
		default:
		}
	}
	return nil
}

func (r *replay) answers() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.out)
}

func (r *replay) Recv() (*extprocv3.ProcessingRequest, error) {
	if r.next >= len(r.in) {
		return nil, io.EOF
	}
	for r.next < len(r.wait) && r.answers() < r.wait[r.next] {
		<-r.sent
	}
	m := r.in[r.next]
	r.next++
	return m, nil
}

const fuzzWorker = "http://127.0.0.1:9"

// fuzzServer is a picker over the real proxy and an in-process router with
// one worker that is never contacted (the picker forwards nothing).
func fuzzServer(t testing.TB) (*Server, *router.Local) {
	rt := router.NewLocal(router.LocalOptions{Policy: engine.Policy{Threshold: 0.5, BalanceAbsThreshold: 4, BalanceRelThreshold: 1.5, BlockChars: 64},
		MaxEntries: 1 << 12, InlineEvict: true, CleanupHour: -1, Seed: 1}, []engine.WorkerSpec{{URL: fuzzWorker}})
	reg := models.New()
	reg.SetWorkers([]models.Worker{{URL: fuzzWorker, Declared: []string{"m"}}})
	log := slog.New(slog.DiscardHandler)
	p := proxy.New(proxy.Options{Router: rt, Breakers: breaker.NewSet(breaker.Config{Enabled: true, FailureThreshold: 3, SuccessThreshold: 1, Timeout: time.Second}, nil), Logger: log, BlockChars: 64, MaxBodyBytes: 1 << 20, Models: reg,
		PassThroughPaths: []string{"/v1/embeddings"}, RetryableStatuses: []int{503}})
	return New(Options{Handler: p, Workers: rt.Workers, MaxBodyBytes: 1 << 20, Fallbacks: 1, Logger: log}), rt
}

// encode writes messages as the fuzz input: each one length-prefixed.
func encode(t testing.TB, msgs ...*extprocv3.ProcessingRequest) []byte {
	var out []byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = binary.AppendUvarint(out, uint64(len(b)))
		out = append(out, b...)
	}
	return out
}

func decode(data []byte) []*extprocv3.ProcessingRequest {
	var out []*extprocv3.ProcessingRequest
	for len(data) > 0 && len(out) < 64 {
		n, k := binary.Uvarint(data)
		if k <= 0 || n > uint64(len(data)-k) {
			break
		}
		m := &extprocv3.ProcessingRequest{}
		if proto.Unmarshal(data[k:k+int(n)], m) == nil {
			out = append(out, m)
		}
		data = data[k+int(n):]
	}
	return out
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// FuzzStream replays any sequence of gateway messages through a picker:
// it never panics or hangs, every answer is one the protocol has, and
// when the stream is over the worker holds no load (every decision was
// settled, whatever the order or the content of the messages).
func FuzzStream(f *testing.F) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	subset, _ := structpb.NewStruct(map[string]any{KeySubset: []any{"127.0.0.1:9"}})
	reqH := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json")}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{NamespaceSubset: subset}}}
	reqB := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
	respH := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", "200")}}}
	respB := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte(`{"id":"resp_1","usage":{"prompt_tokens":3,"completion_tokens":1}}`), EndOfStream: true}}}
	trailers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}
	get := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: hdrs(":method", "GET", ":path", "/v1/models"), EndOfStream: true}}}
	f.Add(encode(f, reqH, reqB, respH, respB))
	f.Add(encode(f, reqH, reqB))
	f.Add(encode(f, reqH, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body}}}, trailers, respH))
	f.Add(encode(f, get))
	f.Add(encode(f, respH, reqH))
	f.Add([]byte{})
	s, rt := fuzzServer(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		st := &replay{ctx: context.Background(), in: decode(data)}
		_ = s.Process(st)
		for _, m := range st.out {
			switch v := m.GetResponse().(type) {
			case *extprocv3.ProcessingResponse_ImmediateResponse:
				if c := v.ImmediateResponse.GetStatus().GetCode(); c < 200 || c > 599 {
					t.Fatalf("ImmediateResponse with status %d", c)
				}
			case *extprocv3.ProcessingResponse_RequestHeaders, *extprocv3.ProcessingResponse_RequestBody, *extprocv3.ProcessingResponse_RequestTrailers,
				*extprocv3.ProcessingResponse_ResponseHeaders, *extprocv3.ProcessingResponse_ResponseBody, *extprocv3.ProcessingResponse_ResponseTrailers:
			default:
				t.Fatalf("answer %T", v)
			}
		}
		if l := rt.Load(fuzzWorker); l != 0 {
			t.Fatalf("the worker holds load %d after the stream ended", l)
		}
	})
}

// FuzzEndpoint: the gateway's addresses and worker URLs parse without
// panicking, and an endpoint read back names the same address.
func FuzzEndpoint(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", "[::1]:80", "[::ffff:10.0.0.1]:8000", "http://10.0.0.1:8000", "https://[fe80::1%eth0]", "host:80", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if a, ok := parseEndpoint(s); ok {
			if b, ok := parseEndpoint(a); !ok || a != b {
				t.Fatalf("%q reads as %q, which reads as %q (%v)", s, a, b, ok)
			}
		}
		if a, ok := Endpoint(s); ok {
			if b, ok := parseEndpoint(a); !ok || a != b {
				t.Fatalf("worker %q has endpoint %q, which reads as %q", s, a, b)
			}
		}
	})
}
