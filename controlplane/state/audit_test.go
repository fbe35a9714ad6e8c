package state

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Every worker-set and directory change is logged with its actor and
// old -> new; re-applying the same values logs nothing.
func TestAuditLog(t *testing.T) {
	s, _ := newTestState()
	var buf bytes.Buffer
	s.SetAuditLog(slog.New(slog.NewTextHandler(&buf, nil)))
	var index uint64
	apply := func(cmd *cartv1.RaftCommand) {
		t.Helper()
		index++
		cmd.Actor = "admin token from 192.0.2.1:5"
		data, err := Encode(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Apply(index, data); err != nil {
			t.Fatal(err)
		}
	}
	spec := func(url string, maxLoad uint32) *cartv1.WorkerSpec {
		return &cartv1.WorkerSpec{Url: url, MaxLoad: maxLoad}
	}
	upsert := func(w *cartv1.WorkerSpec) *cartv1.RaftCommand {
		return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{Worker: w}}}
	}
	apply(upsert(spec("http://a:1", 4)))
	apply(upsert(spec("http://a:1", 4))) // no change
	apply(upsert(spec("http://a:1", 8)))
	apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetWorkers{SetWorkers: &cartv1.SetWorkersCommand{Workers: []*cartv1.WorkerSpec{spec("http://b:1", 2)}}}})
	apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: "http://b:1"}}})
	apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: "n1", ApiUrl: "http://n1:1"}}})
	apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_SetMember{SetMember: &cartv1.SetMemberCommand{NodeId: "n1", ApiUrl: "http://n1:1"}}})
	apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveMember{RemoveMember: &cartv1.RemoveMemberCommand{NodeId: "n1"}}})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`msg="audit: worker added" audit=true index=1 actor="admin token from 192.0.2.1:5" request_id="" worker=http://a:1 old=(none) new="http://a:1 max_load=4 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0"`,
		`msg="audit: worker updated" audit=true index=3 actor="admin token from 192.0.2.1:5" request_id="" worker=http://a:1 old="http://a:1 max_load=4 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0" new="http://a:1 max_load=8 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0"`,
		`msg="audit: worker set replaced" audit=true index=4 actor="admin token from 192.0.2.1:5" request_id="" old="[http://a:1 max_load=8 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0]" new="[http://b:1 max_load=2 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0]"`,
		`msg="audit: worker removed" audit=true index=5 actor="admin token from 192.0.2.1:5" request_id="" worker=http://b:1 old="http://b:1 max_load=2 max_concurrency=0 load_penalty=0 cache_capacity_tokens=0" new=(none)`,
		`msg="audit: member API URL set" audit=true index=6 actor="admin token from 192.0.2.1:5" request_id="" member=n1 old=(none) new=http://n1:1`,
		`msg="audit: member removed from the node directory" audit=true index=8 actor="admin token from 192.0.2.1:5" request_id="" member=n1 old=http://n1:1 new=(none)`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d audit lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], "level=INFO "+w) {
			t.Errorf("line %d:\n got  %s\n want ...level=INFO %s", i, lines[i], w)
		}
	}
}
