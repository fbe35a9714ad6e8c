// Command cart-bench is CART's load generator and benchmark suite.
//
//	cart-bench run --target http://127.0.0.1:6700 --trace ../shared/traces/mooncake_conversation.jsonl --limit 200
//	cart-bench suite                 # every scenario on the default slice
//	cart-bench overhead              # proxy overhead: CART vs nginx and Caddy
//	cart-bench epp-overhead          # endpoint picker: the ext_proc path vs the proxy path
//	cart-bench cp                    # control plane: Route load on three nodes
//	cart-bench failover              # leader kill under load: hit ratio, errors
//	cart-bench alternate --variant base=/tmp/base-bin --variant new=bin -o DIR -- overhead
//	                                 # builds or settings compared in alternating runs
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cartrouter/cart/bench"
	"github.com/cartrouter/cart/cli/internal/buildinfo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:          "cart-bench",
		Short:        "Load generator and benchmark suite for CART",
		Version:      buildinfo.String("cart-bench"),
		SilenceUsage: true,
	}
	root.AddCommand(newRunCmd(), newSuiteCmd(), newOverheadCmd(), newEPPOverheadCmd(), newOracleCmd(), newCPCmd(), newFailoverCmd(), newOverloadCmd(), newOverloadPoolCmd(), newAlternateCmd(), newPDCmd())
	return root
}

func newRunCmd() *cobra.Command {
	c := bench.DefaultRunConfig()
	var out string
	var noProgress bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Replay a trace or a synthetic workload against one endpoint",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if c.Workload == "trace" && c.TracePath == "" {
				return fmt.Errorf("--trace is required for the trace workload")
			}
			var progress = cmd.ErrOrStderr()
			if noProgress {
				progress = nil
			}
			res, err := bench.Execute(cmd.Context(), c, c.Workload, progress)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), bench.FormatSummary(res.Summary))
			if out == "" {
				return nil
			}
			if err := bench.WriteJSON(out, res); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Target, "target", c.Target, "endpoint base URL (/v1 is appended)")
	f.StringVar(&c.Model, "model", c.Model, "model name sent in requests")
	f.StringVar(&c.Workload, "workload", c.Workload, "trace, gsp or multiturn")
	f.StringVar(&c.TracePath, "trace", "", "Mooncake-format JSONL trace (workload trace)")
	f.IntVar(&c.Start, "start", 0, "skip this many trace records")
	f.IntVar(&c.Limit, "limit", 0, "send at most this many requests (0 = all)")
	f.Float64Var(&c.Speedup, "speedup", c.Speedup, "divide trace timestamps by this factor")
	f.Float64Var(&c.Rate, "rate", 0, "ignore timestamps: Poisson arrivals at this many requests/s (0 = use the trace's)")
	f.IntVar(&c.MaxTokensCap, "max-tokens-cap", c.MaxTokensCap, "cap on max_tokens (output_length); 0 = no cap")
	f.Uint64Var(&c.Seed, "seed", c.Seed, "seed for generated arrivals")
	f.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "safety cap on requests in flight (arrivals beyond it wait and are counted)")
	f.DurationVar(&c.RequestTimeout, "request-timeout", c.RequestTimeout, "timeout of one request")
	f.DurationVar(&c.RunTimeout, "run-timeout", c.RunTimeout, "timeout of the whole run")
	f.IntVar(&c.PoolCacheTokens, "pool-cache-tokens", 0, "total cache capacity of the pool in tokens, for the oracle (0 = unbounded)")
	f.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "replica cache block size in tokens, for the oracle")
	f.StringSliceVar(&c.Replicas, "replicas", nil, "names of the pool's replicas (X-Sim-Replica), so idle ones count in the imbalance")
	f.BoolVar(&c.RecordRequests, "records", false, "include per-request records in the JSON output")
	f.StringVarP(&out, "out", "o", "", "write the run's JSON here")
	f.BoolVar(&noProgress, "no-progress", false, "no progress line on stderr")
	f.IntVar(&c.GSP.Groups, "gsp-groups", c.GSP.Groups, "gsp: number of shared system prompts")
	f.IntVar(&c.GSP.PromptsPerGroup, "gsp-prompts-per-group", c.GSP.PromptsPerGroup, "gsp: questions per system prompt")
	f.IntVar(&c.GSP.SystemTokens, "gsp-system-tokens", c.GSP.SystemTokens, "gsp: system prompt length")
	f.IntVar(&c.GSP.QuestionTokens, "gsp-question-tokens", c.GSP.QuestionTokens, "gsp: question length")
	f.IntVar(&c.GSP.OutputTokens, "gsp-output-tokens", c.GSP.OutputTokens, "gsp: output length (then capped by --max-tokens-cap)")
	f.IntVar(&c.MultiTurn.Chats, "mt-chats", c.MultiTurn.Chats, "multiturn: conversations")
	f.IntVar(&c.MultiTurn.Turns, "mt-turns", c.MultiTurn.Turns, "multiturn: turns per conversation")
	f.IntVar(&c.MultiTurn.SystemTokens, "mt-system-tokens", c.MultiTurn.SystemTokens, "multiturn: system prompt length")
	f.IntVar(&c.MultiTurn.QuestionTokens, "mt-question-tokens", c.MultiTurn.QuestionTokens, "multiturn: question length per turn")
	f.IntVar(&c.MultiTurn.OutputTokens, "mt-output-tokens", c.MultiTurn.OutputTokens, "multiturn: answer length")
	f.DurationVar(&c.MultiTurn.Think, "mt-think", c.MultiTurn.Think, "multiturn: pause between an answer and the next question")
	f.Float64Var(&c.MultiTurn.ChatRate, "mt-chat-rate", c.MultiTurn.ChatRate, "multiturn: conversations started per second (0 = all at once)")
	return cmd
}

