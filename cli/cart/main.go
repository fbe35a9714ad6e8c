// Command cart is the CART router: the all-in-one mode by default, and the
// control-plane and data-plane roles as subcommands.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"

	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/cli/internal/buildinfo"
	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/dataplane/fdlimit"
	"github.com/cartrouter/cart/dataplane/server"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "cart:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := configured(&cobra.Command{
		Use:   "cart -c config.yaml [-c overlay.yaml ...]",
		Short: "CART: cache-aware router for LLM inference pools (all-in-one mode)",
		Long: "cart runs the all-in-one router: one process that routes OpenAI/Anthropic-style\n" +
			"requests across inference replicas by prefix-cache affinity.\n\n" +
			"Config files (-c, repeatable) merge in order; the last one wins.",
		Version:       buildinfo.String("cart"),
		SilenceUsage:  true,
		SilenceErrors: true,
	}, config.RoleAllInOne, runAllInOne, startChecks(config.RoleAllInOne))
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(newControlPlaneCmd(), newDataPlaneCmd(), newEPPCmd())
	return root
}

// loadConfig loads and validates. When the files themselves have problems
// it still validates what could be read, so one run lists every problem.
func loadConfig(paths []string, role config.Role) (*config.Config, error) {
	cfg, err := config.Load(paths...)
	if err != nil {
		if cfg != nil {
			var loadPs, valPs *config.Problems
			if errors.As(err, &loadPs) && errors.As(cfg.Validate(role), &valPs) {
				all := append(append(config.Problems{}, *loadPs...), *valPs...)
				return nil, &all
			}
		}
		return nil, err
	}
	if err := cfg.Validate(role); err != nil {
		return nil, err
	}
	return cfg, nil
}

// reportCheck prints the effective config (exit 0) or every problem found
// (non-zero exit).
func reportCheck(cmd *cobra.Command, cfg *config.Config, err error) error {
	if err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "config check failed:")
		fmt.Fprintln(cmd.ErrOrStderr(), err)
		return errors.New("invalid configuration")
	}
	out, err := cfg.YAML()
	if err != nil {
		return fmt.Errorf("render effective config: %w", err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), "# config OK; effective configuration:")
	_, _ = cmd.OutOrStdout().Write(out)
	return nil
}

func runAllInOne(ctx context.Context, cfg *config.Config, paths []string, log *slog.Logger) error {
	n, err := fdlimit.Ensure(uint64(cfg.Server.MinOpenFiles))
	if err != nil {
		return err
	}
	log.Debug("open-files limit", "soft", n)
	a, err := server.NewAllInOne(cfg, paths, log, rand.Uint64())
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", a.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	onHUP(ctx, func() {
		if err := a.Reload(); err != nil {
			log.Error("SIGHUP reload", "error", err.Error())
		}
	})
	return a.Run(ctx, ln)
}
