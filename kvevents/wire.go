package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type.
type Kind uint8

// Event kinds, named after vLLM's event classes.
const (
	// Unknown is a tag this package does not know; Event.Tag holds it.
	Unknown Kind = iota
	BlockStored
	BlockRemoved
	AllBlocksCleared
)

var kindTags = [...]string{Unknown: "", BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindTags) && k != Unknown {
		return kindTags[k]
	}
	return "Unknown"
}

func kindOf(tag string) Kind {
	for k, t := range kindTags {
		if t == tag && t != "" {
			return Kind(k)
		}
	}
	return Unknown
}

// MediumGPU is the medium vLLM reports for blocks in GPU memory.
const MediumGPU = "GPU"

// Event is one KV-cache event. Fields not used by its Kind are zero.
type Event struct {
	Kind Kind
	// Tag is the event's type name as sent; set by Decode, ignored by Encode.
	Tag string
	// BlockHashes are the stored (a chain, parent first) or removed blocks.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the block before the first stored one,
	// nil when the run starts the prompt.
	ParentBlockHash *uint64
	// TokenIDs are the tokens of all stored blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is vLLM's deprecated adapter id; LoRAName the adapter name
	// ("" for the base model), which is part of the block hashes.
	LoRAID   *int64
	LoRAName string
	// Medium is where the blocks live ("GPU", "CPU"...), "" when unsent.
	Medium string
}

// Batch is what one published message carries.
type Batch struct {
	// TS is the publish time in Unix seconds.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the engine, nil when unsent.
	DPRank *int
}

// Encoding selects how events are laid out in the payload.
type Encoding int

// The two encodings vLLM releases have used.
const (
	EncodingMap Encoding = iota
	EncodingArray
)

// ParseEncoding reads "map" or "array".
func ParseEncoding(s string) (Encoding, error) {
	switch s {
	case "map":
		return EncodingMap, nil
	case "array":
		return EncodingArray, nil
	}
	return 0, fmt.Errorf("kv events encoding %q: want map or array", s)
}

func (e Encoding) String() string {
	if e == EncodingArray {
		return "array"
	}
	return "map"
}

// EndOfReplay is the sequence number that ends a replay answer.
const EndOfReplay int64 = -1

// SeqBytes encodes a sequence number as its 8-byte big-endian frame.
func SeqBytes(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }

// ParseSeq reads an 8-byte big-endian sequence frame.
func ParseSeq(frame []byte) (int64, error) {
	if len(frame) != 8 {
		return 0, fmt.Errorf("sequence frame is %d bytes, want 8", len(frame))
	}
	return int64(binary.BigEndian.Uint64(frame)), nil
}

// Message is one published message, split into its frames' meanings.
type Message struct {
	Topic   string
	Seq     int64
	Payload []byte
}

// ParseMessage reads the three frames of a published message.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("kv event message has %d frames, want 3 (topic, sequence, payload)", len(frames))
	}
	seq, err := ParseSeq(frames[1])
	if err != nil {
		return Message{}, err
	}
	return Message{Topic: string(frames[0]), Seq: seq, Payload: frames[2]}, nil
}

// ParseReplayAnswer reads one message of a replay answer as a DEALER
// receives it. Publishers differ in what precedes the (sequence, payload)
// pair: vLLM's ROUTER sends an empty delimiter first (a REQ client sees
// none), llm-d-inference-sim's a delimiter and the topic; so the last two
// frames are the pair and whatever comes before is not read. The
// end-of-replay marker is sequence -1 (all ones) with any payload.
func ParseReplayAnswer(frames [][]byte) (Message, error) {
	if len(frames) < 2 {
		return Message{}, fmt.Errorf("replay answer has %d frames, want at least 2 (sequence, payload)", len(frames))
	}
	seq, err := ParseSeq(frames[len(frames)-2])
	if err != nil {
		return Message{}, fmt.Errorf("replay answer: %w", err)
	}
	return Message{Seq: seq, Payload: frames[len(frames)-1]}, nil
}

// Encode returns the msgpack payload of b.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	// msgspec writes every integer in its smallest form; so do we.
	e.UseCompactInts(true)
	w := &writer{e: e}
	w.arrayLen(3)
	w.check(e.EncodeFloat64(b.TS))
	w.arrayLen(len(b.Events))
	for i := range b.Events {
		w.event(&b.Events[i], enc)
	}
	encodeOpt(w, b.DPRank, func(r int) error { return e.EncodeInt(int64(r)) })
	if w.err != nil {
		return nil, w.err
	}
	return buf.Bytes(), nil
}

// writer keeps the first encoding error so the layout code stays linear.
type writer struct {
	e   *msgpack.Encoder
	err error
}

