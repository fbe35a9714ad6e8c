package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/extract"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

// fakeCP is an in-memory control plane: enough of AdminService and
// RouterService, with the real server's error codes, to drive cartctl.
type fakeCP struct {
	cartv1connect.UnimplementedAdminServiceHandler
	cartv1connect.UnimplementedRouterServiceHandler

	token string // when set, every call needs "Authorization: Bearer <token>"
	// leaderID and leaderURL, when set, make writes fail the way a node
	// that lost leadership does: FailedPrecondition naming the leader in
	// the NotLeader detail.
	leaderID, leaderURL string
	// noLeader makes every call fail as on a node cut off from the quorum.
	noLeader bool
	// hang makes ListWorkers wait until the caller gives up.
	hang bool
	// unknown makes AddWorker answer as a leader that appended the write
	// and then lost leadership: Aborted, outcome unknown.
	unknown bool

	mu        sync.Mutex
	workers   []*cartv1.Worker
	version   uint64
	members   []*cartv1.Member
	routes    []*cartv1.RouteRequest
	routeResp *cartv1.RouteResponse
}

func (f *fakeCP) notLeader() error {
	if f.leaderURL == "" {
		return nil
	}
	// The leader is named by the NotLeader detail only: cartctl must not
	// need the message.
	return withNotLeader(connect.NewError(connect.CodeFailedPrecondition, errors.New("not the leader")), f.leaderID, f.leaderURL)
}

// withNotLeader attaches the control plane's NotLeader detail to e.
func withNotLeader(e *connect.Error, id, url string) *connect.Error {
	d, err := connect.NewErrorDetail(&cartv1.NotLeader{LeaderId: id, LeaderUrl: url})
	if err != nil {
		panic(err)
	}
	e.AddDetail(d)
	return e
}

func (f *fakeCP) find(url string) int {
	return slices.IndexFunc(f.workers, func(w *cartv1.Worker) bool { return w.GetUrl() == url })
}

