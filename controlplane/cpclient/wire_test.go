package cpclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
)

// seenAuth serves gRPC health with the Bearer interceptor installed on the
// handler too, and records the Authorization header each call arrived with
// and the one the handler's interceptor chain saw.
type seenAuth struct {
	mu      sync.Mutex
	arrived []string
}

func (s *seenAuth) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

func TestBearerSendsTheTokenFromClientsOnly(t *testing.T) {
	seen := &seenAuth{}
	// On a handler the interceptor must change nothing: the header the
	// checker's chain sees is the one the caller sent.
	var handlerSaw []string
	var mu sync.Mutex
	record := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			mu.Lock()
			handlerSaw = append(handlerSaw, req.Header().Get(HeaderAuthorization))
			mu.Unlock()
			return next(ctx, req)
		}
	})
	path, h := grpchealth.NewHandler(seen, connect.WithInterceptors(Bearer("server-side-must-not-add"), record))
	mux := http.NewServeMux()
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.mu.Lock()
		seen.arrived = append(seen.arrived, r.Header.Get(HeaderAuthorization))
		seen.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	srv := httptest.NewServer(mux) // 127.0.0.1
	defer srv.Close()

	for _, tc := range []struct{ token, want string }{{"s3cret", "Bearer s3cret"}, {"", ""}} {
		c := grpchealth.NewClient(srv.Client(), srv.URL, connect.WithInterceptors(Bearer(tc.token)))
		if _, err := c.Check(context.Background(), &grpchealth.CheckRequest{}); err != nil {
			t.Fatalf("token %q: %v", tc.token, err)
		}
		seen.mu.Lock()
		got := seen.arrived[len(seen.arrived)-1]
		seen.mu.Unlock()
		if got != tc.want {
			t.Errorf("token %q: the server received Authorization %q, want %q", tc.token, got, tc.want)
		}
		mu.Lock()
		saw := handlerSaw[len(handlerSaw)-1]
		mu.Unlock()
		if saw != tc.want {
			t.Errorf("token %q: the handler-side interceptor changed Authorization to %q, want it left as %q", tc.token, saw, tc.want)
		}
	}
	srv.Client().CloseIdleConnections()
}
