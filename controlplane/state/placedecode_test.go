package state

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

func samplePlaceBatch(n, blocks int) *cartv1.RaftCommand {
	pb := &cartv1.PlaceBatchCommand{}
	for i := range n {
		p := &cartv1.Placement{Worker: "http://10.0.0.1:8000", AtUnixNanos: 1_700_000_000_000_000_000 + int64(i)}
		for j := range blocks {
			p.BlockHashes = append(p.BlockHashes, uint64(i*1000+j)*0x9e3779b97f4a7c15)
		}
		pb.Placements = append(pb.Placements, p)
	}
	pb.Withdrawals = []*cartv1.Placement{{Worker: "http://b", BlockHashes: []uint64{7, 8}, AtUnixNanos: 3}}
	pb.Touches = []*cartv1.Placement{{Worker: "http://c", BlockHashes: []uint64{1}, AtUnixNanos: -5}, {Worker: "", AtUnixNanos: 0}}
	return &cartv1.RaftCommand{Version: CommandVersion, RequestId: "req-1", Actor: "leader", Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: pb}}
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// unpacked encodes a Placement with its hashes unpacked, one fixed64
// field each, as a proto2-minded writer may: parsers must accept both.
func unpacked(p *cartv1.Placement) []byte {
	var b []byte
	b = protowire.AppendTag(b, fPlaceWorker, protowire.BytesType)
	b = protowire.AppendString(b, p.GetWorker())
	for _, h := range p.GetBlockHashes() {
		b = protowire.AppendTag(b, fPlaceHashes, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, h)
	}
	b = protowire.AppendTag(b, fPlaceAt, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(p.GetAtUnixNanos()))
}

// wrapBatch builds a RaftCommand around a raw PlaceBatchCommand encoding.
func wrapBatch(batch []byte) []byte {
	var b []byte
	b = protowire.AppendTag(b, fCmdVersion, protowire.VarintType)
	b = protowire.AppendVarint(b, CommandVersion)
	b = protowire.AppendTag(b, fCmdPlace, protowire.BytesType)
	return protowire.AppendBytes(b, batch)
}

// checkSameAsProto fails unless the fast decoder's batch, when it takes
// data, is what proto.Unmarshal makes of it; it reports whether it did.
func checkSameAsProto(t testing.TB, data []byte) bool {
	t.Helper()
	d, ok := decodePlaceBatch(data)
	if !ok {
		return false
	}
	defer d.release()
	var cmd cartv1.RaftCommand
	if err := proto.Unmarshal(data, &cmd); err != nil {
		t.Fatalf("decoder took what proto.Unmarshal refuses (%v): %x", err, data)
	}
	pb := cmd.GetPlaceBatch()
	if pb == nil || cmd.GetVersion() > CommandVersion {
		t.Fatalf("decoder took a command that is not a current PlaceBatch: %v", &cmd)
	}
	want := decodedBatchOf(cmd.GetRequestId(), pb)
	got := &d.b
	if got.requestID != want.requestID {
		t.Fatalf("request id %q, want %q", got.requestID, want.requestID)
	}
	for _, l := range []struct {
		name      string
		got, want []placement
	}{{"touches", got.touches, want.touches}, {"withdrawals", got.withdrawals, want.withdrawals}, {"placements", got.placements, want.placements}} {
		if len(l.got) != len(l.want) {
			t.Fatalf("%s: %d, want %d", l.name, len(l.got), len(l.want))
		}
		for i := range l.got {
			g, w := l.got[i], l.want[i]
			if g.worker != w.worker || g.at != w.at || !slices.Equal(g.hashes, w.hashes) {
				t.Fatalf("%s[%d] = %+v, want %+v", l.name, i, g, w)
			}
		}
	}
	if !slices.EqualFunc(got.origins, want.origins, func(a, b *cartv1.ResponseOrigin) bool { return proto.Equal(a, b) }) {
		t.Fatalf("origins %v, want %v", got.origins, want.origins)
	}
	return true
}