func (w *writer) check(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) arrayLen(n int) { w.check(w.e.EncodeArrayLen(n)) }

// field writes a map key in the map encoding and nothing in the array one.
func (w *writer) field(enc Encoding, name string) {
	if enc == EncodingMap {
		w.check(w.e.EncodeString(name))
	}
}

func (w *writer) event(ev *Event, enc Encoding) {
	if ev.Kind == Unknown || int(ev.Kind) >= len(kindTags) {
		w.check(fmt.Errorf("cannot encode an event of kind %d", ev.Kind))
		return
	}
	var n int
	switch ev.Kind {
	case BlockStored:
		n = 7
	case BlockRemoved:
		n = 2
	}
	if enc == EncodingMap {
		w.check(w.e.EncodeMapLen(n + 1))
		w.check(w.e.EncodeString("type"))
	} else {
		w.arrayLen(n + 1)
	}
	w.check(w.e.EncodeString(kindTags[ev.Kind]))
	switch ev.Kind {
	case BlockStored:
		w.field(enc, "block_hashes")
		w.hashes(ev.BlockHashes)
		w.field(enc, "parent_block_hash")
		encodeOpt(w, ev.ParentBlockHash, w.e.EncodeUint)
		w.field(enc, "token_ids")
		w.arrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			w.check(w.e.EncodeUint(uint64(t)))
		}
		w.field(enc, "block_size")
		w.check(w.e.EncodeInt(int64(ev.BlockSize)))
		w.field(enc, "lora_id")
		encodeOpt(w, ev.LoRAID, w.e.EncodeInt)
		w.field(enc, "medium")
		w.optString(ev.Medium)
		w.field(enc, "lora_name")
		w.optString(ev.LoRAName)
	case BlockRemoved:
		w.field(enc, "block_hashes")
		w.hashes(ev.BlockHashes)
		w.field(enc, "medium")
		w.optString(ev.Medium)
	}
}

func (w *writer) hashes(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.check(w.e.EncodeUint(h))
	}
}

// encodeOpt writes an unset optional field as nil, as msgspec does for
// a None, and a set one with enc.
func encodeOpt[T any](w *writer, p *T, enc func(T) error) {
	if p == nil {
		w.check(w.e.EncodeNil())
		return
	}
	w.check(enc(*p))
}

// optString writes "" as nil, as vLLM sends an absent medium or adapter.
func (w *writer) optString(s string) {
	if s == "" {
		w.check(w.e.EncodeNil())
	} else {
		w.check(w.e.EncodeString(s))
	}
}

// Decode reads a payload in either encoding. It never panics on bad input
// and bounds its allocations by the payload's size.
func Decode(payload []byte) (Batch, error) {
	r := &reader{d: msgpack.NewDecoder(bytes.NewReader(payload)), limit: len(payload)}
	b, err := r.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("decoding kv event batch: %w", err)
	}
	return b, nil
}

type reader struct {
	d *msgpack.Decoder
	// limit bounds any length read from the payload: every element takes
	// at least one byte, so a larger count is a lie and must not allocate.
	limit int
}

func (r *reader) peek() (byte, error) { return r.d.PeekCode() }

func (r *reader) isNil() (bool, error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, r.d.DecodeNil()
	}
	return false, nil
}

func (r *reader) length(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n < 0 || n > r.limit {
		return 0, fmt.Errorf("length %d exceeds the payload", n)
	}
	return n, nil
}

func (r *reader) arrayLen() (int, error) { return r.length(r.d.DecodeArrayLen()) }

func (r *reader) mapLen() (int, error) { return r.length(r.d.DecodeMapLen()) }

// mapFields reads a map, when one is next, calling field for each key
// with the reader at its value; isMap is false (and nothing is read) for
// any other value.
func (r *reader) mapFields(field func(key string) error) (isMap bool, err error) {
	c, err := r.peek()
	if err != nil {
		return false, err
	}
	if !msgpcode.IsFixedMap(c) && c != msgpcode.Map16 && c != msgpcode.Map32 {
		return false, nil
	}
	n, err := r.mapLen()
	if err != nil {
		return true, err
	}
	for range n {
		key, err := r.d.DecodeString()
		if err != nil {
			return true, err
		}
		if err := field(key); err != nil {
			return true, err
		}
	}
	return true, nil
}

