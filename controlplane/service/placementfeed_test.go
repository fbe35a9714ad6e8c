package service

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// The ring keeps the newest placements; a reader behind it is told how
// many it missed, and nothing is recorded while nobody reads.
func TestPlacementFeedRing(t *testing.T) {
	f := newPlacementFeed(4)
	f.add("w0", "dp1", 7, []uint64{1})
	if f.head() != 0 {
		t.Fatal("recorded a placement with no reader")
	}
	f.readers.Add(1)
	for i := range 6 {
		f.add("w"+string(rune('a'+i)), "dp1", 7, []uint64{uint64(i), uint64(i + 100)})
	}
	f.add("", "dp1", 7, []uint64{1})
	f.add("wz", "dp1", 7, nil)
	got, _, next, skipped := f.read(0, 3, feedFrameBytes)
	if skipped != 2 || next != 5 || len(got) != 3 || got[0].GetWorker() != "wc" || !slices.Equal(got[2].GetHashes(), []uint64{4, 104}) {
		t.Fatalf("read(0, 3) = %v, next %d, skipped %d", got, next, skipped)
	}
	got, _, next, skipped = f.read(next, 10, feedFrameBytes)
	if skipped != 0 || next != 6 || len(got) != 1 || got[0].GetWorker() != "wf" {
		t.Fatalf("read(5, 10) = %v, next %d, skipped %d", got, next, skipped)
	}
	// The copy handed out does not change when the slot is reused.
	f.add("wg", "dp1", 7, []uint64{9, 9})
	f.add("wh", "dp1", 7, []uint64{9, 9})
	f.add("wi", "dp1", 7, []uint64{9, 9})
	f.add("wj", "dp1", 7, []uint64{9, 9})
	if got[0].GetWorker() != "wf" || !slices.Equal(got[0].GetHashes(), []uint64{5, 105}) {
		t.Fatalf("handed-out placement changed: %v", got[0])
	}
}