// What leaders write is taken by the fast decoder, and decodes as
// proto.Unmarshal would; so does the unpacked encoding of the hashes.
func TestDecodePlaceBatchTakesWhatLeadersWrite(t *testing.T) {
	withOrigins := samplePlaceBatch(3, 4)
	withOrigins.GetPlaceBatch().ResponseOrigins = []*cartv1.ResponseOrigin{{IdHash: 42, Worker: "http://a"}}
	p := &cartv1.Placement{Worker: "http://u", BlockHashes: []uint64{1, 1 << 63, 3}, AtUnixNanos: 9}
	var batch []byte
	batch = protowire.AppendTag(batch, fBatchPlacements, protowire.BytesType)
	batch = protowire.AppendBytes(batch, unpacked(p))
	for name, data := range map[string][]byte{
		"64 placements of 100 blocks": mustMarshal(t, samplePlaceBatch(64, 100)),
		"empty batch":                 mustMarshal(t, &cartv1.RaftCommand{Version: CommandVersion, Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{}}}),
		"version 0":                   mustMarshal(t, &cartv1.RaftCommand{Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{Placements: []*cartv1.Placement{p}}}}),
		"with response origins":       mustMarshal(t, withOrigins),
		"unpacked hashes":             wrapBatch(batch),
	} {
		if !checkSameAsProto(t, data) {
			t.Errorf("%s: left to proto.Unmarshal, want decoded in place", name)
		}
	}
}

// Anything the decoder is not sure of goes to proto.Unmarshal, which
// decides (and may refuse the entry).
func TestDecodePlaceBatchLeavesTheRestToProto(t *testing.T) {
	good := mustMarshal(t, samplePlaceBatch(2, 3))
	var unknownInPlacement []byte
	unknownInPlacement = protowire.AppendTag(unknownInPlacement, fBatchPlacements, protowire.BytesType)
	unknownInPlacement = protowire.AppendBytes(unknownInPlacement, protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	var badUTF8 []byte
	badUTF8 = protowire.AppendTag(badUTF8, fBatchPlacements, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, protowire.AppendBytes(protowire.AppendTag(nil, fPlaceWorker, protowire.BytesType), []byte{0xff, 0xfe}))
	var oddPacked []byte
	oddPacked = protowire.AppendTag(oddPacked, fBatchPlacements, protowire.BytesType)
	oddPacked = protowire.AppendBytes(oddPacked, protowire.AppendBytes(protowire.AppendTag(nil, fPlaceHashes, protowire.BytesType), make([]byte, 9)))
	twice := append(slices.Clone(good), protowire.AppendBytes(protowire.AppendTag(nil, fCmdPlace, protowire.BytesType), nil)...)
	for name, data := range map[string][]byte{
		"another command":          mustMarshal(t, &cartv1.RaftCommand{Version: CommandVersion, Body: &cartv1.RaftCommand_RemoveWorker{RemoveWorker: &cartv1.RemoveWorkerCommand{Url: "http://a"}}}),
		"no body":                  mustMarshal(t, &cartv1.RaftCommand{Version: CommandVersion}),
		"a newer version":          mustMarshal(t, &cartv1.RaftCommand{Version: CommandVersion + 1, Ignorable: true, Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{}}}),
		"unknown placement field":  wrapBatch(unknownInPlacement),
		"invalid UTF-8 worker":     wrapBatch(badUTF8),
		"packed hashes of 9 bytes": wrapBatch(oddPacked),
		"place_batch twice":        twice,
		"truncated":                good[:len(good)-3],
	} {
		if _, ok := decodePlaceBatch(data); ok {
			t.Errorf("%s: decoded in place, want left to proto.Unmarshal", name)
		}
	}
}

