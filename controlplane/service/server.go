package service

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
	"github.com/cartrouter/cart/internal/credential"
)

// AuthOptions say who may call what. There are two roles:
//
//   - cluster (Token): data planes and control-plane peers, on
//     RouterService and gRPC reflection;
//   - admin (AdminToken): AdminService (cartctl, joins, forwarded admin
//     calls). The admin token also works wherever the cluster token does,
//     since `cartctl route` dry-runs through RouterService.
//
// The cluster token never works as the admin token: data planes hold it,
// and AdminService can replace the worker set (and so receive every
// prompt) or add a Raft voter. With no admin token, AdminService serves
// loopback callers only, i.e. an operator on the node itself.
type AuthOptions struct {
	Token      string
	AdminToken string
	// AllowUnauthenticatedRemote lets callers from non-loopback addresses
	// in when no token is configured: RouterService when Token is empty,
	// and AdminService too when both tokens are empty. Without it, a node
	// serves unauthenticated callers on loopback only: secure by default.
	AllowUnauthenticatedRemote bool
	// DebugPprof serves net/http/pprof under /debug/pprof/, to loopback
	// callers and admin-token holders only: a profile shows prompts'
	// hashes and can keep a core busy for its whole duration.
	DebugPprof bool
}

// CompressMinBytes is the smallest message worth compressing.
const CompressMinBytes = 4096

// MaxMessageBytes bounds every request message (cpclient.MaxMessageBytes:
// clients check it too).
const MaxMessageBytes = cpclient.MaxMessageBytes

// Handler assembles the Connect API (Connect, gRPC and gRPC-Web on one
// handler), gRPC reflection (v1 and v1alpha, so `buf curl` needs no schema)
// and gRPC health.
func (c *Core) Handler(auth AuthOptions) http.Handler { return c.HandlerWith(auth) }

// HandlerWith is Handler with interceptors around the RouterService and
// AdminService calls (tracing).
func (c *Core) HandlerWith(auth AuthOptions, interceptors ...connect.Interceptor) http.Handler {
	c.streamTracer = cpclient.FindStreamTracer(interceptors)
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxMessageBytes),
		// Route answers are ~100 bytes: compressing them costs more CPU
		// than it saves (measured: 18-29% of leader CPU per route).
		connect.WithCompressMinBytes(CompressMinBytes),
		connect.WithInterceptors(interceptors...),
	}
	// RouterService answers are never compressed. Above 4 KiB they are
	// placement-feed frames of random block hashes, which gzip cannot
	// shrink: compressing them took ~7% of the leader's CPU at 5,000
	// routes/s (perf, bench/results/2026-12-01-final/README.md).
	routerOpts := append(slices.Clip(opts), connect.WithCompressMinBytes(math.MaxInt32))
	mux.Handle(cartv1connect.NewRouterServiceHandler(c.Router(), routerOpts...))
	mux.Handle(cartv1connect.NewAdminServiceHandler(c.Admin(), opts...))
	reflector := grpcreflect.NewStaticReflector(cartv1connect.RouterServiceName, cartv1connect.AdminServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.Handle(grpchealth.NewHandler(&healthChecker{c}))
	mux.Handle("GET /metrics", c.metrics.handler())
	if auth.DebugPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return &authn{z: authz{auth}, next: mux, errw: connect.NewErrorWriter()}
}

// healthChecker reports SERVING when the node knows a leader (it can
// answer Route, directly or by forwarding).
type healthChecker struct{ c *Core }

func (h *healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	switch req.Service {
	case "", cartv1connect.RouterServiceName, cartv1connect.AdminServiceName:
	default:
		return nil, connect.NewError(connect.CodeNotFound, errors.New("unknown service "+req.Service))
	}
	if id, _ := h.c.node.Leader(); id == "" {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// authn authenticates every call from its headers alone, before the body
// is read or decoded: an unauthenticated caller cannot make the node buffer
// or parse (up to MaxMessageBytes of) anything. A Connect interceptor would
// run only after the handler had read the whole request message.
type authn struct {
	z    authz
	next http.Handler
	errw *connect.ErrorWriter
}

func (a *authn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := a.z.check(r.URL.Path, r.RemoteAddr, r.Header); err != nil {
		if r.ProtoMajor < 2 {
			// Close rather than drain an unread body the caller may never
			// finish sending (HTTP/2 resets just the stream).
			w.Header().Set("Connection", "close")
		}
		if a.errw.IsSupported(r) {
			_ = a.errw.Write(w, r, err)
			return
		}
		status := http.StatusUnauthorized
		if connect.CodeOf(err) == connect.CodePermissionDenied {
			status = http.StatusForbidden
		}
		http.Error(w, err.Error(), status)
		return
	}
	a.next.ServeHTTP(w, r)
}

type authz struct{ a AuthOptions }

type role int

const (
	roleOpen    role = iota // health checks and metrics: probes carry no credentials
	roleCluster             // RouterService, reflection and anything unknown
	roleAdmin               // AdminService
	roleDebug               // pprof: loopback or the admin token, whatever else is allowed
)

func roleOf(path string) role {
	switch {
	case path == "/metrics", strings.HasPrefix(path, "/grpc.health.v1.Health/"):
		return roleOpen
	case strings.HasPrefix(path, "/debug/"):
		return roleDebug
	case strings.HasPrefix(path, "/"+cartv1connect.AdminServiceName+"/"):
		return roleAdmin
	default:
		// Deny by default: a path added later is authenticated until
		// someone decides otherwise.
		return roleCluster
	}
}

func (z *authz) check(path, peer string, h http.Header) error {
	r := roleOf(path)
	if r == roleOpen {
		return nil
	}
	tok, hasTok := credential.BearerToken(h)
	if z.a.AdminToken != "" && hasTok && credential.Equal(tok, z.a.AdminToken) {
		return nil // the admin role may do everything
	}
	if r == roleDebug {
		// Not opened by allow_unauthenticated_remote, unlike AdminService:
		// nothing a remote operator needs, and a profile costs CPU.
		if credential.IsLoopback(peer) && z.a.AdminToken == "" {
			return nil
		}
		if z.a.AdminToken != "" {
			return connect.NewError(connect.CodeUnauthenticated, errors.New("/debug/ needs the admin token (auth.admin_token)"))
		}
		return connect.NewError(connect.CodePermissionDenied, errors.New("no admin token is configured, so /debug/ serves loopback callers only"))
	}
	if r == roleAdmin {
		switch {
		case z.a.AdminToken != "":
			return connect.NewError(connect.CodeUnauthenticated, errors.New("AdminService needs the admin token (auth.admin_token)"))
		case credential.IsLoopback(peer):
			return nil
		case z.a.Token == "" && z.a.AllowUnauthenticatedRemote:
			return nil
		}
		return connect.NewError(connect.CodePermissionDenied,
			errors.New("no admin token is configured, so AdminService serves loopback callers only; set auth.admin_token (the cluster token is not an admin credential)"))
	}
	if z.a.Token == "" {
		if z.a.AllowUnauthenticatedRemote || credential.IsLoopback(peer) {
			return nil
		}
		return connect.NewError(connect.CodePermissionDenied,
			errors.New("no cluster token is configured, so this node serves loopback callers only; set auth.token (or auth.allow_unauthenticated_remote: true)"))
	}
	if !hasTok || !credential.Equal(tok, z.a.Token) {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("missing or invalid bearer token"))
	}
	return nil
}
