package state

import (
	"bytes"
	"testing"

	"github.com/cartrouter/cart/controlplane/engine"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func roles(st *State, eng *engine.Engine) (replicated, live map[string]engine.Role) {
	ws, _ := st.Workers()
	replicated, live = map[string]engine.Role{}, map[string]engine.Role{}
	for _, w := range ws {
		replicated[w.URL] = w.Role
	}
	locked(st, func() {
		for _, w := range eng.Workers() {
			live[w.URL] = w.Role
		}
	})
	return replicated, live
}

// A worker's role is replicated with the worker set, reaches the engine,
// survives snapshots, and a change of role is an update; entries from
// before roles (no role) read as both.
func TestWorkerRoleReplicatedAndSnapshotted(t *testing.T) {
	src, eng := newTestState()
	a := &testApplier{t: t, st: src}
	up := func(url, role string) {
		a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
			Worker: &cartv1.WorkerSpec{Url: url, Role: role}}}})
	}
	up("http://legacy:1", "")
	up("http://p:1", "prefill")
	up("http://d:1", "both")
	_, v := src.Workers()
	up("http://d:1", "decode")
	if _, v2 := src.Workers(); v2 == v {
		t.Fatal("a role change did not bump the worker-set version")
	}
	want := map[string]engine.Role{"http://legacy:1": engine.RoleBoth, "http://p:1": engine.RolePrefill, "http://d:1": engine.RoleDecode}
	rep, live := roles(src, eng)
	if !equalRoles(rep, want) || !equalRoles(live, want) {
		t.Fatalf("replicated %v, engine %v, want %v", rep, live, want)
	}
	var buf bytes.Buffer
	if err := src.Capture().Write(&buf); err != nil {
		t.Fatal(err)
	}
	dst, deng := newTestState()
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	rep, live = roles(dst, deng)
	if !equalRoles(rep, want) || !equalRoles(live, want) {
		t.Fatalf("restored: replicated %v, engine %v, want %v", rep, live, want)
	}
}

func equalRoles(a, b map[string]engine.Role) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
