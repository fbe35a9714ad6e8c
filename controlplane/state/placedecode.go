package state

import (
	"encoding/binary"
	"slices"
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// Every node applies a PlaceBatch entry for each batch window of the
// leader's decisions: the one command that comes at the routing rate.
// proto.Unmarshal builds a message and a hash slice per placement (about
// 1-1.4 µs and 3 allocations a placement, BenchmarkDecodePlaceBatch, where
// this decoder takes 0.15 µs and none), which was a fifth of a follower's
// CPU at 5,000 routes/s. decodePlaceBatch
// reads the entry's bytes in place instead, into buffers reused across
// entries. It accepts only the encodings it is sure of and leaves
// anything else (another command, a newer version, an unknown field,
// invalid UTF-8, a field of an unexpected wire type) to proto.Unmarshal,
// so what it accepts decodes exactly as proto.Unmarshal would
// (FuzzDecodePlaceBatch).

// placement is one Placement of a batch, as Apply uses it. From
// decodePlaceBatch, hashes is a view of the decoder's buffer, valid until
// the decoder is released.
type placement struct {
	worker string
	hashes []uint64
	at     int64
}

// decodedBatch is a PlaceBatchCommand ready to apply.
type decodedBatch struct {
	requestID                        string
	touches, withdrawals, placements []placement
	origins                          []*cartv1.ResponseOrigin
}

// placementsOf views decoded Placement messages as placements.
func placementsOf(ps []*cartv1.Placement) []placement {
	out := make([]placement, len(ps))
	for i, p := range ps {
		out[i] = placement{worker: p.GetWorker(), hashes: p.GetBlockHashes(), at: p.GetAtUnixNanos()}
	}
	return out
}

// decodedBatchOf is a decoded command's batch.
func decodedBatchOf(requestID string, b *cartv1.PlaceBatchCommand) *decodedBatch {
	return &decodedBatch{
		requestID:   requestID,
		touches:     placementsOf(b.GetTouches()),
		withdrawals: placementsOf(b.GetWithdrawals()),
		placements:  placementsOf(b.GetPlacements()),
		origins:     b.GetResponseOrigins(),
	}
}

// Field numbers, read from the generated descriptors so that a change to
// the proto cannot leave this decoder reading the wrong fields.
var (
	fCmdVersion   = fieldNum(&cartv1.RaftCommand{}, "version")
	fCmdIgnorable = fieldNum(&cartv1.RaftCommand{}, "ignorable")
	fCmdRequestID = fieldNum(&cartv1.RaftCommand{}, "request_id")
	fCmdActor     = fieldNum(&cartv1.RaftCommand{}, "actor")
	fCmdPlace     = fieldNum(&cartv1.RaftCommand{}, "place_batch")

	fBatchPlacements  = fieldNum(&cartv1.PlaceBatchCommand{}, "placements")
	fBatchWithdrawals = fieldNum(&cartv1.PlaceBatchCommand{}, "withdrawals")
	fBatchOrigins     = fieldNum(&cartv1.PlaceBatchCommand{}, "response_origins")
	fBatchTouches     = fieldNum(&cartv1.PlaceBatchCommand{}, "touches")

	fPlaceWorker = fieldNum(&cartv1.Placement{}, "worker")
	fPlaceHashes = fieldNum(&cartv1.Placement{}, "block_hashes")
	fPlaceAt     = fieldNum(&cartv1.Placement{}, "at_unix_nanos")
)

func fieldNum(m proto.Message, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic("state: no field " + string(name) + " in " + string(m.ProtoReflect().Descriptor().FullName()))
	}
	return f.Number()
}

// rawPlacement is a placement whose hashes are a range of the decoder's
// buffer, which may still move while the entry is read.
type rawPlacement struct {
	list   *[]placement
	worker string
	lo, hi int
	at     int64
}

// batchDecoder holds the buffers one decode reuses.
type batchDecoder struct {
	b      decodedBatch
	hashes []uint64
	raw    []rawPlacement
	// intern keeps one string per worker URL: a batch names the same few
	// workers over and over.
	intern map[string]string
}

// Buffers grown past these are not kept for the next entry, so one huge
// batch does not pin its memory.
const (
	maxPooledHashes     = 1 << 20
	maxPooledPlacements = 1 << 14
	maxInterned         = 4096
)

var decoders = sync.Pool{New: func() any { return &batchDecoder{intern: map[string]string{}} }}

// decodePlaceBatch decodes data if it is a PlaceBatch command this
// decoder is sure of; ok false leaves it to proto.Unmarshal. The batch is
// valid until release.
func decodePlaceBatch(data []byte) (d *batchDecoder, ok bool) {
	d = decoders.Get().(*batchDecoder)
	if !d.decode(data) {
		d.release()
		return nil, false
	}
	return d, true
}

