package state

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Every body a RaftCommand can carry is either in the command registry or
// applied in steps by Apply: a new command that is neither would be
// silently skipped on every node.
func TestEveryCommandRegistered(t *testing.T) {
	fields := bodyField.Fields()
	if fields.Len() < 8 {
		t.Fatalf("RaftCommand.body has %d fields; the descriptor lookup is broken", fields.Len())
	}
	for i := range fields.Len() {
		name := fields.Get(i).Name()
		if lockedCommands[name] == nil && !stepped[name] {
			t.Errorf("RaftCommand body %s is neither registered nor stepped", name)
		}
	}
	for name := range lockedCommands {
		if fields.ByName(name) == nil {
			t.Errorf("registered command %s is no RaftCommand body", name)
		}
	}
}

// Each apply is timed under its command's name.
func TestApplyTimedPerCommand(t *testing.T) {
	st, _ := newTestState()
	a := &testApplier{t: t, st: st}
	a.apply(setWorkers("http://a", "http://b"))
	a.apply(&cartv1.RaftCommand{Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: "http://b"}}})
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://a", BlockHashes: []uint64{1, 2}, AtUnixNanos: 1}))
	a.apply(placeBatch(&cartv1.Placement{Worker: "http://a", BlockHashes: []uint64{3}, AtUnixNanos: 2}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(st.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "command" {
					got[l.GetValue()] = m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if got["set_workers"] != 1 || got["remove_worker"] != 1 || got["place_batch"] != 2 || len(got) != 3 {
		t.Fatalf("apply counts by command = %v, want set_workers 1, remove_worker 1, place_batch 2", got)
	}
}
