package raftnode

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hashicorp/raft"
)

// The worker set as seen through the leader is linearizable under
// partitions: porcupine checks a history of concurrent upserts, removes and
// reads against a sequential set.

type setOpKind int

const (
	opAdd setOpKind = iota
	opRemove
	opRead
)

type setInput struct {
	kind setOpKind
	url  string
}

// removeOutput is an acknowledged remove's outcome: whether the worker
// was there.
type removeOutput struct {
	found bool
}

// unknownOutcome is the output of a write that failed without saying
// whether its entry committed: it either took effect or never will.
type unknownOutcome struct{}

// The model state is the sorted set joined with commas: comparable with ==
// and cheap to hash, which is what porcupine's state cache wants.
func setAdd(s, url string) string {
	items := splitSet(s)
	if i, ok := slices.BinarySearch(items, url); !ok {
		items = slices.Insert(items, i, url)
	}
	return strings.Join(items, ",")
}

func setRemove(s, url string) (string, bool) {
	items := splitSet(s)
	i, ok := slices.BinarySearch(items, url)
	if !ok {
		return s, false
	}
	return strings.Join(slices.Delete(items, i, i+1), ","), true
}

func splitSet(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// workerSetModel is nondeterministic only in writes of unknown outcome,
// which may or may not have happened; porcupine tracks the possible sets.
var workerSetModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{""} },
	Step: func(st, in, out any) []any {
		s, i := st.(string), in.(setInput)
		_, unknown := out.(unknownOutcome)
		switch i.kind {
		case opAdd:
			if unknown {
				return []any{setAdd(s, i.url), s}
			}
			return []any{setAdd(s, i.url)}
		case opRemove:
			next, found := setRemove(s, i.url)
			if unknown {
				return []any{next, s}
			}
			if out.(removeOutput).found != found {
				return nil
			}
			return []any{next}
		default:
			if out.(string) != s {
				return nil
			}
			return []any{s}
		}
	},
	Hash: func(st any) uint64 {
		h := fnv.New64a()
		_, _ = h.Write([]byte(st.(string)))
		return h.Sum64()
	},
	DescribeOperation: func(in, out any) string {
		i := in.(setInput)
		switch i.kind {
		case opAdd:
			return "add " + i.url
		case opRemove:
			return fmt.Sprintf("remove %s -> %+v", i.url, out)
		default:
			return fmt.Sprintf("read -> {%v}", out)
		}
	},
}).ToModel()

type history struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in setInput, call int64, out any, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// addUnknown records a write that failed at failed without saying whether
// it took effect.
func (h *history) addUnknown(client int, in setInput, call, failed int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: unknownOutcome{}, Return: unknownReturn, Metadata: failedAt(failed)})
}

// unknownReturn is the return time of a write whose outcome is unknown
// until seal bounds it: it may take effect at any point after its call, or
// never.
const unknownReturn = math.MaxInt64

// failedAt is the Metadata of a write with an unknown outcome: when its
// call returned the error.
type failedAt int64

// seal bounds writes of unknown outcome. Their entries were appended to
// some leader's log before the call failed; a read barrier that commits
// after that, on whichever leader, decides their fate: raft commits a
// leader's barrier together with every earlier entry of its log, and an
// entry of an older term that is not in that log can never be committed
// later (any later leader's log matches this one up to the barrier, and
// entries after it have newer terms). So such a write takes effect before
// the first successful read that started after it failed returns, or
// never (the model allows both). Bounding it there keeps porcupine's
// search small: with an unbounded return, every failed write is concurrent
// with the rest of the history and the checker can take minutes.
func seal(ops []porcupine.Operation) {
	for i := range ops {
		failed, ok := ops[i].Metadata.(failedAt)
		if !ok {
			continue
		}
		for _, o := range ops {
			if o.Input.(setInput).kind == opRead && o.Call > int64(failed) && o.Return < ops[i].Return {
				ops[i].Return = o.Return
			}
		}
	}
}

// notAppended reports errors after which the entry certainly is not in any
// log: raft refused it before appending.
func notAppended(err error) bool {
	if errors.Is(err, ErrOutcomeUnknown) {
		return false
	}
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress) ||
		errors.Is(err, raft.ErrRaftShutdown) || errors.Is(err, raft.ErrEnqueueTimeout)
}

