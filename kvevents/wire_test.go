package kvevents

import (
	"math"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cartrouter/cart/internal/testkit"
)

// These payloads are built with msgpack's generic encoder from the layouts
// vLLM's msgspec structs produce, independently of Encode, so the decoder is
// not only checked against its own encoder.

const (
	rootHash = uint64(0xDEADBEEF12345678)
	topHash  = uint64(math.MaxUint64)
)

var firstBlock = []any{128000, 128006, 9125, 0, 1, 127, 128, 255, 256, 65535, 65536, 128255, 42, 2, 3, 4}

func marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func u64(v uint64) *uint64 { return &v }
func intp(v int) *int      { return &v }

func wantTokens() []uint32 {
	out := make([]uint32, len(firstBlock))
	for i, t := range firstBlock {
		out[i] = uint32(t.(int))
	}
	return out
}

func TestDecodeMapEncoding(t *testing.T) {
	payload := marshal(t, []any{
		1757500000.25,
		[]any{
			map[string]any{
				"type": "BlockStored", "block_hashes": []any{rootHash, topHash}, "parent_block_hash": nil,
				"token_ids": firstBlock, "block_size": 8, "lora_id": nil, "medium": "GPU", "lora_name": nil,
				// Fields of later vLLM releases are skipped.
				"group_idx": 0, "extra_keys": []any{[]any{"salt"}, nil},
			},
			map[string]any{"type": "BlockStored", "block_hashes": []any{7}, "parent_block_hash": topHash, "token_ids": []any{}, "block_size": 8, "lora_id": 3, "medium": "CPU", "lora_name": "sql"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{uint64(0x8000000000000001)}, "medium": "GPU"},
			map[string]any{"type": "AllBlocksCleared"},
			map[string]any{"type": "SomethingNew", "x": 1},
		},
		0,
	})
	got, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	lora := int64(3)
	want := Batch{TS: 1757500000.25, DPRank: intp(0), Events: []Event{
		{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{rootHash, topHash}, TokenIDs: wantTokens(), BlockSize: 8, Medium: "GPU"},
		{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{7}, ParentBlockHash: u64(topHash), TokenIDs: []uint32{}, BlockSize: 8, LoRAID: &lora, Medium: "CPU", LoRAName: "sql"},
		{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{0x8000000000000001}, Medium: "GPU"},
		{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
		{Kind: Unknown, Tag: "SomethingNew"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestDecodeArrayEncoding(t *testing.T) {
	payload := marshal(t, []any{
		int64(1757500000), // an integral ts still decodes
		[]any{
			[]any{"BlockStored", []any{rootHash}, nil, firstBlock, 16, nil, "GPU", "chat"},
			// The oldest layout stopped at lora_id.
			[]any{"BlockStored", []any{int64(-2)}, rootHash, []any{1, 2}, 2, nil},
			// Trailing fields of newer releases are skipped.
			[]any{"BlockRemoved", []any{rootHash}, "GPU", 0},
			[]any{"AllBlocksCleared"},
		},
		nil,
	})
	got, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 1757500000, Events: []Event{
		{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{rootHash}, TokenIDs: wantTokens(), BlockSize: 16, Medium: "GPU", LoRAName: "chat"},
		{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{math.MaxUint64 - 1}, ParentBlockHash: u64(rootHash), TokenIDs: []uint32{1, 2}, BlockSize: 2},
		{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{rootHash}, Medium: "GPU"},
		{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestDecodeMapBatchAndByteHashes(t *testing.T) {
	digest := make([]byte, 32)
	for i := range digest {
		digest[i] = byte(i)
	}
	payload := marshal(t, map[string]any{
		"ts":     2.5,
		"events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{digest, []byte{1, 2}}, "medium": nil}},
		// data_parallel_rank omitted, as msgspec's omit_defaults does.
	})
	got, err := Decode(payload)
	if err != nil {
		t.Fatal(err)
	}
	want := Batch{TS: 2.5, Events: []Event{{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{0x18191a1b1c1d1e1f, 0x0102}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestEncodeRoundTripsBothEncodings(t *testing.T) {
	lora := int64(9)
	in := Batch{TS: 1.75, DPRank: intp(2), Events: []Event{
		{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1, topHash}, ParentBlockHash: u64(rootHash), TokenIDs: []uint32{5, 70000}, BlockSize: 1, LoRAID: &lora, Medium: MediumGPU, LoRAName: "a"},
		{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{topHash}, Medium: MediumGPU},
		{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
	}}
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		payload, err := Encode(in, enc)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(payload)
		if err != nil || !reflect.DeepEqual(got, in) {
			t.Fatalf("%s: got %+v (%v)\nwant %+v", enc, got, err, in)
		}
		// The layout is the one named: check it with the generic decoder.
		var generic []any
		if err := msgpack.Unmarshal(payload, &generic); err != nil || len(generic) != 3 {
			t.Fatalf("%s: batch is not a 3-array: %v %v", enc, generic, err)
		}
		first := generic[1].([]any)[0]
		switch enc {
		case EncodingMap:
			if m, ok := first.(map[string]any); !ok || m["type"] != "BlockStored" || m["lora_name"] != "a" {
				t.Fatalf("map event %#v", first)
			}
		case EncodingArray:
			if a, ok := first.([]any); !ok || len(a) != 8 || a[0] != "BlockStored" || a[7] != "a" {
				t.Fatalf("array event %#v", first)
			}
		}
	}
	if _, err := Encode(Batch{Events: []Event{{Kind: Unknown}}}, EncodingMap); err == nil {
		t.Fatal("an unknown kind was encoded")
	}
}

func TestDecodeRejectsMalformedPayloads(t *testing.T) {
	for name, payload := range map[string][]byte{
		"empty":           nil,
		"not an array":    marshal(t, "x"),
		"short batch":     marshal(t, []any{1.0}),
		"events not list": marshal(t, []any{1.0, 3, 0}),
		"event no type":   marshal(t, []any{1.0, []any{map[string]any{"block_hashes": []any{}}}, 0}),
		"empty event":     marshal(t, []any{1.0, []any{[]any{}}, 0}),
		"bad hash":        marshal(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"x"}, nil}}, 0}),
		"negative token":  marshal(t, []any{1.0, []any{[]any{"BlockStored", []any{}, nil, []any{-1}, 16, nil}}, 0}),
		"truncated":       marshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2, 3}}}, 0})[:8],
		// A claimed length far beyond the payload must fail, not allocate.
		"huge length": {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x7f, 0xff, 0xff, 0xff},
	} {
		if _, err := Decode(payload); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func TestMessageFrames(t *testing.T) {
	m, err := ParseMessage([][]byte{[]byte("kv@pod@m"), SeqBytes(258), {0x90}})
	if err != nil || m.Topic != "kv@pod@m" || m.Seq != 258 || len(m.Payload) != 1 {
		t.Fatalf("%+v %v", m, err)
	}
	if s, _ := ParseSeq(SeqBytes(EndOfReplay)); s != -1 {
		t.Fatalf("end of replay reads %d", s)
	}
	if _, err := ParseMessage([][]byte{{}, {1, 2}, {}}); err == nil {
		t.Fatal("short sequence frame accepted")
	}
	if _, err := ParseMessage([][]byte{{}}); err == nil {
		t.Fatal("one frame accepted")
	}
	for _, s := range []string{"map", "array"} {
		if e, err := ParseEncoding(s); err != nil || e.String() != s {
			t.Fatalf("%s: %v %v", s, e, err)
		}
	}
	if _, err := ParseEncoding("json"); err == nil {
		t.Fatal("json accepted")
	}
}

// FuzzDecode checks that no payload panics the decoder and that whatever it
// accepts survives a re-encoding in both encodings.
func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		b, _ := Encode(Batch{TS: 1, DPRank: intp(0), Events: []Event{
			{Kind: BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: MediumGPU},
			{Kind: BlockRemoved, BlockHashes: []uint64{1}},
			{Kind: AllBlocksCleared},
		}}, enc)
		f.Add(b)
	}
	f.Add(marshal(f, map[string]any{"ts": 1.0, "events": []any{}}))
	f.Add(testkit.ZMTPCrashingFrame()) // issue 33's frame, as a payload
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		known := b.Events[:0:0]
		for _, ev := range b.Events {
			if ev.Kind != Unknown {
				ev.Tag = ev.Kind.String()
				known = append(known, ev)
			}
		}
		b.Events = known
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			again, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("re-encoding %+v: %v", b, err)
			}
			back, err := Decode(again)
			if err != nil {
				t.Fatalf("decoding the re-encoding: %v", err)
			}
			if !math.IsNaN(b.TS) && !reflect.DeepEqual(normalize(back), normalize(b)) {
				t.Fatalf("round trip changed the batch:\n%+v\n%+v", back, b)
			}
		}
	})
}

// normalize makes nil and empty slices compare equal.
func normalize(b Batch) Batch {
	if len(b.Events) == 0 {
		b.Events = nil
	}
	for i := range b.Events {
		ev := &b.Events[i]
		if len(ev.BlockHashes) == 0 {
			ev.BlockHashes = nil
		}
		if len(ev.TokenIDs) == 0 {
			ev.TokenIDs = nil
		}
		// Fields an event kind does not carry are not re-encoded.
		switch ev.Kind {
		case BlockRemoved:
			*ev = Event{Kind: ev.Kind, Tag: ev.Tag, BlockHashes: ev.BlockHashes, Medium: ev.Medium}
		case AllBlocksCleared:
			*ev = Event{Kind: ev.Kind, Tag: ev.Tag}
		}
	}
	return b
}