func (f *fakeCP) ListWorkers(ctx context.Context, _ *connect.Request[cartv1.ListWorkersRequest]) (*connect.Response[cartv1.ListWorkersResponse], error) {
	if f.hang {
		<-ctx.Done()
		return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &cartv1.ListWorkersResponse{WorkersVersion: f.version}
	for _, w := range f.workers {
		out.Workers = append(out.Workers, proto.CloneOf(w))
	}
	return connect.NewResponse(out), nil
}

func (f *fakeCP) AddWorker(_ context.Context, req *connect.Request[cartv1.AddWorkerRequest]) (*connect.Response[cartv1.AddWorkerResponse], error) {
	if err := f.notLeader(); err != nil {
		return nil, err
	}
	if f.unknown {
		e := connect.NewError(connect.CodeAborted, errors.New("write outcome unknown, retry the same command (it is idempotent): commit: leadership lost while committing log"))
		e.Meta().Set(cpclient.HeaderWriteOutcome, "unknown")
		return nil, e
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := req.Msg.GetWorker()
	if i := f.find(w.GetUrl()); i >= 0 {
		cur := f.workers[i]
		if cur.GetMaxLoad() == w.GetMaxLoad() && cur.GetLoadPenalty() == w.GetLoadPenalty() && cur.GetCacheCapacityTokens() == w.GetCacheCapacityTokens() {
			return connect.NewResponse(&cartv1.AddWorkerResponse{Worker: proto.CloneOf(cur)}), nil
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("worker %s already exists with other settings; use update", w.GetUrl()))
	}
	nw := proto.CloneOf(w)
	nw.Healthy = true
	f.workers = append(f.workers, nw)
	f.version++
	return connect.NewResponse(&cartv1.AddWorkerResponse{Worker: proto.CloneOf(nw)}), nil
}

func (f *fakeCP) UpdateWorker(_ context.Context, req *connect.Request[cartv1.UpdateWorkerRequest]) (*connect.Response[cartv1.UpdateWorkerResponse], error) {
	if err := f.notLeader(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := req.Msg.GetWorker()
	i := f.find(w.GetUrl())
	if i < 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s not found", w.GetUrl()))
	}
	cur := f.workers[i]
	cur.MaxLoad, cur.LoadPenalty, cur.CacheCapacityTokens = w.GetMaxLoad(), w.GetLoadPenalty(), w.GetCacheCapacityTokens()
	f.version++
	return connect.NewResponse(&cartv1.UpdateWorkerResponse{Worker: proto.CloneOf(cur)}), nil
}

func (f *fakeCP) RemoveWorker(_ context.Context, req *connect.Request[cartv1.RemoveWorkerRequest]) (*connect.Response[cartv1.RemoveWorkerResponse], error) {
	if err := f.notLeader(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.find(req.Msg.GetUrl())
	if i < 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s not found", req.Msg.GetUrl()))
	}
	f.workers = slices.Delete(f.workers, i, i+1)
	f.version++
	return connect.NewResponse(&cartv1.RemoveWorkerResponse{}), nil
}

func (f *fakeCP) ClusterStatus(context.Context, *connect.Request[cartv1.ClusterStatusRequest]) (*connect.Response[cartv1.ClusterStatusResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &cartv1.ClusterStatusResponse{NodeId: "n1", State: "leader", LeaderId: "n1", LeaderUrl: "http://n1:6701", Term: 2,
		CommitIndex: 10, AppliedIndex: 10, LastLogIndex: 10, Workers: uint32(len(f.workers))}
	for _, m := range f.members {
		out.Members = append(out.Members, proto.CloneOf(m))
	}
	for _, w := range f.workers {
		if w.GetHealthy() {
			out.HealthyWorkers++
		}
	}
	return connect.NewResponse(out), nil
}

func (f *fakeCP) AddVoter(_ context.Context, req *connect.Request[cartv1.AddVoterRequest]) (*connect.Response[cartv1.AddVoterResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := req.Msg
	f.members = append(f.members, &cartv1.Member{Id: m.GetId(), RaftAddress: m.GetRaftAddress(), ApiUrl: m.GetApiUrl(), Suffrage: "voter"})
	return connect.NewResponse(&cartv1.AddVoterResponse{}), nil
}

func (f *fakeCP) RemoveServer(_ context.Context, req *connect.Request[cartv1.RemoveServerRequest]) (*connect.Response[cartv1.RemoveServerResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.members, func(m *cartv1.Member) bool { return m.GetId() == req.Msg.GetId() })
	if i < 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %s is not a cluster member", req.Msg.GetId()))
	}
	f.members = slices.Delete(f.members, i, i+1)
	return connect.NewResponse(&cartv1.RemoveServerResponse{}), nil
}

func (f *fakeCP) TransferLeadership(_ context.Context, req *connect.Request[cartv1.TransferLeadershipRequest]) (*connect.Response[cartv1.TransferLeadershipResponse], error) {
	id := req.Msg.GetId()
	if id == "" {
		id = "n2"
	}
	return connect.NewResponse(&cartv1.TransferLeadershipResponse{LeaderId: id}), nil
}

func (f *fakeCP) Route(_ context.Context, req *connect.Request[cartv1.RouteRequest]) (*connect.Response[cartv1.RouteResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes = append(f.routes, proto.CloneOf(req.Msg))
	return connect.NewResponse(proto.CloneOf(f.routeResp)), nil
}

func (f *fakeCP) lastRoute(t *testing.T) *cartv1.RouteRequest {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.routes) == 0 {
		t.Fatal("no Route call reached the server")
	}
	return f.routes[len(f.routes)-1]
}

// auth mirrors the control plane's bearer-token check.
func (f *fakeCP) auth() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if f.token != "" && req.Header().Get("Authorization") != "Bearer "+f.token {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("missing or invalid bearer token"))
			}
			if f.noLeader {
				return nil, withNotLeader(connect.NewError(connect.CodeUnavailable, errors.New("no leader: this node cannot reach a quorum (election in progress or minority partition)")), "", "")
			}
			return next(ctx, req)
		}
	})
}

// serve starts f on a loopback port speaking HTTP/2 without TLS (h2c),
// which is what gRPC over http:// needs, and returns its URL.
func serve(t *testing.T, f *fakeCP) string {
	t.Helper()
	mux := http.NewServeMux()
	opt := connect.WithInterceptors(f.auth())
	mux.Handle(cartv1connect.NewAdminServiceHandler(f, opt))
	mux.Handle(cartv1connect.NewRouterServiceHandler(f, opt))
	srv := httptest.NewUnstartedServer(mux)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener.Close()
	srv.Listener = ln
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// deadURL returns a loopback URL nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	return "http://" + testkit.FreeAddr(t)
}

