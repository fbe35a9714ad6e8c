package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
)

// Defaults used by DefaultConfig and for zero-valued fields where zero has no
// sensible meaning.
const (
	DefaultName              = "sim"
	DefaultModel             = "cart-sim"
	DefaultBlockTokens       = 16
	DefaultPrefillUsPerToken = 50.0
	DefaultDecodeMsPerToken  = 5.0
	DefaultDecodeSlowdown    = 0.05
	DefaultMaxConcurrency    = 1
	DefaultOutputTokens      = 16
	// DefaultKVTransferUsPerToken is a decode leg's pull time per token.
	DefaultKVTransferUsPerToken = 5.0
	// DefaultStoredResponses bounds the Responses API store when
	// Config.StoredResponses is 0.
	DefaultStoredResponses = 10_000

	// MaxOutputTokens caps every request's output length so a trace with an
	// absurd max_tokens cannot keep a replica busy for minutes.
	MaxOutputTokens = 4096
)

// Config describes one simulated replica.
//
// Zero values are taken literally for the timing fields: a zero Config is a
// replica that never sleeps, which is what most in-process tests want. Use
// DefaultConfig for a replica with realistic timing (TimeScale 1).
// Name, Model, BlockTokens, MaxConcurrency and OutputTokens fall back to their
// defaults when zero because zero is meaningless for them.
type Config struct {
	// Name identifies the replica in the X-Sim-Replica response header.
	Name string
	// Model is the model id listed by /v1/models and used in responses when a
	// request names none. With Models empty, the replica accepts any model
	// name, which keeps tests that do not care about models short.
	Model string
	// Models, when given, are the base model names the replica serves (all
	// aliases of one engine, like vLLM's --served-model-name, so they share
	// one prefix cache); the first is the default and Model must be empty or
	// equal to it. A request for any other name that is not a loaded LoRA
	// adapter gets vLLM's 404.
	Models []string
	// LoRAModules are adapters loaded at start, like vLLM's --lora-modules;
	// more can be loaded and unloaded at run time over HTTP.
	LoRAModules []LoRAModule

	// NoCacheDetails omits cached-token counts from usage, as vLLM does
	// without --enable-prompt-tokens-details: chat and completions usage has
	// no prompt_tokens_details, and messages usage no cache_* fields (vLLM's
	// /v1/messages never reports them). The X-Sim-* headers still do.
	NoCacheDetails bool
	// StoredResponses bounds how many Responses API responses are kept for
	// previous_response_id and GET /v1/responses/{id}, least recently used
	// first out; 0 means DefaultStoredResponses.
	StoredResponses int

	// CacheTokens is the prefix cache capacity in tokens (rounded down to
	// whole blocks); 0 means unbounded.
	CacheTokens int
	// BlockTokens is the cache block size in tokens.
	BlockTokens int

	// PrefillUsPerToken is the prefill cost of one uncached prompt token, in
	// microseconds.
	PrefillUsPerToken float64
	// DecodeMsPerToken is the cost of one output token for a lone request,
	// in milliseconds.
	DecodeMsPerToken float64
	// DecodeSlowdown is the fractional decode slowdown added by each other
	// running request, modelling a larger batch.
	DecodeSlowdown float64
	// MaxConcurrency is the number of requests that can prefill at once.
	MaxConcurrency int
	// MaxRunning is the engine's batch limit (vLLM --max-num-seqs): at
	// most this many requests run, from admission to their last token; the
	// rest wait in the engine's queue. 0 runs every request at once.
	MaxRunning int
	// PriorityScheduling orders that queue by the request's "priority"
	// field (lower first, then arrival), as vLLM's --scheduling-policy
	// priority; otherwise first come, first served.
	PriorityScheduling bool

	// OutputTokens is the output length when a request sets no max_tokens.
	OutputTokens int
	// Seed makes the generated filler text differ between replicas or runs;
	// the same seed and prompt always produce the same text.
	Seed int64

	// TimeScale multiplies every modelled delay (prefill and decode). 1 is
	// real time, 0 disables sleeping entirely. Fault delays are not scaled:
	// they are wall-clock values chosen by the test that injects them.
	TimeScale float64

	// KVEvents, when set, receives the prefix cache's changes as vLLM KV
	// events (BlockStored, BlockRemoved, AllBlocksCleared on Reset).
	KVEvents KVEventSink

	// Role, "prefill" or "decode", makes the replica one of a split pool
	// speaking vLLM's NIXL connector protocol (pd.go); "" ignores
	// kv_transfer_params, as a vLLM without a KV connector.
	Role string
	// KVTransferMs and KVTransferUsPerToken model a decode leg's pull of
	// its prompt's KV cache: a fixed part and a part per token not cached
	// on the decode replica (scaled by TimeScale).
	KVTransferMs         float64
	KVTransferUsPerToken float64
	// KVHoldSecs is how long a prefill's blocks wait for a decode replica
	// to pull them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT); 0 means
	// DefaultKVHoldSecs. Wall-clock, not scaled.
	KVHoldSecs float64

	// Logger receives fault changes and aborted connections; nil discards.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration of a replica with realistic,
// real-time behaviour: 16-token blocks, an unbounded cache, a serial prefill
// queue at 50 µs/token and 5 ms/token decode.
func DefaultConfig() Config {
	return Config{
		Name:              DefaultName,
		Model:             DefaultModel,
		BlockTokens:       DefaultBlockTokens,
		PrefillUsPerToken: DefaultPrefillUsPerToken,
		DecodeMsPerToken:  DefaultDecodeMsPerToken,
		DecodeSlowdown:    DefaultDecodeSlowdown,
		MaxConcurrency:    DefaultMaxConcurrency,
		OutputTokens:      DefaultOutputTokens,
		StoredResponses:   DefaultStoredResponses,
		TimeScale:         1,
		// A 10k-token prompt pulls in 50 ms: ~25 GB/s for a 7B model's
		// 128 KB a token, what NIXL over RDMA moves.
		KVTransferUsPerToken: DefaultKVTransferUsPerToken,
		KVHoldSecs:           DefaultKVHoldSecs,
	}
}

// withDefaults fills the fields whose zero value is meaningless.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Model == "" && len(c.Models) > 0 {
		c.Model = c.Models[0]
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.OutputTokens == 0 {
		c.OutputTokens = DefaultOutputTokens
	}
	if c.StoredResponses == 0 {
		c.StoredResponses = DefaultStoredResponses
	}
	if c.KVHoldSecs == 0 {
		c.KVHoldSecs = DefaultKVHoldSecs
	}
	return c
}