// repoRoot finds the repository root (the directory holding go.mod) from
// the working directory upwards; it falls back to the working directory.
func repoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/cartrouter/cart") {
			return d
		}
		if filepath.Dir(d) == d {
			return wd
		}
	}
}

func newSuiteCmd() *cobra.Command {
	root := repoRoot()
	c := bench.DefaultSuiteConfig(root)
	var traces, scenarios string
	cmd := &cobra.Command{
		Use:   "suite",
		Short: "Run every scenario (nginx, CART all-in-one, distributed, split) on one trace slice and pool",
		Long: `Runs the same trace slice against each router scenario in turn, resetting the
simulated replicas between scenarios, and writes results.json, summary.md,
machine.md and PNG charts to bench/results/<date>/.

BENCH_FULL=1 replays whole traces (hours). nginx and haproxy come from Debian:
apt-get install -y nginx haproxy`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if traces != "" {
				c.Traces = splitList(traces)
			}
			if scenarios != "" {
				c.Scenarios = splitList(scenarios)
			}
			if os.Getenv("BENCH_FULL") == "1" {
				c.Full = true
			}
			if c.OutDir == "" {
				c.OutDir = filepath.Join(root, "bench", "results", time.Now().Format("2006-01-02"))
			}
			if !c.SkipOverhead {
				if err := c.Overhead.Validate(); err != nil {
					return err
				}
			}
			if !c.SkipControlPlane {
				if err := c.CP.Validate(); err != nil {
					return err
				}
			} else if err := c.CP.ValidateNodeProcs(); err != nil {
				return err
			}
			if !c.SkipFailover {
				if err := c.Failover.Validate(); err != nil {
					return err
				}
			}
			return bench.RunSuite(cmd.Context(), c, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.BinDir, "bin", c.BinDir, "directory holding cart and cart-sim")
	f.StringVar(&c.TraceDir, "traces-dir", c.TraceDir, "directory of the trace files")
	f.StringVar(&traces, "traces", strings.Join(c.Traces, ","), "trace files (names in --traces-dir) to replay; add llmd_shared_prefix_73pct_blk512 for the llm-d workload")
	f.StringVar(&scenarios, "scenarios", strings.Join(c.Scenarios, ","), "scenarios to run: "+strings.Join(bench.AllScenarios, ",")+
		" (and the endpoint picker's: "+bench.ScenarioEPP+", "+bench.ScenarioEPPDistPrefix+"N)")
	f.StringVar(&c.OutDir, "out", "", "output directory (default bench/results/<date>)")
	f.IntVar(&c.Limit, "limit", 0, "requests per trace slice, for every trace (0 = each trace's default; ignored with BENCH_FULL=1)")
	f.IntVar(&c.Start, "start", c.Start, "first trace record of the slice")
	f.Float64Var(&c.Speedup, "speedup", 0, "trace time speed-up, for every trace (0 = each trace's default)")
	f.Float64Var(&c.ZeroTimeRate, "burst-rate", 0, "Poisson arrival rate (req/s) for traces whose requests all arrive at t=0 (0 = each trace's default)")
	f.IntVar(&c.CacheTokens, "cache-tokens", -1, "cache capacity of each replica in tokens, for every trace (0 = unbounded; -1 = each trace's default)")
	f.IntVar(&c.MaxTokensCap, "max-tokens-cap", c.MaxTokensCap, "cap on max_tokens")
	f.IntVar(&c.Replicas, "replicas", c.Replicas, "simulated replicas in the pool")
	f.Float64Var(&c.Sim.PrefillUsPerToken, "prefill-us-per-token", c.Sim.PrefillUsPerToken, "replica prefill cost")
	f.Float64Var(&c.Sim.DecodeMsPerToken, "decode-ms-per-token", c.Sim.DecodeMsPerToken, "replica decode cost")
	f.IntVar(&c.Sim.MaxConcurrency, "max-concurrency", c.Sim.MaxConcurrency, "replica prefill slots")
	f.Float64Var(&c.Sim.TimeScale, "time-scale", c.Sim.TimeScale, "replica time scale")
	f.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "load generator safety cap on requests in flight")
	f.DurationVar(&c.RunTimeout, "run-timeout", c.RunTimeout, "timeout of one scenario's run")
	f.DurationVar(&c.StartTimeout, "start-timeout", c.StartTimeout, "time a role gets to become ready before its scenario is skipped")
	f.BoolVar(&c.RecordRequests, "records", false, "keep per-request records in each scenario's JSON")
	f.BoolVar(&c.SkipOverhead, "no-overhead", false, "skip the proxy-overhead benchmark")
	f.DurationVar(&c.Overhead.Duration, "overhead-duration", c.Overhead.Duration, "proxy-overhead: duration per target")
	f.IntVar(&c.Overhead.Concurrency, "overhead-concurrency", c.Overhead.Concurrency, "proxy-overhead: closed-loop concurrency")
	f.IntVar(&c.Overhead.Rounds, "overhead-rounds", c.Overhead.Rounds, "proxy-overhead: nginx/CART rounds, alternating; the ratio is their median")
	f.BoolVar(&c.SkipControlPlane, "no-controlplane", false, "skip the control-plane benchmark (cp-* flags; --cp-node-procs still applies to the distributed scenarios' nodes)")
	addCPFlags(f, &c.CP, "cp-")
	f.BoolVar(&c.SkipFailover, "no-failover", false, "skip the leader-kill failover benchmark (failover-* flags)")
	addFailoverFlags(f, &c.Failover, "failover-")
	return cmd
}