type result struct {
	code           int
	stdout, stderr string
}

// cartctl runs the command line with an environment that has no config
// file and no CARTCTL_* variables beyond env.
func cartctl(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	full := map[string]string{"HOME": t.TempDir()}
	for k, v := range env {
		full[k] = v
	}
	var out, errOut bytes.Buffer
	code := execute(args, strings.NewReader(stdin), &out, &errOut, envMap(full))
	return result{code, out.String(), errOut.String()}
}

func (r result) must(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

func TestE2EWorkersRoundTrip(t *testing.T) {
	f := &fakeCP{}
	srv := serve(t, f)
	env := map[string]string{"CARTCTL_SERVER": srv}

	r := cartctl(t, env, "", "workers", "add", "http://w1:8000/", "--max-load", "8", "--load-penalty", "2").must(t, exitOK)
	if want := "added worker http://w1:8000: max_load 8, load_penalty 2, cache capacity default tokens\n"; r.stdout != want {
		t.Errorf("add output %q, want %q", r.stdout, want)
	}
	cartctl(t, env, "", "workers", "add", "http://w2:8000", "--cache-capacity-tokens", "500000", "--role", "prefill").must(t, exitOK)
	// Adding again with the same settings is idempotent.
	cartctl(t, env, "", "workers", "add", "http://w2:8000", "--cache-capacity-tokens", "500000", "--role", "prefill").must(t, exitOK)
	cartctl(t, env, "", "workers", "add", "http://w3:8000", "--role", "Decode").must(t, exitUsage)

	r = cartctl(t, env, "", "workers", "list").must(t, exitOK)
	want := `URL             HEALTHY  LOAD  MAX_LOAD   PENALTY  CAPACITY  ENGINE_CACHE  SOURCE  ROLE
http://w1:8000  yes      0     8          2        default   -             static  both
http://w2:8000  yes      0     unlimited  0        500000    -             static  prefill

2 worker(s), workers version 2; CAPACITY is in tokens; ENGINE_CACHE is occupied/size tokens from the engine's KV events (- without)
`
	if r.stdout != want {
		t.Errorf("list output:\n%s\nwant:\n%s", r.stdout, want)
	}

	// Only the flags given change.
	r = cartctl(t, env, "", "workers", "update", "http://w1:8000", "--max-load", "16").must(t, exitOK)
	if !strings.Contains(r.stdout, "updated worker http://w1:8000: max_load 16, load_penalty 2") {
		t.Errorf("update output %q", r.stdout)
	}
	cartctl(t, env, "", "workers", "update", "http://w1:8000", "--load-penalty", "0").must(t, exitOK)

	cartctl(t, env, "", "workers", "remove", "http://w2:8000").must(t, exitOK)

	r = cartctl(t, env, "", "-o", "json", "workers", "list").must(t, exitOK)
	var list struct {
		Workers []struct {
			URL         string `json:"url"`
			MaxLoad     int    `json:"max_load"`
			LoadPenalty int    `json:"load_penalty"`
			Healthy     bool   `json:"healthy"`
		} `json:"workers"`
		WorkersVersion string `json:"workers_version"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
		t.Fatalf("list -o json is not JSON: %v\n%s", err, r.stdout)
	}
	if len(list.Workers) != 1 || list.Workers[0].URL != "http://w1:8000" || list.Workers[0].MaxLoad != 16 ||
		list.Workers[0].LoadPenalty != 0 || !list.Workers[0].Healthy || list.WorkersVersion != "5" {
		t.Errorf("after round trip: %+v", list)
	}
}

func TestE2EErrors(t *testing.T) {
	f := &fakeCP{workers: []*cartv1.Worker{{Url: "http://w1:8000", MaxLoad: 4}}}
	srv := serve(t, f)
	env := map[string]string{"CARTCTL_SERVER": srv}

	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"update missing worker", []string{"workers", "update", "http://nope:1", "--max-load", "1"}, exitNotFound, "cartctl: worker http://nope:1 not found\n"},
		{"remove missing worker", []string{"workers", "remove", "http://nope:1"}, exitNotFound, "cartctl: worker http://nope:1 not found\n"},
		{"remove missing member", []string{"cluster", "remove", "n9"}, exitNotFound, "cartctl: node n9 is not a cluster member\n"},
		{"add with other settings", []string{"workers", "add", "http://w1:8000", "--max-load", "5"}, exitExists,
			"cartctl: worker http://w1:8000 already exists with other settings; use update\n"},
		{"bad worker URL", []string{"workers", "add", "w1:8000"}, exitUsage, `"w1:8000" must start with http:// or https://`},
		{"missing argument", []string{"workers", "remove"}, exitUsage, "accepts 1 arg(s), received 0"},
		{"unknown flag", []string{"workers", "list", "--nope"}, exitUsage, "unknown flag: --nope"},
		{"bad flag value", []string{"workers", "add", "http://w3:1", "--max-load", "-1"}, exitUsage, "invalid argument"},
		{"unknown subcommand", []string{"workers", "lst"}, exitUsage, `did you mean "list"?`},
		{"update without flags", []string{"workers", "update", "http://w1:8000"}, exitUsage, "nothing to update"},
		{"route without text", []string{"route"}, exitUsage, "give the key text"},
		{"completion for unknown shell", []string{"completion", "tcsh"}, exitUsage, `invalid argument "tcsh"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := cartctl(t, env, "", tt.args...).must(t, tt.code)
			if !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("stderr %q does not contain %q", r.stderr, tt.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing on failure", r.stdout)
			}
		})
	}
}

func TestE2ENotLeader(t *testing.T) {
	f := &fakeCP{leaderID: "n2", leaderURL: "http://10.0.0.2:6701"}
	srv := serve(t, f)
	r := cartctl(t, nil, "", "--server", srv, "workers", "add", "http://w1:8000").must(t, exitNotLeader)
	want := "cartctl: not the leader; the leader is n2 at http://10.0.0.2:6701 (retry with --server http://10.0.0.2:6701)\n"
	if r.stderr != want {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
}

// A write that may still commit is neither done nor "no leader": its own
// exit code, and a message that says repeating it is safe.
func TestE2EUnknownOutcome(t *testing.T) {
	srv := serve(t, &fakeCP{unknown: true})
	r := cartctl(t, nil, "", "--server", srv, "workers", "add", "http://w1:8000").must(t, exitUnknown)
	if !strings.Contains(r.stderr, "may or may not have been applied; repeating it is safe") {
		t.Errorf("stderr %q", r.stderr)
	}
	// Unknown is final for this call: no failover to another member, which
	// could only answer for itself.
	live := serve(t, &fakeCP{})
	cartctl(t, nil, "", "--server", srv+","+live, "workers", "add", "http://w1:8000").must(t, exitUnknown)
}

func TestE2EAuth(t *testing.T) {
	f := &fakeCP{token: "s3cret"}
	srv := serve(t, f)
	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "token", "s3cret\n")
	cfg := writeFile(t, dir, "cartctl.yaml", "server: "+srv+"\ntoken: s3cret\n")

	r := cartctl(t, nil, "", "--server", srv, "workers", "list").must(t, exitAuth)
	if !strings.Contains(r.stderr, "rejected the credentials: missing or invalid bearer token") {
		t.Errorf("stderr %q", r.stderr)
	}
	cartctl(t, nil, "", "--server", srv, "--token", "wrong", "workers", "list").must(t, exitAuth)
	cartctl(t, nil, "", "--server", srv, "--token", "s3cret", "workers", "list").must(t, exitOK)
	cartctl(t, map[string]string{"CARTCTL_TOKEN": "s3cret"}, "", "--server", srv, "workers", "list").must(t, exitOK)
	cartctl(t, nil, "", "--server", srv, "--token-file", tokenFile, "workers", "list").must(t, exitOK)
	cartctl(t, map[string]string{"CARTCTL_CONFIG": cfg}, "", "workers", "list").must(t, exitOK)
	// A flag beats the config file, even a wrong one.
	cartctl(t, map[string]string{"CARTCTL_CONFIG": cfg}, "", "--token", "wrong", "workers", "list").must(t, exitAuth)
}

func TestE2EUnavailable(t *testing.T) {
	dead := deadURL(t)
	r := cartctl(t, nil, "", "--server", dead, "workers", "list").must(t, exitUnavailable)
	if !strings.Contains(r.stderr, "cannot reach the control plane at "+dead) {
		t.Errorf("stderr %q", r.stderr)
	}

	// With a list, a dead server is skipped.
	f := &fakeCP{workers: []*cartv1.Worker{{Url: "http://w1:8000"}}}
	live := serve(t, f)
	r = cartctl(t, nil, "", "--server", dead+","+live, "workers", "list").must(t, exitOK)
	if !strings.Contains(r.stdout, "http://w1:8000") {
		t.Errorf("stdout %q", r.stdout)
	}
	// But an answer that is not "unavailable" is final: no failover.
	f2 := &fakeCP{}
	r = cartctl(t, nil, "", "--server", serve(t, f2)+","+live, "workers", "remove", "http://w1:8000").must(t, exitNotFound)
	if !strings.Contains(r.stderr, "worker http://w1:8000 not found") {
		t.Errorf("stderr %q", r.stderr)
	}
}

func TestE2ETimeout(t *testing.T) {
	srv := serve(t, &fakeCP{hang: true})
	r := cartctl(t, nil, "", "--server", srv, "--timeout", "200ms", "workers", "list").must(t, exitUnavailable)
	if want := "cartctl: timed out after 200ms waiting for " + srv; !strings.HasPrefix(r.stderr, want) {
		t.Errorf("stderr %q, want prefix %q", r.stderr, want)
	}
}

func TestE2ENoLeader(t *testing.T) {
	cutOff := serve(t, &fakeCP{noLeader: true})
	r := cartctl(t, nil, "", "--server", cutOff, "cluster", "status").must(t, exitNotLeader)
	if !strings.Contains(r.stderr, "is unavailable: no leader") {
		t.Errorf("stderr %q", r.stderr)
	}
	// Another member, on the majority side, can answer.
	live := serve(t, &fakeCP{})
	cartctl(t, nil, "", "--server", cutOff+","+live, "cluster", "status").must(t, exitOK)
	r = cartctl(t, nil, "", "--server", cutOff+","+deadURL(t), "cluster", "status").must(t, exitUnavailable)
	if !strings.Contains(r.stderr, "no control-plane server could answer (2 tried)") {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestE2ERouteExplainsEveryReason: route --explain renders the registered
// meaning of every reason the control plane may give, and the numbers
// behind it, so adding a reason to the engine's registry without teaching
// cartctl its details fails here.
func TestE2ERouteExplainsEveryReason(t *testing.T) {
	reasons := engine.Reasons()
	if len(reasons) == 0 {
		t.Fatal("empty reason registry")
	}
	for _, ri := range reasons {
		t.Run(string(ri.Reason), func(t *testing.T) {
			f := &fakeCP{routeResp: &cartv1.RouteResponse{Worker: "http://w1:8000", Reason: string(ri.Reason), MatchedChars: 7, MatchedRatio: 0.5}}
			env := map[string]string{"CARTCTL_SERVER": serve(t, f)}
			r := cartctl(t, env, "", "-o", "json", "route", "--text", "fourteen chars", "--model", "m", "--explain").must(t, exitOK)
			var resp map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
				t.Fatalf("route -o json is not JSON: %v\n%s", err, r.stdout)
			}
			why := fmt.Sprint(resp["explanation"])
			if !strings.HasPrefix(why, ri.Meaning+". ") || !strings.Contains(why, "http://w1:8000") {
				t.Errorf("explanation %q: want the registered meaning %q, then details naming the worker", why, ri.Meaning)
			}
		})
	}
}

func TestE2ERoute(t *testing.T) {
	f := &fakeCP{routeResp: &cartv1.RouteResponse{
		Worker: "http://w1:8000", Reason: "cache_hit", MatchedChars: 20, MatchedRatio: 20.0 / 23,
		DecisionMicros: 17, FromLeader: true, Candidate: "http://w1:8000", ChosenChars: 20, LeaderId: "n1",
	}}
	srv := serve(t, f)
	env := map[string]string{"CARTCTL_SERVER": srv}
	text := "You are a helpful bot. "

	r := cartctl(t, env, "", "route", "--text", text, "--model", "llama", "--exclude", "http://w9:1", "--exclude", "http://w8:1", "--explain").must(t, exitOK)
	for _, want := range []string{
		"worker:        http://w1:8000\n",
		"reason:        cache_hit\n",
		"matched:       20 of 23 chars (ratio 0.87)\n",
		"from leader:   yes\n",
		"leader id:     n1\n",
		"why: cache hit: the worker holding the longest cached prefix",
		"http://w1:8000 holds the longest cached",
		"ratio 0.87 ≥ cache.threshold",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("route output lacks %q:\n%s", want, r.stdout)
		}
	}
	got := f.lastRoute(t)
	want := &cartv1.RouteRequest{Endpoint: "chat_completions", Model: "llama", Text: text,
		ExcludeWorkers: []string{"http://w9:1", "http://w8:1"}, DryRun: true, Disaggregation: cartv1.Disaggregation_DISAGGREGATION_PAIR}
	if !proto.Equal(got, want) {
		t.Errorf("Route request %v, want %v", got, want)
	}

	// Text from stdin, byte for byte, and JSON output with the explanation.
	r = cartctl(t, env, "line one\nline two\n", "-o", "json", "route", "--text", "-", "--explain", "--endpoint", "messages").must(t, exitOK)
	var resp map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil {
		t.Fatalf("route -o json is not JSON: %v\n%s", err, r.stdout)
	}
	if resp["reason"] != "cache_hit" || resp["worker"] != "http://w1:8000" || !strings.HasPrefix(fmt.Sprint(resp["explanation"]), "cache hit: ") {
		t.Errorf("route JSON %v", resp)
	}
	if got := f.lastRoute(t); got.GetText() != "line one\nline two\n" || got.GetEndpoint() != "messages" || !got.GetDryRun() {
		t.Errorf("Route request from stdin: %v", got)
	}

	// From a file.
	path := writeFile(t, t.TempDir(), "prompt.txt", "from a file")
	cartctl(t, env, "", "route", "--text-file", path).must(t, exitOK)
	if got := f.lastRoute(t); got.GetText() != "from a file" || !got.GetDryRun() {
		t.Errorf("Route request from file: %v", got)
	}
	cartctl(t, env, "", "route", "--text", "x", "--text-file", path).must(t, exitUsage)
}

func TestE2ECluster(t *testing.T) {
	f := &fakeCP{members: []*cartv1.Member{{Id: "n1", RaftAddress: "10.0.0.1:6702", ApiUrl: "http://n1:6701", Suffrage: "voter", Leader: true}}}
	srv := serve(t, f)
	env := map[string]string{"CARTCTL_SERVER": srv}

	r := cartctl(t, env, "", "cluster", "join", "n2", "10.0.0.2:6702", "--api-url", "http://n2:6701").must(t, exitOK)
	if r.stdout != "node n2 (raft 10.0.0.2:6702) joined as a voter\n" {
		t.Errorf("join output %q", r.stdout)
	}
	r = cartctl(t, env, "", "cluster", "status").must(t, exitOK)
	for _, want := range []string{"node:            n1\n", "leader:          n1 at http://n1:6701\n",
		"n2  10.0.0.2:6702  http://n2:6701  voter     no\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = cartctl(t, env, "", "cluster", "status", "-o", "json").must(t, exitOK)
	var st struct {
		NodeID  string `json:"node_id"`
		Members []struct {
			ID string `json:"id"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.NodeID != "n1" || len(st.Members) != 2 {
		t.Errorf("status JSON %+v (%v):\n%s", st, err, r.stdout)
	}
	r = cartctl(t, env, "", "cluster", "transfer-leader", "n2").must(t, exitOK)
	if r.stdout != "leadership transferred to n2\n" {
		t.Errorf("transfer output %q", r.stdout)
	}
	cartctl(t, env, "", "cluster", "remove", "n2").must(t, exitOK)
	cartctl(t, env, "", "cluster", "remove", "n2").must(t, exitNotFound)
	r = cartctl(t, env, "", "-o", "json", "cluster", "remove", "n1").must(t, exitOK)
	if !json.Valid([]byte(r.stdout)) {
		t.Errorf("remove -o json: %q", r.stdout)
	}
}

func TestE2EVersionAndCompletion(t *testing.T) {
	r := cartctl(t, nil, "", "version").must(t, exitOK)
	if !strings.HasPrefix(r.stdout, "cartctl ") {
		t.Errorf("version output %q", r.stdout)
	}
	// A broken config file must not stop commands that need no server.
	cfg := writeFile(t, t.TempDir(), "bad.yaml", "nonsense: [")
	cartctl(t, map[string]string{"CARTCTL_CONFIG": cfg}, "", "version").must(t, exitOK)
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		r := cartctl(t, nil, "", "completion", sh).must(t, exitOK)
		if !strings.Contains(r.stdout, "cartctl") {
			t.Errorf("completion %s output does not mention cartctl", sh)
		}
	}
}

// --body extracts the key text exactly as a data plane would, so a dry run
// answers for the real request (model taken from the body).
func TestE2ERouteBody(t *testing.T) {
	f := &fakeCP{routeResp: &cartv1.RouteResponse{Worker: "http://w1:8000", Reason: "cache_miss", FromLeader: true}}
	srv := serve(t, f)
	env := map[string]string{"CARTCTL_SERVER": srv}
	body := `{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`
	cartctl(t, env, body, "route", "--body", "-", "--endpoint", "chat_completions").must(t, exitOK)
	want, err := extract.Extract(extract.ChatCompletions, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got := f.lastRoute(t)
	if got.GetText() != string(want.Key) || got.GetModel() != "llama" || !got.GetDryRun() {
		t.Fatalf("Route request %v, want the extracted key and model llama", got)
	}
	// A body that is not a valid request is a usage error.
	cartctl(t, env, `{"messages":"nope"}`, "route", "--body", "-").must(t, exitUsage)
	cartctl(t, env, body, "route", "--body", "-", "--text", "x").must(t, exitUsage)
}

// TestE2ETokenSafety: a token never crosses a network in the clear unless
// --insecure says so, and secrets readable by other local users are
// flagged.
func TestE2ETokenSafety(t *testing.T) {
	f := &fakeCP{token: "s3cret"}
	srv := serve(t, f)
	remote := "http://cart-cp.invalid:6701"
	r := cartctl(t, nil, "", "--server", remote, "--token", "s3cret", "workers", "list").must(t, exitUsage)
	if !strings.Contains(r.stderr, "refusing to send the token over plain http to "+remote) {
		t.Errorf("stderr %q", r.stderr)
	}
	// Also when the remote server is only a fallback in the list.
	cartctl(t, nil, "", "--server", srv+","+remote, "--token", "s3cret", "workers", "list").must(t, exitUsage)
	// --insecure lets it through (it then fails to resolve the host).
	r = cartctl(t, nil, "", "--server", remote, "--token", "s3cret", "--insecure", "--timeout", "2s", "workers", "list")
	if r.code == exitUsage || strings.Contains(r.stderr, "refusing") {
		t.Errorf("--insecure still refused: %d %q", r.code, r.stderr)
	}
	// So does CARTCTL_INSECURE=true (what an in-cluster Job sets); a typo in
	// it is a usage error, not a silent "false".
	r = cartctl(t, map[string]string{"CARTCTL_INSECURE": "true"}, "", "--server", remote, "--token", "s3cret", "--timeout", "2s", "workers", "list")
	if r.code == exitUsage || strings.Contains(r.stderr, "refusing") {
		t.Errorf("CARTCTL_INSECURE=true still refused: %d %q", r.code, r.stderr)
	}
	cartctl(t, map[string]string{"CARTCTL_INSECURE": "yes please"}, "", "--server", remote, "--token", "s3cret", "workers", "list").must(t, exitUsage)
	// No token, nothing to protect.
	r = cartctl(t, nil, "", "--server", remote, "--timeout", "2s", "workers", "list")
	if r.code == exitUsage {
		t.Errorf("refused without a token: %q", r.stderr)
	}

	dir := t.TempDir()
	tokenFile := writeFile(t, dir, "token", "s3cret\n")
	r = cartctl(t, nil, "", "--server", srv, "--token-file", tokenFile, "workers", "list").must(t, exitOK)
	if strings.Contains(r.stderr, "warning") {
		t.Errorf("a 0600 token file was warned about: %q", r.stderr)
	}
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	r = cartctl(t, nil, "", "--server", srv, "--token-file", tokenFile, "workers", "list").must(t, exitOK)
	if !strings.Contains(r.stderr, "warning: token file "+tokenFile+" is readable by group or others (mode 0644)") {
		t.Errorf("stderr %q", r.stderr)
	}
	cfg := writeFile(t, dir, "cartctl.yaml", "server: "+srv+"\ntoken: s3cret\n")
	if err := os.Chmod(cfg, 0o640); err != nil {
		t.Fatal(err)
	}
	r = cartctl(t, map[string]string{"CARTCTL_CONFIG": cfg}, "", "workers", "list").must(t, exitOK)
	if !strings.Contains(r.stderr, "warning: config file "+cfg+" holds a token") {
		t.Errorf("stderr %q", r.stderr)
	}
}
