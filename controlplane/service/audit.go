package service

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"unicode"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/internal/credential"
)

// maxActorLen bounds the actor string a caller can make us log and
// replicate.
const maxActorLen = 200

type actorKey struct{}

// withActor records the actor in ctx for the forwarder to pass on.
func withActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorFrom(ctx context.Context) string {
	s, _ := ctx.Value(actorKey{}).(string)
	return s
}

// actor names the caller of an admin RPC as this node sees it: which
// credential it presented, from which address, and, for a call a
// follower forwarded, the actor that follower saw.
func (c *Core) actor(peer string, h http.Header) string {
	role := "no token"
	if got, ok := credential.BearerToken(h); ok {
		switch {
		case c.o.AdminToken != "" && credential.Equal(got, c.o.AdminToken):
			role = "admin token"
		case c.o.Token != "" && credential.Equal(got, c.o.Token):
			role = "cluster token"
		default:
			role = "unrecognised token"
		}
	}
	who := fmt.Sprintf("%s from %s", role, peer)
	if h.Get(cpclient.HeaderForwarded) != "" {
		if orig := sanitizeActor(h.Get(cpclient.HeaderActor)); orig != "" {
			who = fmt.Sprintf("%s (forwarded: %s)", orig, who)
		}
	}
	return sanitizeActor(who)
}

// sanitizeActor keeps a caller-influenced string printable and short.
func sanitizeActor(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, s)
	if len(s) > maxActorLen {
		s = s[:maxActorLen] + "..."
	}
	return s
}

// audit logs one admin action on this node with audit=true. Replicated
// changes are also logged by every node's state machine; this line covers
// what the log does not carry (who asked for a membership change or a
// leadership transfer).
func (c *Core) audit(msg string, args ...any) {
	c.log.Info(msg, append([]any{"audit", true, "node", c.o.NodeID}, args...)...)
}