// release returns the decoder's buffers for reuse.
func (d *batchDecoder) release() {
	clear(d.b.touches)
	clear(d.b.withdrawals)
	clear(d.b.placements)
	clear(d.raw)
	d.b = decodedBatch{touches: d.b.touches[:0], withdrawals: d.b.withdrawals[:0], placements: d.b.placements[:0]}
	d.raw = d.raw[:0]
	d.hashes = d.hashes[:0]
	if cap(d.hashes) > maxPooledHashes {
		d.hashes = nil
	}
	if cap(d.raw) > maxPooledPlacements {
		d.raw = nil
	}
	for _, l := range []*[]placement{&d.b.touches, &d.b.withdrawals, &d.b.placements} {
		if cap(*l) > maxPooledPlacements {
			*l = nil
		}
	}
	if len(d.intern) > maxInterned {
		clear(d.intern)
	}
	decoders.Put(d)
}

// eachField calls fn with each field of the message encoded in data: its
// number and type, and its value (x for varint and fixed64 fields, v for
// length-delimited ones). It reports false on any other wire type, a
// malformed encoding, or when fn does.
func eachField(data []byte, fn func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool) bool {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return false
		}
		data = data[n:]
		var x uint64
		var v []byte
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(data)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(data)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(data)
		default:
			return false
		}
		if n < 0 || !fn(num, typ, x, v) {
			return false
		}
		data = data[n:]
	}
	return true
}

func (d *batchDecoder) decode(data []byte) bool {
	var version uint64
	var batch []byte
	seen := false
	ok := eachField(data, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		switch {
		case num == fCmdVersion && typ == protowire.VarintType:
			version = uint64(uint32(x))
		case num == fCmdIgnorable && typ == protowire.VarintType:
		case (num == fCmdRequestID || num == fCmdActor) && typ == protowire.BytesType:
			if !utf8.Valid(v) {
				return false
			}
			if num == fCmdRequestID {
				d.b.requestID = string(v)
			}
		case num == fCmdPlace && typ == protowire.BytesType && !seen:
			batch, seen = v, true
		default:
			return false // another body, a second batch to merge, or a field this decoder does not know
		}
		return true
	})
	if !ok || !seen || version > CommandVersion || !d.decodeBatch(batch) {
		return false
	}
	for _, r := range d.raw {
		*r.list = append(*r.list, placement{worker: r.worker, hashes: d.hashes[r.lo:r.hi:r.hi], at: r.at})
	}
	return true
}

func (d *batchDecoder) decodeBatch(data []byte) bool {
	return eachField(data, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) bool {
		if typ != protowire.BytesType {
			return false
		}
		switch num {
		case fBatchPlacements:
			return d.decodePlacement(v, &d.b.placements)
		case fBatchWithdrawals:
			return d.decodePlacement(v, &d.b.withdrawals)
		case fBatchTouches:
			return d.decodePlacement(v, &d.b.touches)
		case fBatchOrigins:
			// Rare (Responses API answers): decoded as a message.
			o := &cartv1.ResponseOrigin{}
			if err := proto.Unmarshal(v, o); err != nil {
				return false
			}
			d.b.origins = append(d.b.origins, o)
			return true
		}
		return false
	})
}

func (d *batchDecoder) decodePlacement(data []byte, list *[]placement) bool {
	r := rawPlacement{list: list, lo: len(d.hashes)}
	ok := eachField(data, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) bool {
		switch {
		case num == fPlaceWorker && typ == protowire.BytesType:
			if !utf8.Valid(v) {
				return false
			}
			r.worker = d.internString(v)
		case num == fPlaceHashes && typ == protowire.BytesType: // packed
			if len(v)%8 != 0 {
				return false
			}
			hs := slices.Grow(d.hashes, len(v)/8)
			for i := 0; i < len(v); i += 8 {
				hs = append(hs, binary.LittleEndian.Uint64(v[i:]))
			}
			d.hashes = hs
		case num == fPlaceHashes && typ == protowire.Fixed64Type: // unpacked
			d.hashes = append(d.hashes, x)
		case num == fPlaceAt && typ == protowire.VarintType:
			r.at = int64(x)
		default:
			return false
		}
		return true
	})
	if !ok {
		return false
	}
	r.hi = len(d.hashes)
	d.raw = append(d.raw, r)
	return true
}

func (d *batchDecoder) internString(b []byte) string {
	if s, ok := d.intern[string(b)]; ok {
		return s
	}
	s := string(b)
	d.intern[s] = s
	return s
}