// Apply gives the same state whichever decoder reads the entry: a batch
// applied in place and the same batch forced through proto.Unmarshal (an
// unknown field in the envelope) leave equal indexes.
func TestApplyPlaceBatchEitherDecoder(t *testing.T) {
	cmd := samplePlaceBatch(40, 30)
	fast := mustMarshal(t, cmd)
	slow := protowire.AppendVarint(protowire.AppendTag(slices.Clone(fast), 999, protowire.VarintType), 1)
	if _, ok := decodePlaceBatch(slow); ok {
		t.Fatal("the forced entry was decoded in place")
	}
	d, ok := decodePlaceBatch(fast)
	if !ok {
		t.Fatal("the leader's entry was not decoded in place: both applies would go through proto")
	}
	d.release()
	var prints [2]string
	var entries [2]int
	for i, data := range [][]byte{fast, slow} {
		st, eng := newTestState()
		a := &testApplier{t: t, st: st}
		a.apply(setWorkers("http://10.0.0.1:8000", "http://b", "http://c"))
		if _, err := st.Apply(a.i+1, data); err != nil {
			t.Fatal(err)
		}
		prints[i] = fingerprint(st, eng)
		locked(st, func() { entries[i] = eng.Index().Len() })
	}
	// (The workers' modelled cache capacity keeps only some of the 1,200
	// blocks: which ones depends on the order of every insert.)
	if entries[0] == 0 || entries[1] != entries[0] || prints[1] != prints[0] {
		t.Fatalf("in place: %d entries, through proto: %d; states equal: %v", entries[0], entries[1], prints[0] == prints[1])
	}
}

func FuzzDecodePlaceBatch(f *testing.F) {
	f.Add(mustMarshal(f, samplePlaceBatch(3, 5)))
	f.Add(wrapBatch(protowire.AppendBytes(protowire.AppendTag(nil, fBatchTouches, protowire.BytesType), unpacked(&cartv1.Placement{Worker: "w", BlockHashes: []uint64{1, 2}}))))
	f.Add(mustMarshal(f, &cartv1.RaftCommand{Body: &cartv1.RaftCommand_PlaceBatch{PlaceBatch: &cartv1.PlaceBatchCommand{ResponseOrigins: []*cartv1.ResponseOrigin{{IdHash: 1}}}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSameAsProto(t, data)
	})
}

func BenchmarkDecodePlaceBatch(b *testing.B) {
	data := mustMarshal(b, samplePlaceBatch(64, 100))
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var cmd cartv1.RaftCommand
			if err := proto.Unmarshal(data, &cmd); err != nil {
				b.Fatal(err)
			}
			_ = decodedBatchOf(cmd.GetRequestId(), cmd.GetPlaceBatch())
		}
	})
	b.Run("in-place", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d, ok := decodePlaceBatch(data)
			if !ok {
				b.Fatal("not decoded in place")
			}
			d.release()
		}
	})
}

// The leader's batcher proposes a batch of a placement_batch_ms window
// (250 placements at 5,000 routes/s and the default 50 ms) without a
// version: Encode stamps it.
func BenchmarkEncodePlaceBatch(b *testing.B) {
	cmd := samplePlaceBatch(256, 64)
	cmd.Version = 0
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(cmd); err != nil {
			b.Fatal(err)
		}
	}
}

// Encode stamps the version on a copy that keeps every other field of
// the command (and unknown fields), and leaves the caller's command as it
// was.
func TestEncodeStampsVersionKeepingEveryField(t *testing.T) {
	cmd := samplePlaceBatch(3, 4)
	cmd.Version = 0
	cmd.Ignorable = true
	cmd.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 5))
	fields := cmd.ProtoReflect().Descriptor().Fields()
	for i := range fields.Len() {
		if fd := fields.Get(i); fd.Name() != "version" && fd.ContainingOneof() == nil && !cmd.ProtoReflect().Has(fd) {
			t.Fatalf("the test command leaves %s unset: set it, so that Encode is shown to keep it", fd.Name())
		}
	}
	want := proto.CloneOf(cmd)
	want.Version = CommandVersion
	data, err := Encode(cmd)
	if err != nil {
		t.Fatal(err)
	}
	var got cartv1.RaftCommand
	if err := proto.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("decoded %v, want %v", &got, want)
	}
	if cmd.GetVersion() != 0 {
		t.Fatal("Encode changed the caller's command")
	}
	// A command with a version is encoded as it is.
	data, err = Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	if b := mustMarshal(t, want); !bytes.Equal(data, b) {
		t.Fatal("a versioned command was not encoded as proto.Marshal encodes it")
	}
}
