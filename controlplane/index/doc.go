// Package index is CART's prefix index: it remembers which workers were sent
// which prompt prefixes, as chains of block hashes, and answers "who holds
// the longest prefix of this prompt".
//
// It is pure decision state: no I/O, no goroutines, no clock (callers pass
// the time in as an opaque int64, e.g. Unix nanoseconds), and no locking.
// It never stores prompt text, only 64-bit hashes.
//
// Entries live in a slab with an intrusive LRU list, so touching, evicting
// and inserting are O(1) per block and the match path allocates nothing.
// Deeper blocks are always older than or as old as their ancestors in the
// LRU order (a path is touched leaf-first, root-last), so eviction from the
// tail removes leaves before the prefixes they extend and never leaves an
// unreachable suffix behind a hole.
//
// # Blocks and hashes
//
// Key text is cut into cache.block_chars blocks; block i's 64-bit xxhash
// covers blocks 0..i and the chain is seeded with the model (with vLLM's
// cache_salt, model NUL salt: the engine isolates salted caches, so the index
// must too; unsalted requests keep their hashes). "Characters" are bytes of
// UTF-8: for the ASCII-heavy text of prompts the difference is irrelevant, and
// bytes make hashing allocation-free and identical on every node. The hash is
// the wire format between data planes and the control plane.
//
// Block size: 128 characters (~32 tokens) by default, chosen in
// bench/results/2026-12-01-blocksize against 64 and 256. Against 64 it halves
// the blocks per route and the decide CPU on long prompts (llm-d shared prefix
// 57 → 29 µs, Mooncake 215 → 96 µs) at no hit-ratio cost where shared prefixes
// end at arbitrary characters, and within noise on multi-turn chats; its cost
// is on short prompts (a third under 256 characters): −0.7 to −0.8 points of
// token hit ratio, because a prompt of up to one block matches only an
// identical one and a prefix is matched only to its last whole block. A data
// plane whose control plane reports another size in Sync logs an error and
// calls Route without block hashes until they agree: its hashes would never
// match the index and would fill it with entries nobody else can match, while
// the leader still balances and pins sessions and stored responses (the local
// fallback does neither); placement-feed frames, hashed at the leader's size,
// are not recorded meanwhile.
//
// # The hash table
//
// Entries live in a slab ([]entry) indexed by a flat open-addressing hash
// table of our own (table.go: one uint64 a slot, a 32-bit fingerprint over the
// slab slot, linear probing with backward-shift deletion, at most 3/4 full,
// keyed with a random seed per table so that clients cannot aim prompts at one
// probe run), with an intrusive LRU list. Against the Go map it replaced
// (BenchmarkTable, 1M entries, ns): hit 110 vs 145, miss 54 vs 67, delete 65
// vs 141, delete + insert 154 vs 262; the index benchmarks' lookups and
// inserts 28-52% faster (BenchmarkLookup, BenchmarkInsert,
// BenchmarkHotPathCPU), 93 against 114 bytes an entry.
//
// Several workers may hold one entry (a system prompt): one inline holder plus
// an overflow slice, since most entries have one holder. ~93 bytes per entry
// at 1M entries.
//
// # Bounds
//
// A periodic pass (decider maintenance, cache.eviction_interval_secs) trims to
// cache.max_tree_size in chunks of 128 entries per lock hold (well under 1 ms
// of CPU at 1M entries, also while a snapshot makes writes copy pages; 2048
// took up to 3.5 ms), so routing never waits long behind it. Between passes
// the index may grow by 1/8, and half-way into that headroom it asks for a
// pass at once (cart_decider_pressure_passes_total): the headroom covers a
// pass's delay, not an interval's new blocks. Until this, the index filled its
// headroom half a second into a 5,000 routes/s run of new prompts and then
// recorded nothing new for the rest of the minute (every cart-bench cp run
// before bench/results/2026-12-02-pressure measured such an index). Only if
// inserts outrun the pass are inserts of new entries skipped (shallowest
// blocks kept) and counted (cart_index_skipped_inserts_total,
// cart_cp_index_skipped_inserts_total; alert CartIndexNotLearning) instead of
// waiting. With the interval set to 0 there is no pass and the index evicts
// inline (O(1) per entry) to stay bounded.
//
// # Loads ahead of the walk
//
// A lookup, an insert and an eviction step first load the table words their
// walk will read (all of an insert's hashes, a lookup's 32 at a time, the next
// 128 tail entries of an eviction): independent loads whose cache misses
// overlap, where the walk's own loads wait for each other. BenchmarkLookupCold
// 1.16-1.43 → 0.79-0.92 µs, a 78-block insert into a full index 18.6-23.1 →
// 12.9-14.3 µs, a 128-entry eviction step 21.7-26.6 → 17.6-18.6 µs of CPU
// (bench/results/2026-12-02-pressure/micro).
//
// # Copy-on-write pages (Freeze)
//
// Snapshots (controlplane/state) freeze the index instead of copying it under
// the engine lock, which took 170 ms-1.2 s at a million entries, routing
// waiting all along. The slab lives in pages of 64 entries behind a flat page
// table; Freeze copies the table (one pointer per 64 entries, ~0.2 ms of CPU
// at 1M entries) and returns a read-only view; the state machine adds the
// worker set and the ledger's undo. While a view is alive, the first write to
// a page copies it (holder lists cloned with it), so the view keeps the state
// at capture time; once the snapshot is persisted raft releases it and writes
// go in place again. Costs: one more indirection per slot on the routing path
// (measured in CPU time at 1M entries: lookup +5-10%, refresh of a known path
// +35-45%, insert of new blocks within noise), and while a snapshot is
// written, writes copy the pages they touch (at most the whole slab, ~75 MB at
// 1M entries, once per snapshot). A two-level table made Freeze ~1 µs but
// doubled the cost of a refresh; an immutable radix tree allocates on every
// insert.
//
// # Allocation outside the lock
//
// Control-plane nodes, the all-in-one router and the data planes' shadow
// indexes allocate the hash table for the index's bound when they start
// (Options.Presize; 16 MB for the default 1M entries, its pages mapped at once
// so that no insert faults them in under the lock): a table grown under the
// lock doubles in the insert that crosses 3/4 full, whose allocation of the
// next array took up to 4 ms near 1M entries (go test -run '^$' -bench
// InsertWhileGrowing -benchtime 1x ./controlplane/index/, presize=false; its
// entries then move over in steps of 64 slots).
//
// Restore's hash table for the records (then a Go map) is now allocated before
// the lock at their count (Reserve), so the chunks no longer grow it: probe
// wait p99 0.92-1.23 → 0.35-0.37 ms, longest 6.6 → 1.9-3.5 ms, restore 581-665
// → 544-572 ms (two alternating runs each). The waits left above 1 ms are the
// garbage collector's mark phases, which the decoding sets off.
package index
