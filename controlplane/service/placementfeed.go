package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/cartrouter/cart/controlplane/index"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/internal/every"
)

// The placement feed tells each data plane that asked for it
// (StreamRequest.placement_feed in its stream's hello) every placement the
// leader makes, in order. A data plane's shadow index keeps its fallback
// cache-aware while the leader cannot answer (an election, a cut link),
// but one fed only its own answers agrees with the pool's caches on only
// about half of the prompts when two data planes share the traffic: the
// last placement of a prefix was as likely made for the other one. Its
// own answers come through the feed too, so the shadow sees every
// placement in the leader's order (a data plane's answer and a later feed
// frame naming an earlier placement for another data plane would
// otherwise arrive out of order). Placements travel as checkpoint hashes
// (index.Checkpoints), a fraction of the prompt's.

const (
	// feedRing bounds the placements the leader keeps for its streams: at
	// 5k routes/s about 3 s of them; a stream further behind skips.
	feedRing = 16384
	// feedFrameMax bounds one frame; feedTickMax what one stream is sent
	// per tick (older ones are skipped: an old hint is worth little).
	feedFrameMax = 512
	feedTickMax  = 4096
	// feedFrameBytes bounds one frame's encoding too (a frame of one
	// larger placement still goes): a placement's worker URL and
	// dataplane_id are bounded only by the 4 MiB request that made it,
	// and a frame over cpclient.MaxAnswerBytes would end the stream
	// of every data plane fed, again on each new stream. 1 MiB is well
	// above 512 ordinary placements (~1.3 KiB each).
	feedFrameBytes = 1 << 20
	// feedFrameOverhead bounds what a frame adds to its placements' bytes
	// as an answer in a stream message: its skipped count (11 bytes at
	// most) and the tags and lengths of the frame, the answer and its
	// place in StreamResponse.more (under 4 each).
	feedFrameOverhead = 32
	// feedTick is how often a stream is sent what accumulated: how stale
	// the feed is, and the frames per second per stream.
	feedTick = 50 * time.Millisecond
)

// placementFeed is the ring the leader's Route decisions are written to
// and the streams read from. Decisions are recorded only while a stream
// reads. Each placement's message is built once and never changed, so
// every stream sends the same one.
type placementFeed struct {
	readers atomic.Int32
	mu      sync.Mutex
	ring    []feedEntry
	next    uint64 // sequence number of the next placement
}

// feedEntry is a placement with what it adds to a frame's encoding,
// computed once when it is recorded rather than by every stream.
type feedEntry struct {
	p    *cartv1.RecentPlacement
	size int
}

func newPlacementFeed(size int) *placementFeed {
	return &placementFeed{ring: make([]feedEntry, size)}
}

// add records that a prompt of block hashes went to worker, decided for
// the data plane's Route call routeID.
func (f *placementFeed) add(worker, dataplane string, routeID uint64, hashes []uint64) {
	if f.readers.Load() == 0 || worker == "" || len(hashes) == 0 {
		return
	}
	p := &cartv1.RecentPlacement{Worker: worker, Hashes: index.Checkpoints(nil, hashes), DataplaneId: dataplane, RouteId: routeID}
	e := feedEntry{p: p, size: protowire.SizeTag(1) + protowire.SizeBytes(placementSize(p))}
	f.mu.Lock()
	f.ring[f.next%uint64(len(f.ring))] = e
	f.next++
	f.mu.Unlock()
}

// placementSize is proto.Size(p), by arithmetic on RecentPlacement's four
// fields rather than by reflection on every placement recorded: hashes
// are fixed64, so only the strings' lengths and route_id vary. (proto3
// omits zero values; every tag is one byte.)
func placementSize(p *cartv1.RecentPlacement) int {
	n := 0
	if l := len(p.GetWorker()); l > 0 {
		n += 1 + protowire.SizeBytes(l)
	}
	if l := len(p.GetHashes()); l > 0 {
		n += 1 + protowire.SizeBytes(8*l)
	}
	if l := len(p.GetDataplaneId()); l > 0 {
		n += 1 + protowire.SizeBytes(l)
	}
	if id := p.GetRouteId(); id != 0 {
		n += 1 + protowire.SizeVarint(id)
	}
	return n
}

// head is the sequence number of the next placement.
func (f *placementFeed) head() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next
}

// read returns up to n placements from cursor on, as many as fit in
// maxBytes of a frame's encoding (at least one), the cursor to read from
// next, and how many were skipped because the ring overwrote them.
func (f *placementFeed) read(cursor uint64, n, maxBytes int) (out []*cartv1.RecentPlacement, size int, next, skipped uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if oldest := f.next - min(f.next, uint64(len(f.ring))); cursor < oldest {
		skipped, cursor = oldest-cursor, oldest
	}
	for ; cursor < f.next && len(out) < n; cursor++ {
		e := f.ring[cursor%uint64(len(f.ring))]
		if len(out) > 0 && size+e.size > maxBytes {
			break
		}
		size += e.size
		out = append(out, e.p)
	}
	return out, size, cursor, skipped
}

// feed sends a stream the leader's placements until ctx ends: every tick,
// what accumulated, at most feedTickMax (older ones skipped).
func (c *Core) feed(ctx context.Context, send func(*cartv1.StreamResponse, int)) {
	f := c.placements
	f.readers.Add(1)
	defer f.readers.Add(-1)
	cursor := f.head()
	every.Tick(ctx, feedTick, nil, func() { cursor = c.feedTick(cursor, send) })
}

// feedTick sends what accumulated since cursor and returns the new cursor.
//
// send gets each frame with the encoded size of its placements, so the
// stream need not size it again (see feedFrameOverhead).
func (c *Core) feedTick(cursor uint64, send func(m *cartv1.StreamResponse, placementBytes int)) uint64 {
	f := c.placements
	var skipped uint64
	if behind := f.head() - cursor; behind > feedTickMax {
		skipped, cursor = behind-feedTickMax, cursor+behind-feedTickMax
	}
	for sent := 0; sent < feedTickMax; {
		batch, size, next, lost := f.read(cursor, min(feedFrameMax, feedTickMax-sent), feedFrameBytes)
		cursor, skipped = next, skipped+lost
		if len(batch) == 0 && skipped == 0 {
			break
		}
		// Counted before the send: a reader of the frame must find it counted.
		c.metrics.feedSent.Add(float64(len(batch)))
		c.metrics.feedSkipped.Add(float64(skipped))
		send(&cartv1.StreamResponse{Result: &cartv1.StreamResponse_Placements{Placements: &cartv1.RecentPlacements{Placements: batch, Skipped: skipped}}}, size)
		sent += len(batch)
		skipped = 0
		if len(batch) == 0 {
			break
		}
	}
	return cursor
}
