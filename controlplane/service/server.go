package service

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// AuthOptions say who may call what.
type AuthOptions struct {
	// Token authorises RouterService (data planes) and, when AdminToken is
	// empty, AdminService too.
	Token string
	// AdminToken, when set, is required for AdminService.
	AdminToken string
	// AllowUnauthenticatedRemote lets callers from non-loopback addresses
	// in when no token is configured. Without it, a node with no token
	// serves only loopback callers: secure by default.
	AllowUnauthenticatedRemote bool
}

// CompressMinBytes is the smallest message worth compressing.
const CompressMinBytes = 4096

// MaxMessageBytes bounds every request message.
const MaxMessageBytes = 4 << 20

// Handler assembles the Connect API (Connect, gRPC and gRPC-Web on one
// handler), gRPC reflection (v1 and v1alpha, so `buf curl` needs no schema)
// and gRPC health.
func (c *Core) Handler(auth AuthOptions) http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{
		connect.WithInterceptors(authInterceptor(auth)),
		connect.WithReadMaxBytes(MaxMessageBytes),
		// Route answers are ~100 bytes: compressing them costs more CPU
		// than it saves (measured: 18-29% of leader CPU per route).
		connect.WithCompressMinBytes(CompressMinBytes),
	}
	mux.Handle(cartv1connect.NewRouterServiceHandler(c.Router(), opts...))
	mux.Handle(cartv1connect.NewAdminServiceHandler(c.Admin(), opts...))
	reflector := grpcreflect.NewStaticReflector(cartv1connect.RouterServiceName, cartv1connect.AdminServiceName)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, connect.WithInterceptors(authInterceptor(auth))))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, connect.WithInterceptors(authInterceptor(auth))))
	mux.Handle(grpchealth.NewHandler(&healthChecker{c}))
	mux.Handle("GET /metrics", c.metrics.handler())
	return mux
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

func authInterceptor(a AuthOptions) connect.Interceptor {
	return &authz{a}
}

type authz struct{ a AuthOptions }

func (z *authz) check(procedure, peer string, h http.Header) error {
	want := z.a.Token
	if strings.HasPrefix(procedure, "/"+cartv1connect.AdminServiceName+"/") && z.a.AdminToken != "" {
		want = z.a.AdminToken
	}
	if want == "" {
		if z.a.AllowUnauthenticatedRemote || isLoopback(peer) {
			return nil
		}
		return connect.NewError(connect.CodePermissionDenied,
			errors.New("no auth token is configured, so this node serves loopback callers only; set auth.token (or auth.allow_unauthenticated_remote: true)"))
	}
	got, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("missing or invalid bearer token"))
	}
	return nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (z *authz) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := z.check(req.Spec().Procedure, req.Peer().Addr, req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (z *authz) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (z *authz) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := z.check(conn.Spec().Procedure, conn.Peer().Addr, conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