// A stream whose hello asks for the feed receives every placement the
// leader makes, for any data plane, as checkpoint hashes; dry runs are
// not placements, and a stream that did not ask gets only its answers.
func TestStreamPlacementFeed(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	cp.addWorkers(t, w1, w2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fed := cp.router().Stream(ctx)
	defer func() { _ = fed.CloseRequest(); _ = fed.CloseResponse() }()
	if err := fed.Send(&cartv1.StreamRequest{PlacementFeed: &cartv1.PlacementFeed{}}); err != nil {
		t.Fatal(err)
	}
	if m, err := fed.Receive(); err != nil || m.GetId() != 0 || m.GetPlacements() == nil || len(m.GetPlacements().GetPlacements()) != 0 {
		t.Fatalf("hello asking for the feed answered %v, %v; want an empty placements frame", m, err)
	}
	plain := openStream(t, cp)
	var hashes []uint64
	for i := range 20 {
		hashes = append(hashes, uint64(1000+i))
	}
	// The feed starts with the hello's answer; wait until it reads.
	deadline := time.Now().Add(5 * time.Second)
	for cp.core.placements.readers.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if _, err := cp.router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", BlockHashes: hashes[:5], KeyLength: 320, DataplaneId: "dp2", DryRun: true})); err != nil {
		t.Fatal(err)
	}
	r, err := cp.router().Route(ctx, connect.NewRequest(&cartv1.RouteRequest{Model: "m", BlockHashes: hashes, KeyLength: 1280, DataplaneId: "dp2", RouteId: 42}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := fed.Receive()
	if err != nil || m.GetId() != 0 {
		t.Fatalf("feed frame %v, %v", m, err)
	}
	p := m.GetPlacements().GetPlacements()
	if len(p) != 1 || p[0].GetWorker() != r.Msg.GetWorker() || !slices.Equal(p[0].GetHashes(), index.Checkpoints(nil, hashes)) || m.GetPlacements().GetSkipped() != 0 ||
		p[0].GetDataplaneId() != "dp2" || p[0].GetRouteId() != 42 {
		t.Fatalf("feed frame %v; want the one placement on %s", m, r.Msg.GetWorker())
	}
	var sent dto.Metric
	if err := cp.core.metrics.feedSent.Write(&sent); err != nil || sent.GetCounter().GetValue() != 1 {
		got := sent.GetCounter().GetValue()
		t.Fatalf("cart_cp_placement_feed_sent_total = %v, want 1", got)
	}
	// The stream without the feed: its next message answers its call.
	if err := plain.Send(&cartv1.StreamRequest{Id: 3, Call: &cartv1.StreamRequest_Sync{Sync: &cartv1.SyncRequest{DataplaneId: "dp1"}}}); err != nil {
		t.Fatal(err)
	}
	if a, err := plain.Receive(); err != nil || a.GetId() != 3 || a.GetSync() == nil {
		t.Fatalf("stream without the feed got %v, %v", a, err)
	}
}

// BenchmarkPlacementFeed is the leader's cost of the feed per placement:
// recording it and reading it for four streams, framing included, for a
// prompt of 80 blocks (10k characters at 128-character blocks).
func BenchmarkPlacementFeed(b *testing.B) {
	f := newPlacementFeed(feedRing)
	f.readers.Add(4)
	hashes := make([]uint64, 80)
	for i := range hashes {
		hashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	cursors := make([]uint64, 4)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f.add("http://worker-1:8000", "dp1", 7, hashes)
		if i%64 == 63 {
			for r := range cursors {
				batch, _, next, _ := f.read(cursors[r], feedFrameMax, feedFrameBytes)
				cursors[r] = next
				if _, err := proto.Marshal(&cartv1.StreamResponse{Result: &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{Placements: batch}}}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}

// A feed frame stays within what a data plane reads
// (cpclient.MaxAnswerBytes), whatever the placements carry: a
// dataplane_id or worker URL is bounded only by the 4 MiB request, so
// frames are cut by size as well as by count. A frame over the limit
// would end every fed data plane's stream, and the next one again.
func TestFeedFramesStayWithinTheReadLimit(t *testing.T) {
	cp := newTestCP(t, cpConfig{leader: true})
	f := cp.core.placements
	f.readers.Add(1)
	defer f.readers.Add(-1)
	id := strings.Repeat("d", 64<<10)
	for i := range feedFrameMax {
		f.add(w1, id, uint64(i+1), []uint64{uint64(i)})
	}
	var sizes []int
	n := 0
	next := cp.core.feedTick(0, func(m *cartv1.StreamResponse, placementBytes int) {
		sizes = append(sizes, proto.Size(m))
		n += len(m.GetPlacements().GetPlacements())
		// The size handed to the stream stands for the frame's cost
		// there: never below it, and over it by at most the overhead.
		if cost := streamAnswerCost(m); cost > placementBytes+feedFrameOverhead || cost < placementBytes {
			t.Errorf("frame of %d placements: %d placement bytes (+%d) given, cost %d", len(m.GetPlacements().GetPlacements()), placementBytes, feedFrameOverhead, cost)
		}
	})
	if n != feedFrameMax || next != feedFrameMax {
		t.Fatalf("sent %d of %d placements, cursor %d", n, feedFrameMax, next)
	}
	for _, sz := range sizes {
		if sz > feedFrameBytes+len(id)+1024 || sz > cpclient.MaxAnswerBytes {
			t.Fatalf("frames of %v bytes, want each within %d (plus one placement)", sizes, feedFrameBytes)
		}
	}
	// Ordinary placements still share a frame up to feedFrameMax.
	for i := range feedFrameMax {
		f.add(w1, "dp1", uint64(i+1), []uint64{uint64(i)})
	}
	frames := 0
	cp.core.feedTick(next, func(m *cartv1.StreamResponse, placementBytes int) {
		frames++
		if cost := streamAnswerCost(m); cost > placementBytes+feedFrameOverhead || cost < placementBytes {
			t.Errorf("frame of %d placements: %d placement bytes (+%d) given, cost %d", len(m.GetPlacements().GetPlacements()), placementBytes, feedFrameOverhead, cost)
		}
	})
	if frames != 1 {
		t.Fatalf("%d small placements went in %d frames, want 1", feedFrameMax, frames)
	}
}

// placementSize must be proto.Size exactly, or frames would be cut at the
// wrong size; a field added to RecentPlacement must be added to it too.
func TestPlacementSizeIsTheEncodedSize(t *testing.T) {
	if n := (&cartv1.RecentPlacement{}).ProtoReflect().Descriptor().Fields().Len(); n != 4 {
		t.Fatalf("RecentPlacement has %d fields; placementSize counts 4", n)
	}
	for _, p := range []*cartv1.RecentPlacement{
		{},
		{Worker: w1},
		{Hashes: []uint64{1, 1 << 63}},
		{DataplaneId: "dp1", RouteId: 1},
		{Worker: w1, Hashes: make([]uint64, 300), DataplaneId: strings.Repeat("d", 200), RouteId: 1 << 63},
	} {
		if got, want := placementSize(p), proto.Size(p); got != want {
			t.Errorf("placementSize(%v) = %d, proto.Size %d", p, got, want)
		}
	}
}
