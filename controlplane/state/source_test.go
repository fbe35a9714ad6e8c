package state

import (
	"bytes"
	"testing"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func upsert(url, source string) *cartv1.RaftCommand {
	return &cartv1.RaftCommand{Body: &cartv1.RaftCommand_UpsertWorker{UpsertWorker: &cartv1.UpsertWorkerCommand{
		Worker: &cartv1.WorkerSpec{Url: url, Source: source}}}}
}

func sources(st *State) map[string]string {
	ws, _ := st.Workers()
	out := map[string]string{}
	for _, w := range ws {
		out[w.URL] = w.Source
	}
	return out
}

// A worker's source is replicated and survives snapshots, so a new leader's
// discovery knows which workers are its own; entries from before sources
// existed read as static.
func TestWorkerSourceReplicatedAndSnapshotted(t *testing.T) {
	src, _ := newTestState()
	a := &testApplier{t: t, st: src}
	a.apply(upsert("http://legacy:1", ""))
	a.apply(upsert("http://d:1", SourceDNS))
	a.apply(upsert("http://c:1", SourceAdmin))
	_, v := src.Workers()
	a.apply(upsert("http://d:1", SourceDNS)) // idempotent re-apply
	if _, v2 := src.Workers(); v2 != v {
		t.Fatalf("re-applying the same upsert bumped the version %d -> %d", v, v2)
	}
	want := map[string]string{"http://legacy:1": SourceStatic, "http://d:1": SourceDNS, "http://c:1": SourceAdmin}
	if got := sources(src); !equal(got, want) {
		t.Fatalf("sources = %v, want %v", got, want)
	}
	var buf bytes.Buffer
	if err := src.Capture().Write(&buf); err != nil {
		t.Fatal(err)
	}
	dst, _ := newTestState()
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := sources(dst); !equal(got, want) {
		t.Fatalf("restored sources = %v, want %v", got, want)
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
