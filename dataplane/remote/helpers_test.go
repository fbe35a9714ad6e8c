package remote

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeCP is a RouterService whose behaviour the test controls.
type fakeCP struct {
	cartv1connect.UnimplementedRouterServiceHandler
	url string
	srv *httptest.Server

	mu         sync.Mutex
	routeDelay time.Duration
	routeErr   error
	routeFn    func(*cartv1.RouteRequest) *cartv1.RouteResponse
	syncErr    error
	// completeErr fails Complete calls, after recording them (the leader
	// may have settled what a failed call carried).
	completeErr error
	syncResp    *cartv1.SyncResponse
	nextTicket  uint64
	routes      []*cartv1.RouteRequest
	completes   []*cartv1.CompleteRequest
	syncs       []*cartv1.SyncRequest
	auth        []string
}

func newFakeCP(t testing.TB) *fakeCP {
	t.Helper()
	f := &fakeCP{}
	_, h := cartv1connect.NewRouterServiceHandler(f)
	srv := serveH2C(t, h)
	f.srv, f.url = srv, srv.URL
	return f
}

func (f *fakeCP) set(fn func(f *fakeCP)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeCP) Route(ctx context.Context, req *connect.Request[cartv1.RouteRequest]) (*connect.Response[cartv1.RouteResponse], error) {
	f.mu.Lock()
	f.routes = append(f.routes, proto.Clone(req.Msg).(*cartv1.RouteRequest))
	f.auth = append(f.auth, req.Header().Get("Authorization"))
	delay, err, fn := f.routeDelay, f.routeErr, f.routeFn
	f.nextTicket++
	tk := f.nextTicket
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			// The caller's deadline travels with the call (grpc-timeout):
			// answer as a real handler would, with the context's error.
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	resp := &cartv1.RouteResponse{Worker: wA, Reason: "cache_miss", FromLeader: true, LeaderId: "n1"}
	if fn != nil {
		resp = fn(req.Msg)
	}
	if !req.Msg.GetDryRun() && resp.GetTicket() == 0 {
		resp.Ticket = tk
	}
	return connect.NewResponse(resp), nil
}

func (f *fakeCP) Complete(_ context.Context, req *connect.Request[cartv1.CompleteRequest]) (*connect.Response[cartv1.CompleteResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completes = append(f.completes, proto.Clone(req.Msg).(*cartv1.CompleteRequest))
	if f.completeErr != nil {
		return nil, f.completeErr
	}
	return connect.NewResponse(&cartv1.CompleteResponse{Settled: uint32(len(req.Msg.GetCompletions()))}), nil
}

func (f *fakeCP) Sync(_ context.Context, req *connect.Request[cartv1.SyncRequest]) (*connect.Response[cartv1.SyncResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs = append(f.syncs, proto.Clone(req.Msg).(*cartv1.SyncRequest))
	if f.syncErr != nil {
		return nil, f.syncErr
	}
	resp := f.syncResp
	if resp == nil {
		resp = &cartv1.SyncResponse{Workers: []*cartv1.Worker{{Url: wA, Healthy: true}}, WorkersVersion: 1}
	}
	return connect.NewResponse(proto.Clone(resp).(*cartv1.SyncResponse)), nil
}

func (f *fakeCP) routeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.routes)
}

func (f *fakeCP) lastRoute() *cartv1.RouteRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.routes[len(f.routes)-1]
}

func (f *fakeCP) completions() (calls int, all []*cartv1.Completion) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.completes {
		all = append(all, c.GetCompletions()...)
	}
	return len(f.completes), all
}

func (f *fakeCP) syncRequests() []*cartv1.SyncRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.syncs)
}

const (
	wA = "http://wa.test:8000"
	wB = "http://wb.test:8000"
	wC = "http://wc.test:8000"
	wD = "http://wd.test:8000"
)

// downURL is an address on 127.0.0.1 nobody listens on.
func downURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	_ = ln.Close()
	return u
}

// fallbacks records OnFallback causes.
type fallbacks struct {
	mu     sync.Mutex
	causes []string
}

func (f *fallbacks) on(cause string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.causes = append(f.causes, cause)
}

func (f *fallbacks) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.causes)
}

func newTestRouter(t testing.TB, o Options) *Router {
	t.Helper()
	if o.ID == "" {
		o.ID = "dp-test"
	}
	if o.RouteTimeout == 0 {
		o.RouteTimeout = 2 * time.Second
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = time.Hour
	}
	if o.HTTPClient == nil {
		c := testkit.H2CClient()
		o.HTTPClient = c
		t.Cleanup(c.CloseIdleConnections)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return New(o)
}

// run starts r.Run and stops it at cleanup (or when the returned func is
// called), waiting for it to return.
func run(t testing.TB, r *Router) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

func loadOf(r *Router, url string) int {
	for _, w := range r.Workers() {
		if w.URL == url {
			return w.Load
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.local[url]
}

// abandon queues the report of an abandoned Route call, as a call given
// up on does.
func (r *Router) abandon(routeID uint64) {
	r.mu.Lock()
	r.abandons.add(&cartv1.Completion{Abandoned: true, RouteId: routeID, PromptTokens: -1, CachedTokens: -1})
	r.mu.Unlock()
	r.rememberAbandoned(routeID)
}
