// Package extract parses inference request bodies (OpenAI chat completions
// and completions, Anthropic messages) and derives the key text T that the
// router cuts into blocks and hashes to find the replica holding the longest
// matching prompt prefix in its KV cache.
//
// # Key format
//
// T is a byte string whose only job is prefix comparison, so it is built to
// satisfy two properties:
//
//   - Injective: different prompts give different T. Content is copied with
//     every C0 control byte except TAB, LF and CR replaced by ESC (0x1b)
//     followed by the byte plus 0x40, which frees those control bytes for
//     use as structure that no content can imitate.
//   - Append-only: a request that resends a conversation plus new messages
//     has the earlier request's T as an exact prefix. Every message is a
//     self-terminated record and nothing derived from the request as a whole
//     (message count, tools, sampling parameters) is included.
//
// Structure bytes:
//
//	RS  0x1e  ends a message record; separates the prompts of a batch
//	US  0x1f  starts an item inside a record; ends each token id
//	NUL 0x00  right after US: the item is a marker, not plain text
//	GS  0x1d  separates the sub-fields of a marker
//	STX 0x02, ETX 0x03  bracket the items nested in a marker
//
// Chat completions and Anthropic messages:
//
//	T       = [system] record*
//	system  = "system" item* RS        (Anthropic top-level system only)
//	record  = role item* RS
//	item    = US text
//	        | US NUL "name:" text | US NUL "call_id:" text
//	        | US NUL "refusal:" text | US NUL "think:" text
//	        | US NUL ("img" | "audio" | "video" | "file" | "doc") ":" hash
//	        | US NUL "tool_call:" id GS name GS arguments
//	        | US NUL "fn_call:" name GS arguments
//	        | US NUL "tool_use:" id GS name GS input
//	        | US NUL "tool_result:" id [GS "error"] STX item* ETX
//	        | US NUL "doc:" STX item* ETX        (document with content source)
//	        | US NUL "redacted_think:" hash
//	        | US NUL "part:" type ":" hash       (part type unknown to this package)
//
// where hash is the first 8 bytes, in hex, of a SHA-256 over the media's
// identity (its data or URL, or the client's uuid, which vLLM keys its
// multimodal cache by), so that big payloads cost a hash instead of a copy
// while different media never look like the same prefix. Parts of unknown
// types are hashed from their JSON with keys sorted and cache_control left
// out. Fields that do not change what the model sees (image detail,
// cache_control, signatures) are left out.
//
// System blocks whose text starts with one of Options.IgnoreSystemPrefixes
// (Claude Code's per-request billing header by default) add nothing to T,
// and a system prompt or message made only of them adds no record, so T is
// what it would be had the client not sent them.
//
// A string content and a single text part give the same T, and Anthropic
// text conversations give the same T as the equivalent chat completions
// request, because vLLM renders both through the same chat template.
//
// Completions: a string prompt is its text; an array of strings is the
// texts joined by RS (so ["x"] and "x" agree); token ids are decimal, each
// followed by US; an array of token-id arrays joins them by RS; vLLM's
// prompt_embeds add US NUL "embeds:" hash.
//
// # The body CART checks is the body the engine reads
//
// Go's encoding/json v1 matches keys case-insensitively (with Unicode folding)
// and merges repeated objects; Python's json.loads + pydantic match exactly
// and keep the last value. So one walk over every routed body (and every
// passed-through body while remote_media_url_policy is on) refuses repeated
// and case-variant keys, and keys that are case variants of a field we decode
// (derived from the request structs by reflection, so the check cannot drift
// from the decoder). The remote-media policy does not trust the per-type
// decoding at all: that walk checks every string under any media-named field,
// in any part type and any endpoint, because engines read media fields by name
// (vLLM takes part["image_url"] of any part carrying a uuid). It errs towards
// refusing. The body is then decoded once, with exact-case names as the
// engines read them (encoding/json v2, below), and FuzzEngineSemantics holds
// what extraction reports to the engine's reading of the same bytes.
//
// # One decoder
//
// A routed body goes through one walk and one decode. The walk (scan.go) sees
// every member of every object: it refuses repeated keys and keys that differ
// only in case (and case variants of a field CART decodes), checks every
// string under a media-named field in any part, and counts array items, all
// before anything is decoded. The decode is
// github.com/go-json-experiment/json, the module form of Go's encoding/json/v2
// (stable in Go 1.27, where the module aliases the standard library): it
// matches member names exactly, as Python's json.loads + pydantic do; repeated
// names are left to the walk (it refuses them where engines read and tolerates
// them in tool arguments and schemas, as Python does) and invalid UTF-8
// becomes U+FFFD (json.loads takes lone surrogate escapes; raw invalid bytes
// the engine refuses itself). Raw fields (rawJSON) keep pointing into the body
// instead of being copied (TestRawJSONPointsIntoTheBody pins that the decoder
// reads the caller's bytes in place). This replaced a hand decoder for chat
// and completions (fast.go, 500 lines, fuzzed against encoding/json) with
// encoding/json v1 behind it and for the other endpoints, and the
// offset-to-path walk of v1's type errors (v2 reports a JSON Pointer).
// FuzzEngineSemantics holds every accepted body to a reference of the engine's
// reading (the v1 tokenizer, dict semantics: exact names, the last repeated
// name wins): model, stream, user, salt, cache key, include_usage,
// previous_response_id, and each chat message's record.
//
// Measured (go test -run '^$' -bench . -benchmem ./dataplane/extract, six
// alternating runs of each test binary at load 11-14 on the shared 2-core box,
// benchstat medians, bench/results/2026-12-07-lighter/extract/): the
// proxy-overhead body (one 512-byte message) 2.0 µs and 6 allocations (968 B)
// with the hand decoder, 2.4 µs and 5 (608 B) now, no significant difference
// (p=0.39); a 10 KB conversation 27 against 28 µs (p=0.49), 8 against 9
// allocations; a 1 MB image in chat 5.7 → 2.5 ms and 1.1 MB → 65 KB allocated,
// in Anthropic messages 8.8 → 2.1 ms and 2.1 MB → 65 KB, the Responses API
// conversation 153 → 48 µs (its raw fields were copied by v1). Against
// encoding/json v1 on the chat path (what every other endpoint used): 4.6 →
// 2.4 µs and 15 → 5 allocations for the small body, 63 → 28 µs and 49 → 9 for
// the conversation.
package extract