// Validate reports whether New would accept c. Zero fields that have
// defaults are accepted.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.BlockTokens < 1 {
		errs = append(errs, fmt.Errorf("block tokens must be positive, got %d", c.BlockTokens))
	}
	if c.CacheTokens < 0 {
		errs = append(errs, fmt.Errorf("cache tokens must be 0 (unbounded) or positive, got %d", c.CacheTokens))
	} else if c.CacheTokens > 0 && c.BlockTokens > 0 && c.CacheTokens < c.BlockTokens {
		// A bounded cache smaller than one block could never hold anything,
		// which is almost certainly a units mistake rather than intent.
		errs = append(errs, fmt.Errorf("cache tokens (%d) must be at least one block (%d tokens)", c.CacheTokens, c.BlockTokens))
	}
	if c.MaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("max concurrency must be positive, got %d", c.MaxConcurrency))
	}
	if c.MaxRunning < 0 {
		errs = append(errs, fmt.Errorf("max running must be 0 (unbounded) or positive, got %d", c.MaxRunning))
	}
	if c.StoredResponses < 0 {
		errs = append(errs, fmt.Errorf("stored responses must be 0 (default) or positive, got %d", c.StoredResponses))
	}
	errs = append(errs, validateModels(c)...)
	if c.Role != "" && c.Role != RolePrefill && c.Role != RoleDecode {
		errs = append(errs, fmt.Errorf("%w, got %q", errBadRole, c.Role))
	}
	if c.OutputTokens < 1 || c.OutputTokens > MaxOutputTokens {
		errs = append(errs, fmt.Errorf("output tokens must be in 1..%d, got %d", MaxOutputTokens, c.OutputTokens))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"prefill µs per token", c.PrefillUsPerToken},
		{"decode ms per token", c.DecodeMsPerToken},
		{"decode slowdown", c.DecodeSlowdown},
		{"time scale", c.TimeScale},
		{"KV transfer ms", c.KVTransferMs},
		{"KV transfer µs per token", c.KVTransferUsPerToken},
		{"KV hold seconds", c.KVHoldSecs},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be a finite non-negative number, got %v", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// LoRAModule is a LoRA adapter served under Name; Path is only reported (as
// the adapter's "root" in /v1/models), since no weights are ever read.
type LoRAModule struct {
	Name string
	Path string
}

func validateModels(c Config) []error {
	var errs []error
	seen := make(map[string]bool)
	for _, m := range c.Models {
		if m == "" {
			errs = append(errs, errors.New("model names must not be empty"))
		} else if seen[m] {
			errs = append(errs, fmt.Errorf("model %q listed twice", m))
		}
		seen[m] = true
	}
	if len(c.Models) > 0 && c.Model != c.Models[0] {
		errs = append(errs, fmt.Errorf("model %q must be the first of models %q", c.Model, c.Models))
	}
	for _, l := range c.LoRAModules {
		switch {
		case l.Name == "" || l.Path == "":
			errs = append(errs, fmt.Errorf("LoRA module %q=%q needs both a name and a path", l.Name, l.Path))
		case seen[l.Name] || l.Name == c.Model:
			errs = append(errs, fmt.Errorf("LoRA module name %q is already a model name", l.Name))
		}
		seen[l.Name] = true
	}
	return errs
}
