package main

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/config"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
	"github.com/cartrouter/cart/gen/cart/v1/cartv1connect"
)

// withExitCodes appends the exit code table to a command's long help, so
// it is in front of whoever scripts that one command.
func withExitCodes(long string) string {
	return long + "\n\n" + exitCodesHelp
}

func (a *app) workersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workers",
		Short: "List and manage the inference workers the control plane routes to",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRunE,
	}
	cmd.AddCommand(a.workersListCmd(), a.workersAddCmd(), a.workersUpdateCmd(), a.workersRemoveCmd())
	return cmd
}

func (a *app) workersListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List workers with health and load",
		Long: withExitCodes(`List the worker set with the leader's live view of health and load.

MAX_LOAD "unlimited" means no in-flight cap; CAPACITY is the modelled KV
cache size in tokens, "default" meaning the pool-wide cache capacity.
SOURCE is where the worker came from: static (config seed), admin (cartctl),
dns or kubernetes (discovery, which never touches the others); "(draining)"
marks a discovered worker that left its source and finishes its in-flight
requests.
With -o json the output is the ListWorkersResponse message.`),
		Args: checkArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := listWorkers(ctx, s.cp)
				if err != nil {
					return err
				}
				if s.output == outputJSON {
					return writeJSON(s.out, resp)
				}
				return writeWorkersTable(s.out, resp)
			})
		},
	}
}

func listWorkers(ctx context.Context, cp *controlPlane) (*cartv1.ListWorkersResponse, error) {
	return adminCall(ctx, cp, cartv1connect.AdminServiceClient.ListWorkers, &cartv1.ListWorkersRequest{})
}

// workerFlags are the tunables of one worker.
type workerFlags struct {
	maxLoad     uint32
	maxConc     uint32
	loadPenalty uint32
	capacity    int64
	role        string
}

const (
	flagMaxLoad     = "max-load"
	flagMaxConc     = "max-concurrency"
	flagLoadPenalty = "load-penalty"
	flagCapacity    = "cache-capacity-tokens"
	flagRole        = "role"
)

func (f *workerFlags) register(cmd *cobra.Command) {
	cmd.Flags().Uint32Var(&f.maxLoad, flagMaxLoad, 0, "in-flight request cap (0 = unlimited)")
	cmd.Flags().Uint32Var(&f.maxConc, flagMaxConc, 0, "requests the worker's engine runs at once (vLLM --max-num-seqs); more wait in CART's queue (0 = learn it from the engine's metrics)")
	cmd.Flags().Uint32Var(&f.loadPenalty, flagLoadPenalty, 0, "constant added to the worker's load when balancing (steers traffic away from slower hardware)")
	cmd.Flags().Int64Var(&f.capacity, flagCapacity, 0, "modelled KV cache capacity in tokens (0 = pool default)")
	cmd.Flags().StringVar(&f.role, flagRole, "", "the part of requests the worker serves: both (whole requests, the default), prefill or decode (prefill/decode disaggregation)")
}

// parse checks the worker URL argument and the flags, so that a mistake is
// a usage error before any call is made, and returns the URL in the form
// the control plane stores.
func (f *workerFlags) parse(rawURL string) (string, error) {
	u, err := workerURL(rawURL)
	if err != nil {
		return "", err
	}
	if f.capacity < 0 {
		return "", usagef("--%s must not be negative", flagCapacity)
	}
	if !config.ValidRole(f.role) {
		return "", usagef("--%s must be both, prefill or decode, got %q", flagRole, f.role)
	}
	return u, nil
}

// workerURL validates a worker URL with the control plane's own rule, so a
// typo is a usage error before any call is made, and returns the form the
// control plane stores (which update needs to find the worker).
func workerURL(raw string) (string, error) {
	u, err := config.NormalizeWorkerURL(raw)
	if err != nil {
		return "", usagef("worker URL: %v", err)
	}
	return u, nil
}