func TestWorkerSetLinearizableUnderPartitions(t *testing.T) {
	c := newCluster(t, 3, clusterOpts{})
	h := &history{start: time.Now()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var stats struct{ ok, failed, reads, partitions atomic.Int64 }

	leader := func() *testNode {
		for _, tn := range c.nodes {
			if tn.node.IsLeader() {
				return tn
			}
		}
		return nil
	}

	for client := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(client), 99))
			// live are this client's URLs not yet targeted by a remove;
			// added is every URL it ever added (removing one of those
			// again exercises the "not found" outcome).
			var live, added []string
			for k := 0; ; k++ {
				// Pace the clients: porcupine's search grows quickly with
				// the history, and a few hundred operations per client
				// already interleave richly with the partitions.
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(2+r.IntN(4)) * time.Millisecond):
				}
				ld := leader()
				if ld == nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				switch p := r.IntN(10); {
				case p < 3 || len(added) == 0:
					url := fmt.Sprintf("http://c%d-%d:8000", client, k)
					live, added = append(live, url), append(added, url)
					in := setInput{kind: opAdd, url: url}
					call := h.now()
					_, err := ld.node.Apply(ctx, upsertCmd(url, 0))
					ret := h.now()
					switch {
					case err == nil:
						h.add(client, in, call, nil, ret)
						stats.ok.Add(1)
					case notAppended(err):
						stats.failed.Add(1) // never happened: not part of the history
					default:
						h.addUnknown(client, in, call, ret)
						stats.failed.Add(1)
					}
				case p < 6:
					var url string
					if len(live) > 0 && r.IntN(5) > 0 {
						i := r.IntN(len(live))
						url = live[i]
						live = slices.Delete(live, i, i+1)
					} else {
						url = added[r.IntN(len(added))]
					}
					in := setInput{kind: opRemove, url: url}
					call := h.now()
					res, err := ld.node.Apply(ctx, removeCmd(url))
					ret := h.now()
					switch {
					case err == nil:
						h.add(client, in, call, removeOutput{found: res.Err == nil}, ret)
						stats.ok.Add(1)
					case notAppended(err):
						stats.failed.Add(1)
					default:
						h.addUnknown(client, in, call, ret)
						stats.failed.Add(1)
					}
				default:
					// A linearizable read: the barrier commits in this
					// leader's term only if no newer leader exists, and
					// returns once everything before it is applied here.
					call := h.now()
					if err := ld.node.Raft().Barrier(time.Second).Error(); err != nil {
						cancel()
						continue // a failed read observed nothing
					}
					ws, _ := ld.st.Workers()
					urls := make([]string, len(ws))
					for i, w := range ws {
						urls[i] = w.URL
					}
					slices.Sort(urls)
					h.add(client, setInput{kind: opRead}, call, strings.Join(urls, ","), h.now())
					stats.reads.Add(1)
				}
				cancel()
			}
		}()
	}

	// The nemesis cuts one node off at a time (the leader half the time,
	// so in-flight writes end with unknown outcomes) and heals.
	r := rand.New(rand.NewPCG(42, 42))
	deadline := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(150+r.IntN(250)) * time.Millisecond)
		c.heal()
		if r.IntN(3) == 0 {
			continue // a healthy spell
		}
		victim := c.nodes[r.IntN(len(c.nodes))]
		if ld := leader(); ld != nil && r.IntN(2) == 0 {
			victim = ld
		}
		c.isolate(victim)
		stats.partitions.Add(1)
	}
	c.heal()
	time.Sleep(300 * time.Millisecond) // some operations on the healed cluster
	close(stop)
	wg.Wait()

	t.Logf("history: %d ops (%d writes acknowledged, %d failed, %d reads), %d partitions",
		len(h.ops), stats.ok.Load(), stats.failed.Load(), stats.reads.Load(), stats.partitions.Load())
	if stats.ok.Load() < 20 || stats.reads.Load() < 20 || stats.partitions.Load() < 3 {
		t.Fatalf("history too thin to mean anything")
	}
	seal(h.ops)
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(workerSetModel, h.ops, 20*time.Second)
	t.Logf("porcupine: %s in %v", res, time.Since(start))
	if res != porcupine.Ok {
		t.Fatalf("history is not linearizable (result %s)", res)
	}
	c.converge(10 * time.Second)
}
