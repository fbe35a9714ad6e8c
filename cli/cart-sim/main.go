// Command cart-sim runs one simulated OpenAI/Anthropic-compatible inference
// replica with a prefix cache, for local demos, end-to-end tests and
// benchmarks of the CART router. See package sim for the model it simulates.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/cli/internal/buildinfo"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
)

// shutdownGrace bounds how long a stop waits for connections to close. In
// practice it is short: sim.Server.Close aborts in-flight generations first.
const shutdownGrace = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newCommand(serve).ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1) // cobra has already printed the error
	}
}

// serveFunc runs a replica until ctx ends; a parameter so tests can check
// flag handling without opening sockets.
type serveFunc func(ctx context.Context, listen string, kv kvevents.PublisherConfig, cfg sim.Config, logOut io.Writer) error

func newCommand(run serveFunc) *cobra.Command {
	cfg := sim.DefaultConfig()
	cfg.Name = "" // derived from the listen port unless given
	var listen string
	var loras []string
	var kv kvevents.PublisherConfig
	var kvEncoding, schedPolicy string

	cmd := &cobra.Command{
		Use:   "cart-sim",
		Short: "Simulated LLM inference replica with a prefix (KV) cache",
		Long: `cart-sim serves /v1/chat/completions, /v1/completions, /v1/messages,
/v1/responses (with store and previous_response_id), /v1/models and vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter like a vLLM/SGLang replica,
without a model: it approximates
tokens as 4 bytes, keeps an LRU prefix cache of 16-token blocks, queues
prefills and paces decode, and reports cache hits in usage and in the
X-Sim-Cached-Tokens / X-Sim-Prompt-Tokens headers.

With --kv-events-endpoint it publishes its cache's changes as vLLM's KV events
(BlockStored, BlockRemoved, AllBlocksCleared on /sim/reset) over ZMQ.

Control and observation: GET /health, GET /metrics, GET /sim/stats,
GET|POST /sim/fault {"mode":"none|down|slow|error","status":503,"delay_ms":2000},
POST /sim/reset.`,
		Example:      "  cart-sim --listen 127.0.0.1:8001 --name a --cache-tokens 65536",
		Version:      buildinfo.String("cart-sim"),
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Name == "" {
				cfg.Name = nameFromListen(listen)
			}
			if len(cfg.Models) > 0 {
				if cmd.Flags().Changed("model") && cfg.Model != cfg.Models[0] {
					return fmt.Errorf("--model %q conflicts with --models: the first of --models is the default model", cfg.Model)
				}
				cfg.Model = cfg.Models[0]
			}
			mods, err := parseLoRAModules(loras)
			if err != nil {
				return err
			}
			cfg.LoRAModules = mods
			if kv.Encoding, err = kvevents.ParseEncoding(kvEncoding); err != nil {
				return err
			}
			if kv.Endpoint == "" && (kv.ReplayEndpoint != "" || kv.Topic != "" || kv.Connect) {
				return errors.New("--kv-events-replay-endpoint, --kv-events-topic and --kv-events-connect need --kv-events-endpoint")
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			switch schedPolicy {
			case "fcfs":
			case "priority":
				cfg.PriorityScheduling = true
			default:
				return fmt.Errorf("--scheduling-policy %q: want fcfs or priority", schedPolicy)
			}
			return run(cmd.Context(), listen, kv, cfg, cmd.ErrOrStderr())
		},
	}

	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8001", "address to listen on (host:port)")
	f.StringVar(&cfg.Name, "name", "", "replica name sent in X-Sim-Replica (default sim-PORT)")
	f.StringVar(&cfg.Model, "model", cfg.Model, "model id listed by /v1/models and used when a request names none; without --models any model name is accepted")
	f.StringSliceVar(&cfg.Models, "models", nil, "comma-separated model names served (aliases of one engine sharing one cache; the first is the default); other names get vLLM's 404")
	f.StringArrayVar(&loras, "lora-modules", nil, "LoRA adapter NAME=PATH loaded at start (repeatable); more via POST /v1/load_lora_adapter")
	f.BoolVar(&cfg.NoCacheDetails, "no-cache-details", false, "omit cached tokens from usage like vLLM without --enable-prompt-tokens-details: no prompt_tokens_details, no cache_* in /v1/messages")
	f.IntVar(&cfg.StoredResponses, "stored-responses", sim.DefaultStoredResponses, "Responses API responses kept for previous_response_id (least recently used dropped first)")
	f.IntVar(&cfg.CacheTokens, "cache-tokens", cfg.CacheTokens, "prefix cache capacity in tokens, 0 for unbounded")
	f.IntVar(&cfg.BlockTokens, "block-tokens", cfg.BlockTokens, "prefix cache block size in tokens")
	f.Float64Var(&cfg.PrefillUsPerToken, "prefill-us-per-token", cfg.PrefillUsPerToken, "prefill time per uncached prompt token, in microseconds")
	f.Float64Var(&cfg.DecodeMsPerToken, "decode-ms-per-token", cfg.DecodeMsPerToken, "decode time per output token for a lone request, in milliseconds")
	f.Float64Var(&cfg.DecodeSlowdown, "decode-slowdown", cfg.DecodeSlowdown, "extra decode time fraction per additional running request")
	f.IntVar(&cfg.MaxConcurrency, "max-concurrency", cfg.MaxConcurrency, "requests that may prefill at once")
	f.IntVar(&cfg.MaxRunning, "max-num-seqs", 0, "requests the engine runs at once, from admission to their last token (vLLM --max-num-seqs); more wait in its queue (0 = unbounded)")
	f.StringVar(&schedPolicy, "scheduling-policy", "fcfs", "order of the engine's waiting queue: fcfs, or priority (the request's \"priority\" field, lower first, as vLLM)")
	f.IntVar(&cfg.OutputTokens, "output-tokens", cfg.OutputTokens, "output tokens when a request sets no max_tokens")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed for the generated filler text")
	f.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "multiplier for every simulated delay (0 = never sleep)")
	f.StringVar(&kv.Endpoint, "kv-events-endpoint", "", "publish KV-cache events as vLLM does on a ZMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557 (off when empty)")
	f.BoolVar(&kv.Connect, "kv-events-connect", false, "connect the PUB socket to --kv-events-endpoint instead of binding it (for a consumer that binds)")
	f.StringVar(&kv.ReplayEndpoint, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER here that replays buffered event batches from a requested sequence number")
	f.StringVar(&kv.Topic, "kv-events-topic", "", "topic frame of every KV event message")
	f.StringVar(&kvEncoding, "kv-events-encoding", "map", "KV event layout: map (events are maps tagged by \"type\", current vLLM) or array (older vLLM)")
	f.StringVar(&cfg.Role, "pd-role", "", "prefill or decode: a replica of a split pool speaking vLLM's NIXL connector protocol (kv_transfer_params); empty ignores the field")
	f.Float64Var(&cfg.KVTransferMs, "kv-transfer-ms", cfg.KVTransferMs, "decode legs: fixed time of a KV pull from the prefill replica, in milliseconds")
	f.Float64Var(&cfg.KVTransferUsPerToken, "kv-transfer-us-per-token", cfg.KVTransferUsPerToken, "decode legs: KV pull time per prompt token not cached on the decode replica, in microseconds")
	f.Float64Var(&cfg.KVHoldSecs, "kv-hold-secs", cfg.KVHoldSecs, "prefill legs: how long finished blocks wait for a decode replica to pull them (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	return cmd
}

// parseLoRAModules reads NAME=PATH pairs, vLLM's --lora-modules syntax.
func parseLoRAModules(specs []string) ([]sim.LoRAModule, error) {
	var out []sim.LoRAModule
	for _, spec := range specs {
		name, path, ok := strings.Cut(spec, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--lora-modules %q: want NAME=PATH", spec)
		}
		out = append(out, sim.LoRAModule{Name: name, Path: path})
	}
	return out, nil
}

// nameFromListen names a replica after its port, so that three local
// replicas are told apart in X-Sim-Replica without extra flags.
func nameFromListen(listen string) string {
	if _, port, err := net.SplitHostPort(listen); err == nil && port != "" && port != "0" {
		return "sim-" + port
	}
	return sim.DefaultName
}

// serve listens on listen, opens the KV event publisher when kv names an
// endpoint, and serves a replica until ctx ends.
func serve(ctx context.Context, listen string, kv kvevents.PublisherConfig, cfg sim.Config, logOut io.Writer) error {
	var pub *kvevents.Publisher
	if kv.Endpoint != "" {
		kv.Logger = slog.New(slog.NewTextHandler(logOut, nil))
		var err error
		if pub, err = kvevents.NewPublisher(kv); err != nil {
			return err
		}
		defer pub.Close()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return serveListener(ctx, ln, pub, cfg, logOut)
}

// serveListener serves a replica on ln until ctx ends, then stops it: the
// replica is closed first so long generations do not hold up the shutdown.
// A non-nil pub receives the replica's KV events; the caller closes it.
func serveListener(ctx context.Context, ln net.Listener, pub *kvevents.Publisher, cfg sim.Config, logOut io.Writer) error {
	logger := slog.New(slog.NewTextHandler(logOut, nil))
	cfg.Logger = logger
	if pub != nil {
		cfg.KVEvents = pub
		logger.Info("publishing KV events", "pub", pub.Addr(), "replay", pub.ReplayAddr())
	}
	replica := sim.New(cfg)
	srv := &http.Server{
		Handler:           replica.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("cart-sim listening", "addr", ln.Addr().String(), "name", cfg.Name, "model", cfg.Model,
		"cache_tokens", cfg.CacheTokens, "max_concurrency", cfg.MaxConcurrency, "time_scale", cfg.TimeScale, "pd_role", cfg.Role)

	select {
	case err := <-errc:
		_ = replica.Close()
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	logger.Info("cart-sim stopping")
	_ = replica.Close() // never fails; aborts in-flight requests
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if serveErr := <-errc; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && err == nil {
		err = serveErr
	}
	return err
}
