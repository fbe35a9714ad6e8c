package service

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// forwarder keeps Connect clients to the current leader.
type forwarder struct {
	router *cpclient.ByURL[cartv1connect.RouterServiceClient]
	admin  *cpclient.ByURL[cartv1connect.AdminServiceClient]
}

// newForwarder's clients read an answer of at most maxAnswer bytes
// (cpclient.MaxAnswerBytes in production).
func newForwarder(c *http.Client, routerToken, adminToken string, maxAnswer int) *forwarder {
	if c == nil {
		c = http.DefaultClient
	}
	return &forwarder{
		router: cpclient.NewByURL(func(url string) cartv1connect.RouterServiceClient {
			return cartv1connect.NewRouterServiceClient(c, url, connect.WithGRPC(), connect.WithSendCompression("identity"), connect.WithReadMaxBytes(maxAnswer), forwardHeaders(routerToken))
		}),
		admin: cpclient.NewByURL(func(url string) cartv1connect.AdminServiceClient {
			return cartv1connect.NewAdminServiceClient(c, url, connect.WithGRPC(), connect.WithReadMaxBytes(maxAnswer), forwardHeaders(adminToken))
		}),
	}
}

func (f *forwarder) routerTo(url string) cartv1connect.RouterServiceClient { return f.router.Get(url) }
func (f *forwarder) adminTo(url string) cartv1connect.AdminServiceClient   { return f.admin.Get(url) }

func forwardHeaders(token string) connect.ClientOption {
	return connect.WithInterceptors(cpclient.Bearer(token), connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(cpclient.HeaderForwarded, "1")
			if a := actorFrom(ctx); a != "" {
				req.Header().Set(cpclient.HeaderActor, a)
			}
			return next(ctx, req)
		}
	}))
}

// errNoLeader is what a node without a reachable leader answers: in a
// minority partition it must refuse rather than guess.
var errNoLeader = errors.New("no leader: this node cannot reach a quorum (election in progress or minority partition)")

// leaderURL returns the leader's API URL, or an error to return to the
// caller: forwarding loops and unknown leaders both end here. The error
// carries a NotLeader detail with what this node knows of the leader.
func (c *Core) leaderURL(h http.Header) (string, error) {
	id, _ := c.node.Leader()
	url := ""
	if id != "" {
		url = c.st.Members()[id]
	}
	switch {
	case h.Get(cpclient.HeaderForwarded) != "":
		return "", c.withLeader(connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s is not the leader either: %w", c.o.NodeID, errNoLeader)), id, url)
	case id == "":
		return "", c.withLeader(connect.NewError(connect.CodeUnavailable, errNoLeader), "", "")
	case url == "":
		return "", c.withLeader(connect.NewError(connect.CodeUnavailable, fmt.Errorf("leader %s has not published its API URL yet", id)), id, "")
	}
	return url, nil
}

// withLeader attaches the NotLeader detail (and, for clients that predate
// it, the Cart-Leader-Url metadata) to e.
func (c *Core) withLeader(e *connect.Error, id, url string) *connect.Error {
	if d, err := connect.NewErrorDetail(&cartv1.NotLeader{LeaderId: id, LeaderUrl: url}); err == nil {
		e.AddDetail(d)
	}
	if url != "" {
		e.Meta().Set(cpclient.HeaderLeaderURL, url)
	}
	return e
}

// forward is the first line of every handler only the leader may serve
// (Consul's ForwardRPC shape):
//
//	if resp, done, err := forward(ctx, c, req, (*forwarder).routerTo, cartv1connect.RouterServiceClient.Route); done {
//		return resp, err
//	}
//
// On the leader it returns done == false and the handler goes on. On a
// follower it passes the call to the leader and returns the leader's
// answer, or the NotLeader error when it cannot (no leader, a loop).
func forward[Req, Res, C any](ctx context.Context, c *Core, req *connect.Request[Req], to func(*forwarder, string) C,
	rpc func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], bool, error) {
	return forwardAs(ctx, c, req, to, rpc, false)
}

// forwardWrite is forward for writes: an answer lost after the call may
// have reached the leader is "outcome unknown", never "not done" (see
// forwardedWrite).
func forwardWrite[Req, Res, C any](ctx context.Context, c *Core, req *connect.Request[Req], to func(*forwarder, string) C,
	rpc func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error)) (*connect.Response[Res], bool, error) {
	return forwardAs(ctx, c, req, to, rpc, true)
}

func forwardAs[Req, Res, C any](ctx context.Context, c *Core, req *connect.Request[Req], to func(*forwarder, string) C,
	rpc func(C, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), write bool) (*connect.Response[Res], bool, error) {
	if c.node.IsLeader() {
		return nil, false, nil
	}
	url, err := c.leaderURL(req.Header())
	if err != nil {
		return nil, true, err
	}
	c.metrics.forwarded.WithLabelValues(req.Spec().Procedure).Inc()
	resp, err := rpc(to(c.fwd, url), ctx, connect.NewRequest(req.Msg))
	if write {
		resp, err = forwardedWrite(resp, err)
	}
	return resp, true, err
}

// forwardedWrite passes on the leader's answer to a forwarded write. When
// the call failed without an answer after it may have reached the leader
// (connection lost mid-call, deadline), the write's outcome is unknown,
// which the client must not read as "not done"; only a failed dial is
// certain not to have delivered it.
func forwardedWrite[T any](resp *connect.Response[T], err error) (*connect.Response[T], error) {
	if err == nil || connect.IsWireError(err) {
		return resp, err
	}
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		return nil, err
	}
	e := connect.NewError(connect.CodeAborted, fmt.Errorf("write outcome unknown, retry the same command (it is idempotent): forwarding to the leader failed: %w", err))
	e.Meta().Set(cpclient.HeaderWriteOutcome, cpclient.OutcomeUnknown)
	return nil, e
}
