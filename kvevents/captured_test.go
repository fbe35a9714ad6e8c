package kvevents

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cartrouter/cart/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite testdata/vllm from the generator below")

// capturedMsg is one ZMQ message as testdata holds it: which socket
// received it ("pub": the SUB socket; "replay": a DEALER's replay answer;
// "restart": a marker, the publisher restarted here) and its frames in hex.
type capturedMsg struct {
	Socket string   `json:"socket"`
	Frames []string `json:"frames"`
}

func (m capturedMsg) frames(t testing.TB) [][]byte {
	out := make([][]byte, len(m.Frames))
	for i, f := range m.Frames {
		b, err := hex.DecodeString(f)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

func loadCaptured(t testing.TB, path string) []capturedMsg {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []capturedMsg
	if err := json.Unmarshal(b, &msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func writeCaptured(t testing.TB, path string, msgs []capturedMsg) {
	t.Helper()
	lines := make([]string, len(msgs))
	for i, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = string(b)
	}
	if err := os.WriteFile(path, []byte("[\n"+strings.Join(lines, ",\n")+"\n]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// capture is a publisher's recorded session: its stream up to a restart,
// the replay answer to a request from replayFrom, and the stream after.
type capture struct {
	before, after []Message
	replay        [][][]byte
	replayFrom    int64
}

func splitCapture(t testing.TB, msgs []capturedMsg) capture {
	var c capture
	restarted := false
	for _, m := range msgs {
		switch m.Socket {
		case "restart":
			restarted = true
		case "replay":
			c.replay = append(c.replay, m.frames(t))
		case "pub":
			msg, err := ParseMessage(m.frames(t))
			if err != nil {
				t.Fatalf("captured message: %v", err)
			}
			if restarted {
				c.after = append(c.after, msg)
			} else {
				c.before = append(c.before, msg)
			}
		}
	}
	if len(c.replay) == 0 || len(c.before) < 3 || len(c.after) == 0 {
		t.Fatalf("capture incomplete: %d before, %d replayed, %d after", len(c.before), len(c.replay), len(c.after))
	}
	first, err := ParseReplayAnswer(c.replay[0])
	if err != nil {
		t.Fatal(err)
	}
	c.replayFrom = first.Seq
	return c
}

var captures = []string{
	"vllm/map.json", "vllm/array.json",
	"llm-d-inference-sim/array.json", "llm-d-inference-sim/map.json",
}

// Every publisher's captured session syncs: the stream is known from its
// first batch, a gap is filled from the captured replay answer, and the
// restart is followed by a known stream again, with no batch lost.
func TestSyncWithCapturedFrames(t *testing.T) {
	for _, name := range captures {
		t.Run(name, func(t *testing.T) {
			c := splitCapture(t, loadCaptured(t, filepath.Join("testdata", name)))
			for _, m := range slices.Concat(c.before, c.after) {
				if _, err := Decode(m.Payload); err != nil {
					t.Fatalf("seq %d: %v", m.Seq, err)
				}
			}
			// The whole stream, then a gap: the publisher's second-to-last
			// batch before the restart is missed and replayed.
			miss := c.before[len(c.before)-2].Seq
			if miss < c.replayFrom {
				t.Fatalf("the capture replays from %d, after the batch to miss (%d)", c.replayFrom, miss)
			}
			sink := &syncSink{}
			var asked []int64
			s := &Subscriber{
				cfg: SubscriberConfig{
					Topics: map[string]Route{"": {Worker: "w", ReplayEndpoint: "tcp://engine:5558", PayloadRank: true}},
					Sink:   func(string, int) StreamSink { return sink },
					Replay: func(_ context.Context, _ string, from, to int64) ([]Message, error) {
						asked = append(asked, from)
						var out []Message
						for _, fr := range c.replay {
							m, err := ParseReplayAnswer(fr)
							if err != nil {
								return out, err
							}
							if m.Seq == EndOfReplay {
								break
							}
							if m.Seq >= from {
								out = append(out, m)
							}
						}
						return out, nil
					},
					ReplayTimeout: time.Second,
				},
				log: discard(), ctx: context.Background(), streams: map[streamKey]*stream{}, lastRank: map[string]int{},
			}
			for _, m := range c.before {
				if m.Seq != miss {
					s.handle(m)
				}
			}
			for _, m := range c.after {
				s.handle(m)
			}
			if sink.lost > 0 || sink.unsynced > 0 {
				t.Fatalf("%d lost gaps, %d batches applied unsynced (replays asked from %v)", sink.lost, sink.unsynced, asked)
			}
			if !slices.Equal(asked, []int64{miss}) || sink.replayed != 1 {
				t.Fatalf("replays asked from %v (%d filled), want one from %d", asked, sink.replayed, miss)
			}
			if want := len(c.before) + len(c.after); sink.batches != want || sink.restarts != 1 {
				t.Fatalf("%d batches applied, %d restarts; want %d and 1", sink.batches, sink.restarts, want)
			}
		})
	}
}

// syncSink counts what a stream's sink is told.
type syncSink struct {
	batches, unsynced, restarts, replayed, lost int
}

func (s *syncSink) Batch(_ Batch, synced bool) {
	s.batches++
	if !synced {
		s.unsynced++
	}
}
func (s *syncSink) Restarted()            { s.restarts++ }
func (s *syncSink) Replayed(int64, int64) { s.replayed++ }
func (s *syncSink) Lost(int64, int64)     { s.lost++ }

// The captured llm-d-inference-sim frames through real sockets, in the
// layout the sim uses: its PUB dials CART's guarded listen socket, and a
// ROUTER answers a replay with the captured answer frames.
func TestCapturedSimFramesOverSockets(t *testing.T) {
	c := splitCapture(t, loadCaptured(t, "testdata/llm-d-inference-sim/map.json"))
	topic := string(c.before[0].Topic)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := zmq4.NewRouter(ctx)
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer router.Close()
	go func() {
		for {
			req, err := router.Recv()
			if err != nil {
				return
			}
			for _, fr := range c.replay {
				_ = router.Send(zmq4.NewMsgFrom(append([][]byte{req.Frames[0]}, fr...)...))
			}
		}
	}()
	sink := &recSink{}
	s := newSubscriber(t, SubscriberConfig{
		Endpoint: "tcp://127.0.0.1:0", Listen: true,
		Topics: map[string]Route{topic: {Worker: "http://sim", ReplayEndpoint: "tcp://" + router.Addr().String(), PayloadRank: true}},
		Sink:   func(string, int) StreamSink { return sink },
	})
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Dial("tcp://" + s.Addr().String()); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the subscription", func() bool {
		ts, _ := pub.(zmq4.Topics)
		return ts != nil && len(ts.Topics()) > 0
	})
	// Batch 2 is lost on the way; the rest arrive.
	for _, m := range c.before {
		if m.Seq != 2 {
			if err := pub.Send(zmq4.NewMsgFrom([]byte(m.Topic), SeqBytes(m.Seq), m.Payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := sink.waitLen(t, 1)
	testkit.WaitForMsg(t, 10*time.Second, "the gap replayed", func() (bool, string) {
		got = sink.entries()
		return slices.Contains(got, "replayed:2-3"), fmt.Sprint(got)
	})
	for _, e := range got {
		if strings.HasPrefix(e, "lost") || strings.HasSuffix(e, ":false") {
			t.Fatalf("not synced: %v", got)
		}
	}
}

// The vLLM frames are built from vllm/distributed/kv_events.py as msgspec
// encodes its structs (see testdata/README.md). go test -run TestVLLMFrames
// -update rewrites them; without -update the files must match.
func TestVLLMFrames(t *testing.T) {
	for _, layout := range []string{"map", "array"} {
		path := filepath.Join("testdata", "vllm", layout+".json")
		want := vllmSession(t, layout == "array")
		if *update {
			writeCaptured(t, path, want)
			continue
		}
		got := loadCaptured(t, path)
		if !slices.EqualFunc(got, want, func(a, b capturedMsg) bool { return a.Socket == b.Socket && slices.Equal(a.Frames, b.Frames) }) {
			t.Fatalf("%s differs from the generator (run with -update after checking why)", path)
		}
	}
}

// vllmSession is what a vLLM ZmqEventPublisher (topic "") sends for five
// scheduler steps, a replay request from 2 (as a DEALER receives the
// ROUTER's [identity, "", seq, payload]: the identity stripped), and its
// first step after a restart.
func vllmSession(t testing.TB, arrayLike bool) []capturedMsg {
	h := []uint64{0x9f3a5c7e1b2d4f60, 0x12ab34cd56ef7890, 0xfedcba9876543210, 0x0000000000000042}
	tokens := func(from, n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = uint64(from + i*37) // ids up to a 128K vocabulary: fixints to uint32s
		}
		return out
	}
	parent := h[1]
	steps := [][]vllmEvent{
		{vStored(arrayLike, h[:2], nil, tokens(1, 32))},
		{vStored(arrayLike, h[2:3], &parent, tokens(100000, 16))},
		{vRemoved(arrayLike, h[:1])},
		{vRemoved(arrayLike, h[1:3]), vStored(arrayLike, h[3:4], nil, tokens(7, 16))},
		{vCleared()},
	}
	var msgs []capturedMsg
	payloads := make([][]byte, len(steps))
	for seq, evs := range steps {
		payloads[seq] = vllmBatch(t, arrayLike, 1765000000.25+float64(seq)/8, evs)
		msgs = append(msgs, hexMsg("pub", nil, SeqBytes(int64(seq)), payloads[seq]))
	}
	for seq := 2; seq < len(steps); seq++ {
		msgs = append(msgs, hexMsg("replay", []byte{}, SeqBytes(int64(seq)), payloads[seq]))
	}
	msgs = append(msgs, hexMsg("replay", []byte{}, SeqBytes(EndOfReplay), []byte{}))
	msgs = append(msgs, capturedMsg{Socket: "restart", Frames: []string{}})
	msgs = append(msgs, hexMsg("pub", nil, SeqBytes(0), vllmBatch(t, arrayLike, 1765000100.5, []vllmEvent{vStored(arrayLike, h[:1], nil, tokens(1, 16))})))
	return msgs
}

func hexMsg(socket string, frames ...[]byte) capturedMsg {
	m := capturedMsg{Socket: socket, Frames: make([]string, len(frames))}
	for i, f := range frames {
		m.Frames[i] = hex.EncodeToString(f)
	}
	return m
}

// vllmEvent is a msgspec struct as encoded: its field names and values in
// declaration order (tag first), without the fields omit_defaults drops.
type vllmEvent [][2]any

// vStored: BlockStored, whose fields block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, lora_name have no default and are always
// sent; extra_keys, group_idx and the kv_cache_spec fields default to None
// and are omitted. The older array_like releases had no lora_name.
func vStored(arrayLike bool, hashes []uint64, parent *uint64, tokens []any) vllmEvent {
	hs := make([]any, len(hashes))
	for i, x := range hashes {
		hs[i] = x
	}
	var p any
	if parent != nil {
		p = *parent
	}
	ev := vllmEvent{{"type", "BlockStored"}, {"block_hashes", hs}, {"parent_block_hash", p}, {"token_ids", tokens},
		{"block_size", uint64(16)}, {"lora_id", nil}, {"medium", "GPU"}}
	if !arrayLike {
		ev = append(ev, [2]any{"lora_name", nil})
	}
	return ev
}

func vRemoved(_ bool, hashes []uint64) vllmEvent {
	hs := make([]any, len(hashes))
	for i, x := range hashes {
		hs[i] = x
	}
	return vllmEvent{{"type", "BlockRemoved"}, {"block_hashes", hs}, {"medium", "GPU"}}
}

func vCleared() vllmEvent { return vllmEvent{{"type", "AllBlocksCleared"}} }

// vllmBatch encodes KVEventBatch(ts, events, data_parallel_rank=0) as
// msgspec does: a map of its fields (or, array_like, an array of their
// values), integers in their shortest msgpack form, floats as float64, None
// as nil; a tagged event's tag is its first field ("type") or element.
func vllmBatch(t testing.TB, arrayLike bool, ts float64, events []vllmEvent) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	fields := func(fs [][2]any) {
		if arrayLike {
			must(e.EncodeArrayLen(len(fs)))
		} else {
			must(e.EncodeMapLen(len(fs)))
		}
		for _, f := range fs {
			if !arrayLike {
				must(e.EncodeString(f[0].(string)))
			}
			switch v := f[1].(type) {
			case []vllmEvent:
				must(e.EncodeArrayLen(len(v)))
				for _, ev := range v {
					if arrayLike {
						must(e.EncodeArrayLen(len(ev)))
					} else {
						must(e.EncodeMapLen(len(ev)))
					}
					for _, kv := range ev {
						if !arrayLike {
							must(e.EncodeString(kv[0].(string)))
						}
						must(e.Encode(kv[1]))
					}
				}
			default:
				must(e.Encode(v))
			}
		}
	}
	fields([][2]any{{"ts", ts}, {"events", events}, {"data_parallel_rank", uint64(0)}})
	return buf.Bytes()
}
