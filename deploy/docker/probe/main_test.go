package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

func probe(t *testing.T, env map[string]string, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String() + errb.String()
}

func TestHTTPCheck(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	if code, out := probe(t, nil, "http", srv.URL+"/health"); code != 0 {
		t.Fatalf("healthy endpoint: exit %d: %s", code, out)
	}
	status.Store(http.StatusServiceUnavailable)
	if code, out := probe(t, nil, "http", srv.URL+"/health"); code != 1 || !strings.Contains(out, "503") {
		t.Fatalf("503 endpoint: exit %d (want 1): %s", code, out)
	}
}

// TestGRPCCheck runs the check against connect's gRPC health handler, the
// one the control plane mounts, over cleartext HTTP/2 as the kubelet does.
func TestGRPCCheck(t *testing.T) {
	checker := grpchealth.NewStaticChecker()
	mux := http.NewServeMux()
	mux.Handle(grpchealth.NewHandler(checker))
	srv := testkit.H2CServer(mux)
	srv.Start()
	defer srv.Close()
	if code, out := probe(t, nil, "grpc", srv.URL); code != 0 {
		t.Fatalf("serving: exit %d: %s", code, out)
	}
	checker.SetStatus("", grpchealth.StatusNotServing)
	if code, out := probe(t, nil, "grpc", srv.URL); code != 1 || !strings.Contains(out, "leader") {
		t.Fatalf("not serving: exit %d (want 1): %s", code, out)
	}
}

type fakeAdmin struct {
	cartv1connect.UnimplementedAdminServiceHandler
	calls   atomic.Int32
	readyAt int32 // call number from which workers are listed
	token   string
}

func (f *fakeAdmin) ListWorkers(_ context.Context, req *connect.Request[cartv1.ListWorkersRequest]) (*connect.Response[cartv1.ListWorkersResponse], error) {
	if req.Header().Get("Authorization") != "Bearer "+f.token {
		return nil, connect.NewError(connect.CodeUnauthenticated, nil)
	}
	resp := &cartv1.ListWorkersResponse{}
	if f.calls.Add(1) >= f.readyAt {
		resp.Workers = []*cartv1.Worker{{Url: "http://w:8000"}}
	}
	return connect.NewResponse(resp), nil
}

func TestWorkersWaitsUntilListed(t *testing.T) {
	admin := &fakeAdmin{readyAt: 3, token: "s3cret"}
	mux := http.NewServeMux()
	mux.Handle(cartv1connect.NewAdminServiceHandler(admin))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Without -wait, an empty list fails at once.
	if code, out := probe(t, nil, "-token-file", tokenFile, "workers", srv.URL); code != 1 || !strings.Contains(out, "no workers") {
		t.Fatalf("single check of an empty list: exit %d (want 1): %s", code, out)
	}
	start := time.Now()
	code, out := probe(t, nil, "-wait", "10s", "-interval", "10ms", "-token-file", tokenFile, "workers", srv.URL)
	if code != 0 || !strings.Contains(out, "1 worker(s)") {
		t.Fatalf("wait: exit %d: %s", code, out)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("wait took %s", time.Since(start))
	}
	// The token may come from CARTCTL_TOKEN, as for cartctl.
	if code, out := probe(t, map[string]string{"CARTCTL_TOKEN": "s3cret"}, "workers", srv.URL); code != 0 {
		t.Fatalf("token from env: exit %d: %s", code, out)
	}
	if code, out := probe(t, map[string]string{"CARTCTL_TOKEN": "wrong"}, "workers", srv.URL); code != 1 || !strings.Contains(out, "unauthenticated") {
		t.Fatalf("wrong token: exit %d (want 1): %s", code, out)
	}
}

func TestWaitGivesUp(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	defer srv.Close()
	start := time.Now()
	code, out := probe(t, nil, "-wait", "600ms", "-interval", "50ms", "http", srv.URL)
	if code != 1 || strings.Count(out, "retrying") < 2 {
		t.Fatalf("exit %d (want 1 after retries): %s", code, out)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("gave up after %s, want about 600ms", time.Since(start))
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"http"}, {"ftp", "x"}, {"-token-file", "/nonexistent", "workers", "http://x"}} {
		if code, out := probe(t, nil, args...); code != 2 {
			t.Errorf("%q: exit %d (want 2): %s", args, code, out)
		}
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := probe(t, nil, "-token-file", empty, "workers", "http://127.0.0.1:1"); code != 2 || !strings.Contains(out, "empty") {
		t.Errorf("empty token file: exit %d (want 2): %s", code, out)
	}
}
