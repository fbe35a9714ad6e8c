// Package kvevents is the wire format of KV-cache events as vLLM publishes
// them (vllm/distributed/kv_events.py), with an encoder, a decoder and a ZMQ
// publisher. cart-sim publishes with it; a consumer (CART's control plane)
// decodes with it.
//
// # Frames
//
// Each batch goes out on a ZMQ PUB socket as a three-frame message: the topic
// (possibly empty), the batch's sequence number as 8 bytes big-endian
// (consecutive per publisher, from 0 in vLLM and from 1 in
// llm-d-inference-sim, so a gap shows a loss and a step back a restart),
// and the msgpack payload. A ROUTER replay socket answers a request whose
// last frame is an 8-byte big-endian start sequence with one message per
// buffered batch from that sequence on, ending in its (sequence, payload)
// frames, then the same with sequence -1 and an empty payload.
//
// # Payload
//
// A batch is the msgpack array [ts, events, data_parallel_rank] (ts a float
// of Unix seconds). Events come in two encodings, both produced by vLLM
// releases (msgspec structs with tag=True, with and without array_like):
//
//   - map (current): each event is a map whose "type" field names it
//     ("BlockStored", "BlockRemoved", "AllBlocksCleared"), then its fields
//     by name: block_hashes, parent_block_hash, token_ids, block_size,
//     lora_id, medium, lora_name for BlockStored; block_hashes, medium for
//     BlockRemoved.
//   - array (older): each event is an array whose first element is the tag
//     and the rest the same fields in that order.
//
// Decode accepts both, and also a batch encoded as a map (ts, events,
// data_parallel_rank), as vLLM's newest releases send it. Unknown map fields
// and extra trailing array fields are skipped, so later vLLM fields (group
// ids, extra keys...) do not break decoding. Block hashes are integers (the
// low 64 bits of the engine's hash, vLLM's default) or, with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, byte strings of the whole digest,
// whose last 8 bytes are read big-endian to get the same 64-bit value.
//
// # Sequence numbers (Subscriber)
//
// Per (topic, rank) stream: the next expected number; a jump is replayed from
// the engine's ROUTER (request ["", start], as a REQ socket sends it, answers
// until −1, the last two frames of each answer read as sequence and payload:
// vLLM puts an empty delimiter before them, llm-d-inference-sim a delimiter
// and the topic), taken only if it starts exactly at the gap and runs without
// a hole; a smaller number is a publisher restart (new engine process, empty
// cache), known from that batch on. Anything not recovered is reported lost.
// Choice: a stream is known from the first batch seen, whatever its number,
// with no replay asked for what came before. Publishers do not agree on the
// first number (vLLM 0, llm-d-inference-sim 1: asking it for 0 could never
// succeed, and every stream stayed unknown), a restarted publisher may be
// first seen past its start, and what an engine stored before CART joined is
// its oldest content, the first an LRU engine evicts; the cost is an occupancy
// under-counted until those blocks turn over. Frames of both publishers are
// kept as testdata (kvevents/testdata: the simulator's recorded from a running
// one, vLLM's built from its source).
package kvevents
