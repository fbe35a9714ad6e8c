package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// endpoint is one control-plane server and its API clients.
type endpoint struct {
	url    string
	admin  cartv1connect.AdminServiceClient
	router cartv1connect.RouterServiceClient
}

// controlPlane is the list of servers a command may use, in order.
type controlPlane struct {
	endpoints []endpoint
	timeout   time.Duration
	clients   []*http.Client
}

// dial builds clients for every configured server. Nothing connects yet.
func dial(s *settings) (*controlPlane, error) {
	cp := &controlPlane{timeout: s.timeout}
	var h2c, tlsClient *http.Client
	opts := []connect.ClientOption{connect.WithGRPC(), connect.WithReadMaxBytes(cpclient.MaxAnswerBytes)}
	if s.token != "" {
		opts = append(opts, connect.WithInterceptors(cpclient.Bearer(s.token)))
	}
	for _, u := range s.servers {
		var hc *http.Client
		if strings.HasPrefix(u, "https://") {
			if tlsClient == nil {
				c, err := httpsClient(s.tls)
				if err != nil {
					return nil, usagef("TLS settings: %v", err)
				}
				tlsClient = c
				cp.clients = append(cp.clients, c)
			}
			hc = tlsClient
		} else {
			if h2c == nil {
				h2c = cpclient.NewWithTLS(nil)
				cp.clients = append(cp.clients, h2c)
			}
			hc = h2c
		}
		cp.endpoints = append(cp.endpoints, endpoint{
			url:    u,
			admin:  cartv1connect.NewAdminServiceClient(hc, u, opts...),
			router: cartv1connect.NewRouterServiceClient(hc, u, opts...),
		})
	}
	return cp, nil
}

// httpsClient verifies servers with the configured CA, or with the system
// roots when https:// is used without any TLS settings (a control plane
// behind a publicly trusted certificate).
func httpsClient(c config.ClientTLS) (*http.Client, error) {
	if c == (config.ClientTLS{}) {
		return cpclient.NewWithTLS(&tls.Config{MinVersion: tls.VersionTLS12}), nil
	}
	return cpclient.New(c)
}

// close drops idle connections: a CLI run is over, and keeping them would
// only hold server-side state (and block an in-process test server's
// Close) until the process exits.
func (cp *controlPlane) close() {
	for _, c := range cp.clients {
		c.CloseIdleConnections()
	}
}

// call runs rpc against each server in turn until one answers or fails
// with something other than Unavailable. Any member can serve any call
// (followers forward to the leader), so the order only expresses
// preference.
func call[Res any](ctx context.Context, cp *controlPlane, rpc func(context.Context, endpoint) (*connect.Response[Res], error)) (*Res, error) {
	var attempts []attempt
	for _, e := range cp.endpoints {
		resp, err := rpc(ctx, e)
		if err == nil {
			return resp.Msg, nil
		}
		attempts = append(attempts, attempt{server: e.url, err: err})
		if !failover(err) || ctx.Err() != nil {
			break
		}
	}
	return nil, &rpcError{attempts: attempts, timeout: cp.timeout}
}

// adminCall is call for one admin RPC, named by its method expression
// (cartv1connect.AdminServiceClient.AddWorker, ...).
func adminCall[Req, Res any](ctx context.Context, cp *controlPlane,
	rpc func(cartv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	return call(ctx, cp, func(ctx context.Context, e endpoint) (*connect.Response[Res], error) {
		return rpc(e.admin, ctx, connect.NewRequest(req))
	})
}

// session is what a command that talks to the control plane works with.
type session struct {
	*settings
	cp  *controlPlane
	out io.Writer
}

// report writes resp as JSON under -o json, and otherwise the one-line
// summary that format and args make.
func (s *session) report(resp proto.Message, format string, args ...any) error {
	if s.output == outputJSON {
		return writeJSON(s.out, resp)
	}
	_, err := fmt.Fprintf(s.out, format+"\n", args...)
	return err
}

// withSession resolves settings, dials and runs fn under the --timeout
// deadline. The deadline covers the whole command, including
// read-modify-write sequences and failover, so a script's worst case is
// bounded by one number.
func (a *app) withSession(cmd *cobra.Command, fn func(ctx context.Context, s *session) error) error {
	st, err := a.settings(cmd.Flags())
	if err != nil {
		return err
	}
	for _, w := range st.warnings {
		fmt.Fprintf(a.stderr, "cartctl: warning: %s\n", w)
	}
	if err := checkCleartext(st); err != nil {
		return err
	}
	cp, err := dial(st)
	if err != nil {
		return err
	}
	defer cp.close()
	ctx, cancel := context.WithTimeout(cmd.Context(), st.timeout)
	defer cancel()
	return fn(ctx, &session{settings: st, cp: cp, out: cmd.OutOrStdout()})
}
