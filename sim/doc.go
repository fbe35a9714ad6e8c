// Package sim is a simulated LLM inference replica that speaks the OpenAI
// (chat completions, completions, responses, models) and Anthropic (messages)
// HTTP APIs, plus vLLM's LoRA adapter endpoints.
//
// CART routes requests to replicas by where their prompt prefix is already
// cached, so the simulator's job is to reproduce the parts of a vLLM/SGLang
// engine that make routing decisions matter: an automatic prefix (KV) cache
// with block granularity and LRU eviction, a prefill stage whose cost is
// proportional to the uncached part of the prompt and that runs through a
// bounded FCFS queue, and a decode stage that slows down as more requests
// share the batch. It does not run a model; the generated text is filler.
//
// # Tokens and the prompt template
//
// Prompts are never tokenised for real. A request is rendered to bytes the way
// a chat template would, and every 4 bytes count as one token (rounded up).
// Counting bytes rather than runes keeps dense scripts (CJK, emoji) from being
// undercounted, as real BPE tokenisers also spend more tokens on them.
//
// The chat template, for /v1/chat/completions and /v1/messages, is
//
//	<|tools|>\n{canonical JSON of tools}\n        (only when tools are given)
//	<|system|>\n{system}\n                        (Anthropic top-level system only)
//	<|{role}|>\n{content}[<|tool_calls|>{JSON}]\n (once per message)
//	<|assistant|>\n                               (the generation prompt)
//
// Text content is copied verbatim. Any other content part (an image, audio, a
// file, a tool result block...) becomes "<|{type}:{hash}|>", where hash is a
// 64-bit FNV-1a hash of the part's canonical JSON, so two requests carrying the
// same image share a prefix and two carrying different images do not.
//
// For /v1/completions a string prompt is used as is, a list of strings is
// concatenated, and token-id arrays contribute exactly one token per id (each
// id is encoded as 4 bytes).
//
// Because messages are appended in order, a multi-turn conversation's next
// request has the previous request's rendered text (minus the generation
// prompt) as its prefix, which is what makes prefix caching pay off.
//
// # Prefix cache
//
// The rendered prompt is cut into blocks of BlockTokens tokens; only full
// blocks are cached. Each block is identified by a hash chained over all the
// blocks before it, so a block only matches when the whole prefix up to and
// including it matches. A request's cache hit is the longest run of leading
// blocks present in the cache. The cache holds CacheTokens/BlockTokens blocks
// (unbounded when CacheTokens is 0) and evicts least-recently-used blocks;
// within one prompt the tail blocks are the older ones, so under pressure a
// prompt loses its suffix before its prefix, as in vLLM.
//
// The lookup happens when a request is admitted to prefill (not on arrival)
// and the prompt's blocks are inserted when its prefill finishes, mirroring a
// real scheduler: a request queued behind an identical one benefits from it,
// while one that is prefilled concurrently with it does not.
//
// # Models and LoRA adapters
//
// With Config.Models empty the replica lists Config.Model and accepts any
// model name. With Models given it serves exactly those names (aliases of one
// engine, sharing one cache, the first being the default) plus its loaded
// LoRA adapters, and answers any other name with vLLM's 404
// {"error":{"message":"The model `x` does not exist.","type":"NotFoundError",
// "param":"model","code":404}} (Anthropic-shaped on /v1/messages).
// /v1/models lists cards in vLLM's shape; an adapter's root is its path and
// its parent the default model. POST /v1/load_lora_adapter
// {"lora_name","lora_path"[,"load_inplace"]} and POST
// /v1/unload_lora_adapter {"lora_name"} answer as vLLM does: a plain-text
// "Success: LoRA adapter 'x' added successfully." (or "removed"), 400
// InvalidUserInput for a missing field or an adapter already loaded, 404
// NotFoundError when unloading one that is not. A request for an adapter
// seeds its block hashes with the adapter name, so different adapters, and
// an adapter and its base model, never share cached blocks.
//
// # cache_salt
//
// A request's cache_salt seeds its block hashes as well, as vLLM mixes it
// into the first block's hash: requests with different salts, or one with
// a salt and one without, share no cached block. Like vLLM, the simulator
// reads the field on chat completions, completions and responses (an empty
// string is a 400), and not on /v1/messages, whose vLLM request model has
// no such field.
//
// # Responses API
//
// POST /v1/responses renders instructions as a system turn, then the input:
// a string is a user turn; message items keep role and content (input_text
// and output_text parts are text, images and files become placeholders);
// function_call items render as assistant tool calls, function_call_output
// items as tool turns, and other items as placeholders. It streams OpenAI's
// events (response.created ... response.output_text.delta ...
// response.completed, numbered by sequence_number) or answers one JSON
// response. Unless store is false, the response is kept in a bounded LRU
// (Config.StoredResponses) for GET /v1/responses/{id} and for
// previous_response_id, whose conversation (without its system turn, since
// instructions do not carry over) and output are put before the new input:
// the new prompt extends the previous one, so the prefix cache works across
// turns. An id this replica never stored gets vLLM's 404 "Response with id
// '...' not found.". Usage is input_tokens, input_tokens_details.cached_tokens,
// output_tokens and total_tokens.
//
// # Usage and cache details
//
// By default chat and completions usage carries
// prompt_tokens_details.cached_tokens and /v1/messages usage reports
// cache_read_input_tokens (with input_tokens excluding them, as Anthropic
// does). Config.NoCacheDetails drops both, as a vLLM started without
// --enable-prompt-tokens-details answers (its /v1/messages never has cache
// fields): input_tokens is then the whole prompt. The Responses API always
// reports cached_tokens, as vLLM's does. The X-Sim-Prompt-Tokens and
// X-Sim-Cached-Tokens headers always tell the truth.
//
// # KV events
//
// With Config.KVEvents set (cart-sim's --kv-events-endpoint), every change
// of the prefix cache is published as vLLM's KV events, one batch per
// change (see package kvevents for the wire format): a prompt's insertion
// sends one BlockStored per run of newly cached blocks (block_hashes the
// 64-bit chained hashes above, parent_block_hash the block before the run,
// token_ids each token's 4 bytes read little-endian, so a token-id prompt
// sends its own ids, block_size, lora_name the adapter, medium "GPU"),
// followed by one BlockRemoved with the blocks it evicted; Reset sends
// AllBlocksCleared. A consumer applying the events in order holds exactly
// the blocks the cache holds. Lookups send nothing: vLLM's events report
// content, not use.
//
// # Timing
//
// Prefill holds one of MaxConcurrency slots for
// uncached_tokens × PrefillUsPerToken µs. Decode does not hold a slot; each
// output token takes DecodeMsPerToken × (1 + DecodeSlowdown × (running-1)) ms,
// where running counts requests that have been admitted and not finished.
// Every modelled delay is multiplied by TimeScale; with TimeScale 0 nothing
// sleeps, which keeps unit tests fast while preserving ordering.
//
// # Control endpoints
//
// GET /health, GET /metrics (Prometheus), GET /sim/stats, GET|POST /sim/fault
// and POST /sim/reset control and observe a replica; see [Server.SetFault],
// [Server.Stats] and [Server.Reset] for their in-process equivalents.
package sim