func newOverheadCmd() *cobra.Command {
	cmd, c := overheadCmd("overhead", "Proxy overhead: requests/s and latency of CART all-in-one vs nginx in front of one fast replica",
		func(ctx context.Context, env *bench.Env, o bench.OverheadConfig) (string, any) {
			res := bench.RunOverhead(ctx, env, o)
			return bench.FormatOverhead(res), res
		})
	f := cmd.Flags()
	f.BoolVar(&c.Overhead.UseWrk, "wrk", false, "drive the load with wrk when it is installed")
	f.IntVar(&c.Overhead.Rounds, "rounds", c.Overhead.Rounds, "nginx/CART rounds, alternating; the ratio is their median")
	return cmd
}

func newEPPOverheadCmd() *cobra.Command {
	cmd, c := overheadCmd("epp-overhead",
		"Endpoint-picker overhead: latency and CART CPU per request of the proxy path vs the ext_proc path (cart epp behind a gateway)",
		func(ctx context.Context, env *bench.Env, o bench.OverheadConfig) (string, any) {
			res := bench.RunEPPOverhead(ctx, env, o)
			return bench.FormatEPPOverhead(res), res
		})
	f := cmd.Flags()
	f.IntVar(&c.Overhead.Rounds, "rounds", c.Overhead.Rounds, "rounds over the four targets, in turn")
	f.IntVar(&c.Overhead.PromptChars, "prompt-chars", c.Overhead.PromptChars, "characters of the fixed prompt")
	return cmd
}

