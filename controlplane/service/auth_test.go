package service

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

func withToken(token string) connect.ClientOption {
	return connect.WithClientOptions(connect.WithGRPC(), connect.WithInterceptors(cpclient.Bearer(token)))
}

func TestAuthTokens(t *testing.T) {
	do := func(cp *testCP, admin bool, opts ...connect.ClientOption) error {
		ctx := context.Background()
		if admin {
			_, err := cp.admin(opts...).ListWorkers(ctx, connect.NewRequest(&cartv1.ListWorkersRequest{}))
			return err
		}
		_, err := cp.router(opts...).Sync(ctx, connect.NewRequest(&cartv1.SyncRequest{DataplaneId: "dp1"}))
		return err
	}
	noToken := connect.WithGRPC()
	cases := []struct {
		name  string
		auth  AuthOptions
		admin bool
		opt   connect.ClientOption
		want  connect.Code // 0 = ok
	}{
		{"token/router/none", AuthOptions{Token: "data"}, false, noToken, connect.CodeUnauthenticated},
		{"token/router/wrong", AuthOptions{Token: "data"}, false, withToken("datx"), connect.CodeUnauthenticated},
		{"token/router/prefix", AuthOptions{Token: "data"}, false, withToken("dat"), connect.CodeUnauthenticated},
		{"token/router/right", AuthOptions{Token: "data"}, false, withToken("data"), 0},
		// No admin token: the test client is on loopback, an operator on
		// the node itself (remote callers: TestAuthzCheck).
		{"token/admin/loopback", AuthOptions{Token: "data"}, true, noToken, 0},
		{"admin/admin/data", AuthOptions{Token: "data", AdminToken: "adm"}, true, withToken("data"), connect.CodeUnauthenticated},
		{"admin/admin/none", AuthOptions{Token: "data", AdminToken: "adm"}, true, noToken, connect.CodeUnauthenticated},
		{"admin/admin/right", AuthOptions{Token: "data", AdminToken: "adm"}, true, withToken("adm"), 0},
		{"admin/router/admin", AuthOptions{Token: "data", AdminToken: "adm"}, false, withToken("adm"), 0},
		{"admin/router/data", AuthOptions{Token: "data", AdminToken: "adm"}, false, withToken("data"), 0},
		{"none/router/loopback", AuthOptions{}, false, noToken, 0},
		{"none/admin/loopback", AuthOptions{}, true, noToken, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := newTestCP(t, cpConfig{leader: true, auth: tc.auth})
			err := do(cp, tc.admin, tc.opt)
			wantCodeOrNil(t, err, tc.want)
		})
	}
}