func (a *app) workersAddCmd() *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "add URL",
		Short: "Add a worker",
		Long: withExitCodes(`Add a worker to the set. The change is acknowledged once a quorum of the
Raft cluster has committed it; data planes learn it within one sync interval.

Adding a worker that already exists with the same settings succeeds; with
other settings it fails with exit code 4 (use 'cartctl workers update').`),
		Example: "  cartctl workers add http://10.0.0.5:8000 --max-load 32 --load-penalty 2\n  cartctl workers add http://10.0.0.6:8000 --role prefill",
		Args:    checkArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := f.parse(args[0])
			if err != nil {
				return err
			}
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				w := &cartv1.Worker{Url: u, MaxLoad: f.maxLoad, MaxConcurrency: f.maxConc, LoadPenalty: f.loadPenalty, CacheCapacityTokens: f.capacity, Role: f.role}
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.AddWorker, &cartv1.AddWorkerRequest{Worker: w})
				if err != nil {
					return err
				}
				return s.report(resp, "added worker %s: %s", u, workerSummary(resp.GetWorker()))
			})
		},
	}
	f.register(cmd)
	return cmd
}

func (a *app) workersUpdateCmd() *cobra.Command {
	var f workerFlags
	cmd := &cobra.Command{
		Use:   "update URL",
		Short: "Change a worker's settings",
		Long: withExitCodes(`Change a worker's max load, load penalty, cache capacity or role. Only
the flags given change; the others keep their current values.

The API replaces all three settings at once, so cartctl reads the current
ones first. Two operators updating the same worker at the same moment can
therefore overwrite each other's change to a different setting.`),
		Example: "  cartctl workers update http://10.0.0.5:8000 --max-load 64",
		Args:    checkArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := f.parse(args[0])
			if err != nil {
				return err
			}
			fl := cmd.Flags()
			if !fl.Changed(flagMaxLoad) && !fl.Changed(flagMaxConc) && !fl.Changed(flagLoadPenalty) && !fl.Changed(flagCapacity) && !fl.Changed(flagRole) {
				return usagef("nothing to update: give --%s, --%s, --%s, --%s or --%s", flagMaxLoad, flagMaxConc, flagLoadPenalty, flagCapacity, flagRole)
			}
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				list, err := listWorkers(ctx, s.cp)
				if err != nil {
					return err
				}
				var cur *cartv1.Worker
				for _, w := range list.GetWorkers() {
					if w.GetUrl() == u {
						cur = w
						break
					}
				}
				if cur == nil {
					return connect.NewError(connect.CodeNotFound, fmt.Errorf("worker %s not found", u))
				}
				w := &cartv1.Worker{Url: u, MaxLoad: cur.GetMaxLoad(), MaxConcurrency: cur.GetMaxConcurrency(), LoadPenalty: cur.GetLoadPenalty(), CacheCapacityTokens: cur.GetCacheCapacityTokens(), Role: cur.GetRole()}
				if fl.Changed(flagRole) {
					w.Role = f.role
				}
				if fl.Changed(flagMaxLoad) {
					w.MaxLoad = f.maxLoad
				}
				if fl.Changed(flagMaxConc) {
					w.MaxConcurrency = f.maxConc
				}
				if fl.Changed(flagLoadPenalty) {
					w.LoadPenalty = f.loadPenalty
				}
				if fl.Changed(flagCapacity) {
					w.CacheCapacityTokens = f.capacity
				}
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.UpdateWorker, &cartv1.UpdateWorkerRequest{Worker: w})
				if err != nil {
					return err
				}
				return s.report(resp, "updated worker %s: %s", u, workerSummary(resp.GetWorker()))
			})
		},
	}
	f.register(cmd)
	return cmd
}

func (a *app) workersRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove URL",
		Short: "Remove a worker",
		Long: withExitCodes(`Remove a worker from the set. Requests in flight to it finish; no new ones
are routed to it once the removal is committed.`),
		Args: checkArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := workerURL(args[0])
			if err != nil {
				return err
			}
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				resp, err := adminCall(ctx, s.cp, cartv1connect.AdminServiceClient.RemoveWorker, &cartv1.RemoveWorkerRequest{Url: u})
				if err != nil {
					return err
				}
				return s.report(resp, "removed worker %s", u)
			})
		},
	}
}