// overheadCmd is a closed-loop overhead benchmark's command: its flags
// shared by both, run printing a table and writing the JSON with -o.
func overheadCmd(use, short string, run func(context.Context, *bench.Env, bench.OverheadConfig) (string, any)) (*cobra.Command, *bench.SuiteConfig) {
	root := repoRoot()
	c := bench.DefaultSuiteConfig(root)
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Overhead.Validate(); err != nil {
				return err
			}
			env, err := bench.NewEnv(c, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer env.Close()
			table, res := run(cmd.Context(), env, c.Overhead)
			fmt.Fprint(cmd.OutOrStdout(), table)
			if out != "" {
				return bench.WriteJSON(out, res)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.BinDir, "bin", c.BinDir, "directory holding cart and cart-sim")
	f.DurationVar(&c.Overhead.Duration, "duration", c.Overhead.Duration, "duration per target")
	f.IntVar(&c.Overhead.Concurrency, "concurrency", c.Overhead.Concurrency, "closed-loop concurrency")
	f.StringVarP(&out, "out", "o", "", "write the JSON result here")
	return cmd, &c
}

func newAlternateCmd() *cobra.Command {
	c := bench.AlternateConfig{Runs: 3, Nice: -15}
	var variants []string
	var summaryOnly bool
	cmd := &cobra.Command{
		Use:   "alternate --variant NAME=BINDIR[ ARGS] ... --out DIR -- overhead|cp|failover [ARGS]",
		Short: "Compare builds or settings: run one benchmark for each in turn, --runs rounds, and summarize the medians",
		Long: `alternate runs a cart-bench subcommand once per variant in turn, for --runs
rounds, so that the load of a shared machine falls on every variant alike.
Each variant is a directory holding cart and cart-sim (and cart-bench, used
in place of this one when present), plus arguments for that variant alone:
  cart-bench alternate --out bench/results/2026-12-07-x \
    --variant base=/tmp/base-bin --variant new=$PWD/bin -- overhead --duration 10s
  cart-bench alternate --out DIR --variant "p1=$PWD/bin --node-procs 1" \
    --variant "p2=$PWD/bin --node-procs 2" -- cp --rates 2000,5000 --concurrency 32
Results: DIR/<variant>-<round>.json and .txt; the medians go to stdout and
DIR/summary.md.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c.Command = args
			for _, v := range variants {
				av, err := bench.ParseVariant(v)
				if err != nil {
					return err
				}
				c.Variants = append(c.Variants, av)
			}
			if c.Out == "" {
				return fmt.Errorf("--out names the results directory (also with --summary-only)")
			}
			names := make([]string, len(c.Variants))
			for i, v := range c.Variants {
				names[i] = v.Name
			}
			if !summaryOnly {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				if err := bench.RunAlternate(cmd.Context(), c, self, cmd.ErrOrStderr()); err != nil {
					return err
				}
			} else if len(names) == 0 {
				names = nil
			}
			sum, err := bench.SummarizeAlternate(c.Out, names)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), sum)
			return os.WriteFile(filepath.Join(c.Out, "summary.md"), []byte(sum), 0o644)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&variants, "variant", nil, "NAME=BINDIR[ ARGS...]: one side of the comparison (repeat)")
	f.IntVar(&c.Runs, "runs", c.Runs, "rounds")
	f.StringVarP(&c.Out, "out", "o", "", "directory for the results and summary.md")
	f.IntVar(&c.Nice, "nice", c.Nice, "scheduling priority of the runs (-20..19; below 0 needs root)")
	f.BoolVar(&summaryOnly, "summary-only", false, "run nothing: summarize the results already in --out")
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newOracleCmd() *cobra.Command {
	c := bench.DefaultRunConfig()
	cmd := &cobra.Command{
		Use:   "oracle",
		Short: "Print the oracle hit ratio of a trace slice for a pool capacity, without sending anything",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w, err := bench.BuildWorkload(c)
			if err != nil {
				return err
			}
			if len(w.Chats) > 0 {
				return fmt.Errorf("the multiturn workload depends on the answers: run it to get its oracle")
			}
			o := bench.NewOracle(c.PoolCacheTokens, c.BlockTokens)
			for i := range w.Requests {
				o.AccessMessages(w.Requests[i].Prompt())
			}
			span := 0.0
			if n := len(w.Requests); n > 0 {
				span = w.Requests[n-1].At.Seconds()
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d requests over %.1fs, oracle hit ratio %.2f%% (pool %d tokens, %d blocks held at the end)\n",
				w.Name, len(w.Requests), span, 100*o.HitRatio(), c.PoolCacheTokens, o.Len())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Workload, "workload", c.Workload, "trace or gsp")
	f.StringVar(&c.TracePath, "trace", "", "Mooncake-format JSONL trace")
	f.IntVar(&c.Start, "start", 0, "skip this many trace records")
	f.IntVar(&c.Limit, "limit", 0, "at most this many requests (0 = all)")
	f.IntVar(&c.PoolCacheTokens, "pool-cache-tokens", 0, "total cache capacity of the pool in tokens (0 = unbounded)")
	f.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "cache block size in tokens")
	return cmd
}

// sectionCmd is a subcommand that runs one suite section on its own:
// validate, start an environment, run, print, optionally write the JSON.
// run returns the result, its text and why it did not run ("" if it did).
func sectionCmd(use, short, long string, c *bench.SuiteConfig, validate func() error,
	run func(context.Context, *bench.Env) (res any, text, skipped string)) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validate(); err != nil {
				return err
			}
			env, err := bench.NewEnv(*c, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer env.Close()
			res, text, skipped := run(cmd.Context(), env)
			fmt.Fprint(cmd.OutOrStdout(), text)
			if out != "" {
				if err := bench.WriteJSON(out, res); err != nil {
					return err
				}
			}
			if skipped != "" {
				return fmt.Errorf("%s did not run: %s", use, skipped)
			}
			return cmd.Context().Err()
		},
	}
	cmd.Flags().StringVar(&c.BinDir, "bin", c.BinDir, "directory holding cart")
	cmd.Flags().StringVarP(&out, "out", "o", "", "write the JSON result here")
	return cmd
}

func newCPCmd() *cobra.Command {
	c := bench.DefaultSuiteConfig(repoRoot())
	cmd := sectionCmd("cp", "Control plane: Route load on a three-node cluster through in-process data planes",
		`Starts three `+"`cart controlplane`"+` processes and drives Route (and Complete) through
the data plane's own control-plane client: open loop at each --rates, closed
loop at each --concurrency. Reports routes/s, latency, the leader's decide
and lock-hold p99, CPU per route per node, fallbacks and leader step-downs.`,
		&c, func() error { return c.CP.Validate() }, func(ctx context.Context, env *bench.Env) (any, string, string) {
			res := bench.RunCP(ctx, env, c.CP)
			return res, bench.FormatCP(res), res.Skipped
		})
	addCPFlags(cmd.Flags(), &c.CP, "")
	return cmd
}

// addCPFlags registers the control-plane benchmark's settings, with prefix
// before each name (the suite's copies are "cp-...").
func addCPFlags(f *pflag.FlagSet, c *bench.CPConfig, prefix string) {
	f.IntSliceVar(&c.Rates, prefix+"rates", c.Rates, "open-loop runs, routes/s each")
	f.IntSliceVar(&c.Concurrency, prefix+"concurrency", c.Concurrency, "closed-loop runs, concurrent callers each")
	f.DurationVar(&c.Duration, prefix+"duration", c.Duration, "duration of each run")
	addDataPlaneFlags(f, prefix, &c.DataPlanes, "data planes (each its own connection to the leader)", &c.RouteTimeout, &c.Unary, &c.NoPlacementFeed)
	f.IntVar(&c.BlockChars, prefix+"block-chars", c.BlockChars, "cache.block_chars of the control-plane nodes and the data planes (0 = the config default)")
	f.IntVar(&c.PlacementBatchMs, prefix+"placement-batch-ms", c.PlacementBatchMs, "controlplane.placement_batch_ms of the control-plane nodes (0 = the config default)")
	addNodeProcsFlag(f, prefix, &c.NodeProcs)
	f.DurationVar(&c.Warmup, prefix+"warmup", c.Warmup, "load at the highest rate before the first measured run, so that the runs see the index full (0 = none: the first runs see it fill)")
}

// addNodeProcsFlag registers the control-plane nodes' GOMAXPROCS, shared
// by the cp and failover benchmarks.
func addNodeProcsFlag(f *pflag.FlagSet, prefix string, procs *int) {
	f.IntVar(procs, prefix+"node-procs", *procs, "GOMAXPROCS of each control-plane node, as the Helm chart sets it from the node's CPU request (0 = Go's default: every CPU)")
}

// addDataPlaneFlags registers the data-plane settings the cp and failover
// benchmarks share, so that their names and meaning stay the same in both.
func addDataPlaneFlags(f *pflag.FlagSet, prefix string, dataPlanes *int, dataPlanesHelp string, routeTimeout *time.Duration, unary, noFeed *bool) {
	f.IntVar(dataPlanes, prefix+"dataplanes", *dataPlanes, dataPlanesHelp)
	f.DurationVar(routeTimeout, prefix+"route-timeout", *routeTimeout, "data planes' Route deadline (0 = the config default, as in production)")
	f.BoolVar(unary, prefix+"unary", *unary, "data planes make one call per Route instead of using the stream (dataplane.route_stream: false)")
	f.BoolVar(noFeed, prefix+"no-placement-feed", *noFeed, "data planes do not ask the leader for its placement feed (dataplane.route_stream_placement_feed: false)")
}

func newFailoverCmd() *cobra.Command {
	c := bench.DefaultSuiteConfig(repoRoot())
	cmd := sectionCmd("failover", "Leader kill under load: hit ratio of the window containing the kill vs steady state",
		`Starts three `+"`cart controlplane`"+` processes and data planes (the data plane's own
router, shadow index and breaker on) routing a prefix-group workload whose
workers' caches are modelled as LRUs; measures a steady window, kills the
leader with SIGKILL and measures the window that starts with the kill:
hit ratio against steady state, client errors, fallbacks and their causes,
time to the new leader and to its first answered route.`,
		&c, func() error { return c.Failover.Validate() }, func(ctx context.Context, env *bench.Env) (any, string, string) {
			res := bench.RunFailover(ctx, env, c.Failover)
			return res, bench.FormatFailover(res), res.Skipped
		})
	addFailoverFlags(cmd.Flags(), &c.Failover, "")
	return cmd
}

func addFailoverFlags(f *pflag.FlagSet, c *bench.FailoverConfig, prefix string) {
	f.IntVar(&c.Runs, prefix+"runs", c.Runs, "leader kills, each on a fresh cluster")
	f.DurationVar(&c.Window, prefix+"window", c.Window, "length of the steady window, the kill window and the window after it")
	f.DurationVar(&c.Settle, prefix+"settle", c.Settle, "load before the steady window, so that it starts from equilibrium")
	f.IntVar(&c.Clients, prefix+"clients", c.Clients, "concurrent clients, each keeping two requests open")
	f.IntVar(&c.Groups, prefix+"groups", c.Groups, "prefix groups the requests share")
	f.IntVar(&c.CacheGroups, prefix+"cache-groups", c.CacheGroups, "groups each worker's modelled cache holds")
	addDataPlaneFlags(f, prefix, &c.DataPlanes, "data planes", &c.RouteTimeout, &c.Unary, &c.NoPlacementFeed)
	addNodeProcsFlag(f, prefix, &c.NodeProcs)
}

func newOverloadCmd() *cobra.Command {
	c := bench.DefaultOverload()
	out := filepath.Join(repoRoot(), "bench", "results", time.Now().UTC().Format("2006-01-02")+"-overload")
	cmd := &cobra.Command{
		Use:   "overload",
		Short: "A calm tenant under a flood: TTFT, fairness, priority and shedding through nginx and CART",
		Long: `Starts cart-sim replicas with a batch limit and a waiting queue (--max-num-seqs),
and for each scenario and target measures a calm tenant's streamed chats alone
and under a flood: its TTFT p50/p90/p99 and their ratio, errors, the flood's
throughput, tokens/s served, the hit ratio and, with two flooding tenants,
their shares of the tokens. Scenarios: flood (equal priority), priority (the
calm tenant at priority 5 with headroom and the engines' priority scheduling),
two-floods (two flooding tenants of different concurrency, through different
data planes in distributed mode), shed (a sheddable flood).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := bench.RunOverload(cmd.Context(), repoRoot(), out, c, cmd.ErrOrStderr())
			if res != nil {
				fmt.Fprint(cmd.OutOrStdout(), bench.FormatOverload(res))
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", out, "results directory (results.json, summary.md, logs/)")
	f.IntVar(&c.Replicas, "replicas", c.Replicas, "cart-sim replicas")
	f.IntVar(&c.Seqs, "seqs", c.Seqs, "each replica's batch limit (--max-num-seqs)")
	f.IntVar(&c.OutputTokens, "output-tokens", c.OutputTokens, "output tokens per request (the mean)")
	f.Float64Var(&c.OutputSpread, "output-spread", c.OutputSpread, "output lengths spread uniformly over ±this fraction of --output-tokens (0: all equal)")
	f.Float64Var(&c.DecodeMsPerToken, "decode-ms-per-token", c.DecodeMsPerToken, "replica decode time per token")
	f.Float64Var(&c.DecodeSlowdown, "decode-slowdown", c.DecodeSlowdown, "fraction each other running sequence adds to a token's time (cart-sim --decode-slowdown; 0 as llm-d-inference-sim's default; the runs before this flag: 0.05)")
	f.Float64Var(&c.CalmRate, "calm-rate", c.CalmRate, "calm tenant's requests per second")
	f.IntVar(&c.FloodConcurrency, "flood", c.FloodConcurrency, "flooding tenant's requests in flight")
	f.IntVar(&c.ReserveSlots, "reserve-slots", c.ReserveSlots, "flow.reserve_slots (slots per worker kept for the calm tenant's priority) in the priority and shed scenarios")
	f.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the tenants' arrivals, output lengths and questions (another seed samples other bursts)")
	f.DurationVar(&c.Measure, "measure", c.Measure, "each measured window")
	f.DurationVar(&c.Warmup, "warmup", c.Warmup, "the flood's head start before its window")
	f.StringSliceVar(&c.Scenarios, "scenarios", c.Scenarios, "scenarios: "+strings.Join(bench.OverloadScenarios, ", "))
	f.StringSliceVar(&c.Targets, "targets", c.Targets, "targets: "+strings.Join(bench.OverloadTargets, ", "))
	return cmd
}

func newOverloadPoolCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "overload-pool DIR...",
		Short: "The calm tenant's TTFT p99s over several overload result directories at once",
		Long: `Reads the calm tenant's TTFTs that each window of cart-bench overload writes
(ttft__<scenario>__<target>.csv in its --out directory) and, per scenario and
target, takes the percentiles over all the windows' requests together: the
p99 alone, the p50/p90/p99 under the flood and their ratio, beside each
window's own ratio. A 120 s window holds ~240 calm requests, whose p99 is
about its third-largest TTFT; several seeds pooled estimate the same p99
from many more. From each window's requests__<scenario>__<target>.csv.gz it
also takes the calm-first floor: the p99 of each calm request's wait for the
first end no earlier calm request took, plus the calm TTFT p50 alone, which
no scheduler that neither preempts nor idles a slot beats at equal priority
(in the priority and shed scenarios the calm tenant waits for no end, and
the column means nothing there).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, dirs []string) error {
			ws, err := bench.ReadTTFTWindows(dirs)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), bench.FormatPooledTTFT(bench.PoolTTFT(ws)))
			return nil
		},
	}
}

func newPDCmd() *cobra.Command {
	c := bench.DefaultPD()
	out := filepath.Join(repoRoot(), "bench", "results", time.Now().UTC().Format("2006-01-02")+"-pd")
	cmd := &cobra.Command{
		Use:   "pd [flags]", // not the bare word: that is reason "pd" (engine.ReasonPD)
		Short: "Prefill/decode: four cart-sims split (2 prefill + 2 decode) or whole, behind CART, on the shared traces",
		Long: `Replays the suite's slices of the shared traces through three set-ups of
the same four cart-sim replicas: cart-pd (two prefill, two decode: CART picks
the prefill worker by prefix, the decode worker by load, and runs vLLM's
two-step protocol), blind-pd (the same split pool, prefix matching off: the
prefill worker picked blind, as a round-robin proxy would) and cart-agg (the
four replicas whole). Reports the hit ratio where prompts are computed (the
prefill replicas, or all four), the client's TTFT p50/p99, errors and CART's
per-leg latencies.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := bench.RunPD(cmd.Context(), repoRoot(), out, c, cmd.ErrOrStderr())
			if res != nil {
				fmt.Fprint(cmd.OutOrStdout(), bench.FormatPD(res))
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", out, "results directory (results.json, summary.md, logs/)")
	f.StringSliceVar(&c.Traces, "traces", c.Traces, "traces under ../shared/traces")
	f.StringSliceVar(&c.Targets, "targets", c.Targets, "targets: "+strings.Join(bench.PDTargets, ", "))
	f.Float64Var(&c.KVTransferUsPerToken, "kv-transfer-us-per-token", c.KVTransferUsPerToken, "decode replicas' KV pull time per token")
	f.IntVar(&c.Prefill, "prefill", c.Prefill, "prefill replicas of the split pool")
	f.IntVar(&c.Decode, "decode", c.Decode, "decode replicas of the split pool (the whole pool has prefill + decode replicas)")
	return cmd
}