func TestAuthzCheck(t *testing.T) {
	routeProc := "/" + cartv1connect.RouterServiceName + "/Route"
	adminProc := "/" + cartv1connect.AdminServiceName + "/AddWorker"
	bearer := func(tok string) http.Header {
		h := http.Header{}
		h.Set("Authorization", "Bearer "+tok)
		return h
	}
	cases := []struct {
		name string
		a    AuthOptions
		proc string
		peer string
		h    http.Header
		want connect.Code
	}{
		{"no token, remote v4", AuthOptions{}, routeProc, "10.1.2.3:5555", nil, connect.CodePermissionDenied},
		{"no token, remote admin", AuthOptions{}, adminProc, "10.1.2.3:5555", nil, connect.CodePermissionDenied},
		{"no token, remote v6", AuthOptions{}, routeProc, "[2001:db8::1]:5555", nil, connect.CodePermissionDenied},
		{"no token, remote with a bearer anyway", AuthOptions{}, routeProc, "10.1.2.3:5555", bearer("x"), connect.CodePermissionDenied},
		{"no token, loopback v4", AuthOptions{}, routeProc, "127.0.0.1:5555", nil, 0},
		{"no token, loopback 127/8", AuthOptions{}, routeProc, "127.9.9.9:5555", nil, 0},
		{"no token, loopback v6", AuthOptions{}, adminProc, "[::1]:5555", nil, 0},
		{"no token, empty peer", AuthOptions{}, routeProc, "", nil, connect.CodePermissionDenied},
		{"no token, hostname peer", AuthOptions{}, routeProc, "localhost:5555", nil, connect.CodePermissionDenied},
		{"allow remote", AuthOptions{AllowUnauthenticatedRemote: true}, routeProc, "10.1.2.3:5555", nil, 0},
		{"allow remote admin", AuthOptions{AllowUnauthenticatedRemote: true}, adminProc, "10.1.2.3:5555", nil, 0},
		{"token beats loopback", AuthOptions{Token: "t"}, routeProc, "127.0.0.1:1", nil, connect.CodeUnauthenticated},
		{"token beats allow remote", AuthOptions{Token: "t", AllowUnauthenticatedRemote: true}, routeProc, "10.1.2.3:5555", nil, connect.CodeUnauthenticated},
		{"token remote ok", AuthOptions{Token: "t"}, routeProc, "10.1.2.3:5555", bearer("t"), 0},
		{"basic is not bearer", AuthOptions{Token: "t"}, routeProc, "10.1.2.3:5555", http.Header{"Authorization": {"Basic t"}}, connect.CodeUnauthenticated},
		{"admin token only, admin", AuthOptions{AdminToken: "a"}, adminProc, "10.1.2.3:5555", bearer("a"), 0},
		{"admin token only, router remote", AuthOptions{AdminToken: "a"}, routeProc, "10.1.2.3:5555", nil, connect.CodePermissionDenied},
		{"admin token only, router loopback", AuthOptions{AdminToken: "a"}, routeProc, "127.0.0.1:1", nil, 0},
		{"cluster token is not admin, remote", AuthOptions{Token: "t"}, adminProc, "10.1.2.3:5555", bearer("t"), connect.CodePermissionDenied},
		{"cluster token is not admin, even with allow remote", AuthOptions{Token: "t", AllowUnauthenticatedRemote: true}, adminProc, "10.1.2.3:5555", bearer("t"), connect.CodePermissionDenied},
		{"cluster token is not the admin token", AuthOptions{Token: "t", AdminToken: "a"}, adminProc, "127.0.0.1:1", bearer("t"), connect.CodeUnauthenticated},
		{"no admin token, admin from loopback", AuthOptions{Token: "t"}, adminProc, "[::1]:1", nil, 0},
		{"admin token works on router", AuthOptions{Token: "t", AdminToken: "a"}, routeProc, "10.1.2.3:5555", bearer("a"), 0},
		{"bearer scheme is case-insensitive", AuthOptions{Token: "t"}, routeProc, "10.1.2.3:5555", http.Header{"Authorization": {"bEaReR t"}}, 0},
		{"health is open", AuthOptions{Token: "t"}, "/grpc.health.v1.Health/Check", "10.1.2.3:5555", nil, 0},
		{"metrics are open", AuthOptions{Token: "t"}, "/metrics", "10.1.2.3:5555", nil, 0},
		{"reflection needs the cluster token", AuthOptions{Token: "t"}, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "10.1.2.3:5555", nil, connect.CodeUnauthenticated},
		{"unknown path needs the cluster token", AuthOptions{Token: "t"}, "/cart.v2.Future/Thing", "10.1.2.3:5555", nil, connect.CodeUnauthenticated},
		{"pprof from loopback", AuthOptions{}, "/debug/pprof/profile", "127.0.0.1:1", nil, 0},
		{"pprof from loopback with a cluster token only", AuthOptions{Token: "t"}, "/debug/pprof/", "127.0.0.1:1", nil, 0},
		{"pprof remote", AuthOptions{}, "/debug/pprof/", "10.1.2.3:5555", nil, connect.CodePermissionDenied},
		{"pprof is not opened by allow remote", AuthOptions{AllowUnauthenticatedRemote: true}, "/debug/pprof/", "10.1.2.3:5555", nil, connect.CodePermissionDenied},
		{"pprof remote with the cluster token", AuthOptions{Token: "t"}, "/debug/pprof/", "10.1.2.3:5555", bearer("t"), connect.CodePermissionDenied},
		{"pprof needs the admin token even on loopback", AuthOptions{AdminToken: "a"}, "/debug/pprof/", "127.0.0.1:1", nil, connect.CodeUnauthenticated},
		{"pprof cluster token is not admin", AuthOptions{Token: "t", AdminToken: "a"}, "/debug/pprof/", "127.0.0.1:1", bearer("t"), connect.CodeUnauthenticated},
		{"pprof remote with the admin token", AuthOptions{AdminToken: "a"}, "/debug/pprof/", "10.1.2.3:5555", bearer("a"), 0},
		{"admin prefix is exact", AuthOptions{Token: "t", AdminToken: "a"}, "/" + cartv1connect.AdminServiceName + "X/AddWorker", "10.1.2.3:5555", bearer("t"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			if h == nil {
				h = http.Header{}
			}
			err := (&authz{tc.a}).check(tc.proc, tc.peer, h)
			wantCodeOrNil(t, err, tc.want)
		})
	}
}

