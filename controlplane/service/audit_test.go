package service

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/cartrouter/cart/controlplane/cpclient"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/testkit"
)

// Worker-set changes carry who asked into the replicated command (so
// every node's state machine logs the same actor), through a follower's
// forwarding too; membership changes and leadership transfers, which the
// log does not carry an actor for, are logged with it by the node that
// handles the call.
func TestAdminAuditActor(t *testing.T) {
	auth := AuthOptions{Token: "cluster", AdminToken: "admin"}
	logs := &testkit.SyncBuffer{}
	leader := newTestCP(t, cpConfig{id: "n2", leader: true, auth: auth, opts: func(o *Options) {
		o.Token, o.AdminToken = "cluster", "admin"
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}})
	leader.st.SetAuditLog(slog.New(slog.NewTextHandler(logs, nil)))
	follower := newTestCP(t, cpConfig{id: "n1", auth: auth, opts: func(o *Options) { o.Token, o.AdminToken = "cluster", "admin" }})
	follower.setMember(t, "n2", leader.url)
	follower.node.setLeader(false, "n2")
	ctx := context.Background()
	asAdmin := connect.WithInterceptors(cpclient.Bearer("admin"))

	const w9 = "http://w9.test:8000"
	if _, err := follower.admin(connect.WithGRPC(), asAdmin).AddWorker(ctx, connect.NewRequest(&cartv1.AddWorkerRequest{Worker: &cartv1.Worker{Url: w9, MaxLoad: 4}})); err != nil {
		t.Fatalf("forwarded AddWorker: %v", err)
	}
	var actor string
	for _, c := range leader.node.commands() {
		if c.GetUpsertWorker().GetWorker().GetUrl() == w9 {
			actor = c.GetActor()
		}
	}
	// The client reached n1 with the admin token; n1 reached n2 with it too.
	if !strings.HasPrefix(actor, "admin token from 127.0.0.1:") || !strings.Contains(actor, "(forwarded: admin token from 127.0.0.1:") {
		t.Errorf("replicated actor = %q", actor)
	}
	if _, err := leader.admin(connect.WithGRPC(), asAdmin).RemoveWorker(ctx, connect.NewRequest(&cartv1.RemoveWorkerRequest{Url: w9})); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.admin(connect.WithGRPC(), asAdmin).AddVoter(ctx, connect.NewRequest(&cartv1.AddVoterRequest{Id: "n3", RaftAddress: "127.0.0.1:7003", ApiUrl: "http://n3.test"})); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.admin(connect.WithGRPC(), asAdmin).TransferLeadership(ctx, connect.NewRequest(&cartv1.TransferLeadershipRequest{Id: "n3"})); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{
		`msg="audit: worker added" audit=true`,
		`worker=http://w9.test:8000 old=(none) new="http://w9.test:8000 max_load=4`,
		`msg="audit: worker removed" audit=true`,
		`msg="audit: voter added" audit=true node=n2 actor="admin token from 127.0.0.1:`,
		`new="[n2@127.0.0.1:7000(voter), n3@127.0.0.1:7003(voter)]"`,
		`msg="audit: member API URL set" audit=true`,
		`msg="audit: leadership transferred" audit=true node=n2 actor="admin token from 127.0.0.1:`,
		`old=n2 new=n3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("audit log lacks %s\n%s", want, out)
		}
	}
}

func TestActorSanitized(t *testing.T) {
	got := sanitizeActor("evil\nline" + strings.Repeat("x", 300))
	if strings.Contains(got, "\n") || len(got) > maxActorLen+3 {
		t.Errorf("sanitized actor %q", got)
	}
}