func (r *reader) batch() (Batch, error) {
	var b Batch
	isMap, err := r.mapFields(func(key string) error { return r.batchField(&b, key) })
	if err != nil || isMap {
		return b, err
	}
	n, err := r.arrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("batch array has %d elements, want at least 2 (ts, events)", n)
	}
	for i, key := range []string{"ts", "events", "data_parallel_rank"} {
		if i < n {
			if err := r.batchField(&b, key); err != nil {
				return b, err
			}
		}
	}
	for range n - min(n, 3) {
		if err := r.d.Skip(); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (r *reader) batchField(b *Batch, key string) error {
	switch key {
	case "ts":
		ts, err := r.d.DecodeFloat64()
		if err != nil {
			return fmt.Errorf("ts: %w", err)
		}
		b.TS = ts
	case "events":
		n, err := r.arrayLen()
		if err != nil {
			return fmt.Errorf("events: %w", err)
		}
		b.Events = make([]Event, 0, n)
		for i := range n {
			ev, err := r.event()
			if err != nil {
				return fmt.Errorf("events[%d]: %w", i, err)
			}
			b.Events = append(b.Events, ev)
		}
	case "data_parallel_rank":
		if null, err := r.isNil(); err != nil || null {
			return err
		}
		rank, err := r.d.DecodeInt64()
		if err != nil {
			return fmt.Errorf("data_parallel_rank: %w", err)
		}
		if rank < math.MinInt32 || rank > math.MaxInt32 {
			return fmt.Errorf("data_parallel_rank %d out of range", rank)
		}
		v := int(rank)
		b.DPRank = &v
	default:
		return r.d.Skip()
	}
	return nil
}

// Positional fields of the array encoding, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	removedFields = []string{"block_hashes", "medium"}
)

func (r *reader) event() (Event, error) {
	var ev Event
	isMap, err := r.mapFields(func(key string) error {
		if key != "type" {
			return r.eventField(&ev, key)
		}
		var err error
		if ev.Tag, err = r.d.DecodeString(); err != nil {
			return fmt.Errorf("type: %w", err)
		}
		ev.Kind = kindOf(ev.Tag)
		return nil
	})
	switch {
	case err != nil:
		return ev, err
	case isMap && ev.Tag == "":
		return ev, errors.New(`event map without a "type"`)
	case isMap:
		return ev, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return ev, err
	}
	if n < 1 {
		return ev, errors.New("empty event array")
	}
	if ev.Tag, err = r.d.DecodeString(); err != nil {
		return ev, fmt.Errorf("tag: %w", err)
	}
	ev.Kind = kindOf(ev.Tag)
	var fields []string
	switch ev.Kind {
	case BlockStored:
		fields = storedFields
	case BlockRemoved:
		fields = removedFields
	}
	for i := 1; i < n; i++ {
		key := ""
		if i-1 < len(fields) {
			key = fields[i-1]
		}
		if err := r.eventField(&ev, key); err != nil {
			return ev, err
		}
	}
	return ev, nil
}

func (r *reader) eventField(ev *Event, key string) error {
	var err error
	switch key {
	case "block_hashes":
		ev.BlockHashes, err = r.hashes()
	case "parent_block_hash":
		var null bool
		if null, err = r.isNil(); err == nil && !null {
			var h uint64
			if h, err = r.hash(); err == nil {
				ev.ParentBlockHash = &h
			}
		}
	case "token_ids":
		ev.TokenIDs, err = r.tokens()
	case "block_size":
		var n int64
		if n, err = r.d.DecodeInt64(); err == nil {
			if n < 0 || n > math.MaxInt32 {
				err = fmt.Errorf("block size %d out of range", n)
			}
			ev.BlockSize = int(n)
		}
	case "lora_id":
		var null bool
		if null, err = r.isNil(); err == nil && !null {
			var id int64
			if id, err = r.d.DecodeInt64(); err == nil {
				ev.LoRAID = &id
			}
		}
	case "medium":
		ev.Medium, err = r.optString()
	case "lora_name":
		ev.LoRAName, err = r.optString()
	default:
		err = r.d.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

func (r *reader) optString() (string, error) {
	if null, err := r.isNil(); err != nil || null {
		return "", err
	}
	return r.d.DecodeString()
}

func (r *reader) hashes() ([]uint64, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = r.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hash reads an integer hash (signed or not: only its 64 bits matter) or a
// digest as bytes, of which it keeps the last 8 read big-endian.
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		b, err := r.d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		var tail [8]byte
		copy(tail[8-min(len(b), 8):], b[max(len(b)-8, 0):])
		return binary.BigEndian.Uint64(tail[:]), nil
	case c == msgpcode.Uint64:
		return r.d.DecodeUint64()
	default:
		v, err := r.d.DecodeInt64()
		return uint64(v), err
	}
}

func (r *reader) tokens() ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint32, n)
	for i := range out {
		v, err := r.d.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d out of range", v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}