func TestReflection(t *testing.T) {
	for _, tc := range []struct {
		name string
		auth AuthOptions
		hdr  http.Header
	}{
		{"open", AuthOptions{}, nil},
		{"token", AuthOptions{Token: "t"}, http.Header{"Authorization": {"Bearer t"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := newTestCP(t, cpConfig{leader: true, auth: tc.auth})
			for _, opt := range []connect.ClientOption{connect.WithGRPC(), connect.WithGRPCWeb()} {
				rc := grpcreflect.NewClient(cp.client, cp.url, opt)
				var sopts []grpcreflect.ClientStreamOption
				if tc.hdr != nil {
					sopts = append(sopts, grpcreflect.WithRequestHeaders(tc.hdr))
				}
				stream := rc.NewStream(context.Background(), sopts...)
				names, err := stream.ListServices()
				if _, cerr := stream.Close(); err == nil && cerr != nil {
					err = cerr
				}
				if err != nil {
					t.Fatalf("ListServices: %v", err)
				}
				var got []string
				for _, n := range names {
					got = append(got, string(n))
				}
				for _, want := range []string{cartv1connect.RouterServiceName, cartv1connect.AdminServiceName} {
					if !slices.Contains(got, want) {
						t.Fatalf("reflection lists %v, missing %s", got, want)
					}
				}
			}
			if tc.hdr != nil {
				stream := grpcreflect.NewClient(cp.client, cp.url, connect.WithGRPC()).NewStream(context.Background())
				_, err := stream.ListServices()
				_, _ = stream.Close()
				wantCode(t, err, connect.CodeUnauthenticated)
			}
		})
	}
}

// healthCheck asks grpc.health.v1.Health/Check over the Connect protocol
// with JSON, as curl would.
func healthCheck(t *testing.T, cp *testCP, service string) (int, string) {
	t.Helper()
	body := `{"service":"` + service + `"}`
	resp, err := cp.client.Post(cp.url+"/grpc.health.v1.Health/Check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Code   string `json:"code"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("health body %q: %v", b, err)
	}
	if out.Code != "" {
		return resp.StatusCode, out.Code
	}
	return resp.StatusCode, out.Status
}

func TestGRPCHealth(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, auth: AuthOptions{Token: "t"}})
	for _, svc := range []string{"", cartv1connect.RouterServiceName, cartv1connect.AdminServiceName} {
		if code, st := healthCheck(t, cp, svc); code != http.StatusOK || st != "SERVING_STATUS_SERVING" {
			t.Fatalf("health(%q) with a leader = %d %s", svc, code, st)
		}
	}
	if _, st := healthCheck(t, cp, "no.such.Service"); st != "not_found" {
		t.Fatalf("health(unknown) = %s, want not_found", st)
	}
	// A follower that knows the leader can serve by forwarding.
	cp.node.setLeader(false, "n2")
	if _, st := healthCheck(t, cp, ""); st != "SERVING_STATUS_SERVING" {
		t.Fatalf("health on a follower with a leader = %s", st)
	}
	cp.node.setLeader(false, "")
	if _, st := healthCheck(t, cp, ""); st != "SERVING_STATUS_NOT_SERVING" {
		t.Fatalf("health without a leader = %s, want NOT_SERVING", st)
	}
}

func TestMetrics(t *testing.T) {
	cp, rc := leaderWith(t, w1, w2)
	txt := text(64, 40)
	liveRoute(t, rc, txt)
	liveRoute(t, rc, txt)
	scrape := func() string {
		resp, err := cp.client.Get(cp.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
		}
		return string(b)
	}
	m := scrape()
	for _, want := range []string{
		`cart_cp_routes_total{reason="cache_miss"} 1`,
		`cart_cp_routes_total{reason="cache_hit"} 1`,
		"cart_raft_leader 1",
		"cart_raft_term 7",
		"cart_cp_workers 2",
		"cart_cp_healthy_workers 2",
		"cart_cp_dataplanes 1",
		"cart_cp_index_entries 4",
		"cart_cp_route_seconds_count 2",
		// The decider's lock holds, one per decision, beside the other
		// control-plane metrics, in sub-millisecond buckets.
		`cart_decider_lock_hold_seconds_count{op="route"} 2`,
		`cart_decider_lock_hold_seconds_bucket{op="route",le="1e-05"}`,
		`cart_cp_tickets_dropped_total{cause="cap"} 0`,
		// How long goroutines waited to run: a node short of CPU.
		"go_sched_latencies_seconds_bucket{",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cp.node.setLeader(false, "n2")
	if m := scrape(); !strings.Contains(m, "cart_raft_leader 0") {
		t.Error("cart_raft_leader is not 0 on a follower")
	}
	// Only GET is routed to the metrics handler.
	resp, err := cp.client.Post(cp.url+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics = %d", resp.StatusCode)
	}
}

// TestDebugPprof: the profiler is served only when asked for.
func TestDebugPprof(t *testing.T) {
	get := func(cp *testCP) int {
		resp, err := cp.client.Get(cp.url + "/debug/pprof/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := get(newTestCP(t, cpConfig{leader: true})); code != http.StatusNotFound {
		t.Errorf("pprof off: GET /debug/pprof/cmdline = %d, want 404", code)
	}
	if code := get(newTestCP(t, cpConfig{leader: true, auth: AuthOptions{DebugPprof: true}})); code != http.StatusOK {
		t.Errorf("pprof on, loopback: GET /debug/pprof/cmdline = %d, want 200", code)
	}
	if code := get(newTestCP(t, cpConfig{leader: true, auth: AuthOptions{DebugPprof: true, AdminToken: "a"}})); code != http.StatusUnauthorized {
		t.Errorf("pprof on, admin token set, none sent: GET /debug/pprof/cmdline = %d, want 401", code)
	}
}

// TestAuthBeforeBody: a caller without the right token is refused from its
// headers, while it is still sending the body: the node neither waits for
// nor buffers a message it would have to decode.
func TestAuthBeforeBody(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true, auth: AuthOptions{Token: "cluster", AdminToken: "admin"}})
	host := strings.TrimPrefix(cp.url, "http://")
	for _, tc := range []struct {
		path, auth string
		status     string
	}{
		{"/" + cartv1connect.AdminServiceName + "/AddWorker", "Bearer cluster", "401"},
		{"/" + cartv1connect.RouterServiceName + "/Route", "", "401"},
		{"/" + cartv1connect.RouterServiceName + "/Route", "Bearer wrong", "401"},
	} {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		// 4 MB announced, 12 bytes sent: a handler that reads first would
		// wait for the rest until the deadline below.
		req := "POST " + tc.path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n"
		if tc.auth != "" {
			req += "Authorization: " + tc.auth + "\r\n"
		}
		req += "\r\n{\"workers\":["
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			conn.Close()
			t.Fatalf("%s: no answer before the body was complete: %v", tc.path, err)
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		conn.Close()
		if got := strconv.Itoa(resp.StatusCode); got != tc.status || !strings.Contains(string(b), "unauthenticated") {
			t.Fatalf("%s with %q: %d %s", tc.path, tc.auth, resp.StatusCode, b)
		}
	}
}
