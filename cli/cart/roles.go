package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/cli/internal/logging"
	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/daemon"
	"github.com/cartrouter/cart/dataplane/fdlimit"
	"github.com/cartrouter/cart/dataplane/server"
)

func newControlPlaneCmd() *cobra.Command {
	var paths []string
	var check bool
	cmd := &cobra.Command{
		Use:   "controlplane -c config.yaml",
		Short: "Run one control-plane node (Raft member serving Route and the admin API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(paths) == 0 {
				return errors.New("no config file: pass -c config.yaml")
			}
			cfg, err := loadConfig(paths, config.RoleControlPlane)
			if check {
				return reportCheck(cmd, cfg, err)
			}
			if err != nil {
				return err
			}
			logw := logging.NewBuffered(os.Stderr, 100*time.Millisecond)
			defer logw.Close()
			log := logging.New(logw, cfg.Log.Level, cfg.Log.Format)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ignoreHUP(ctx, log, "the control plane's worker set changes through cartctl (AdminService), not config reloads")
			d, err := daemon.Start(ctx, cfg, log)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", cfg.ControlPlane.APIAddr)
			if err != nil {
				_ = d.Node.Shutdown()
				return fmt.Errorf("listen %s: %w", cfg.ControlPlane.APIAddr, err)
			}
			return d.Serve(ctx, ln)
		},
	}
	cmd.Flags().StringArrayVarP(&paths, "config", "c", nil, "config file (repeatable)")
	cmd.Flags().BoolVar(&check, "config-check", false, "validate the merged config, print it and exit")
	return cmd
}

func newDataPlaneCmd() *cobra.Command {
	var paths []string
	var check bool
	cmd := &cobra.Command{
		Use:   "dataplane -c config.yaml",
		Short: "Run a stateless data plane that asks the control plane where to route",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(paths) == 0 {
				return errors.New("no config file: pass -c config.yaml")
			}
			cfg, err := loadConfig(paths, config.RoleDataPlane)
			if check {
				return reportCheck(cmd, cfg, err)
			}
			if err != nil {
				return err
			}
			return runDataPlane(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringArrayVarP(&paths, "config", "c", nil, "config file (repeatable)")
	cmd.Flags().BoolVar(&check, "config-check", false, "validate the merged config, print it and exit")
	return cmd
}

func runDataPlane(ctx context.Context, cfg *config.Config) error {
	logw := logging.NewBuffered(os.Stderr, 100*time.Millisecond)
	defer logw.Close()
	log := logging.New(logw, cfg.Log.Level, cfg.Log.Format)
	if _, err := fdlimit.Ensure(uint64(cfg.Server.MinOpenFiles)); err != nil {
		return err
	}
	client, err := cpclient.New(cfg.DataPlane.ClientTLS)
	if err != nil {
		return err
	}
	d, err := server.NewDataPlane(cfg, log, client)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ignoreHUP(ctx, log, "a data plane learns its worker set from the control plane")
	return d.Run(ctx, ln)
}

// ignoreHUP keeps SIGHUP (sent by reload tooling to every unit) from
// killing a role that has nothing to reload, and says why.
func ignoreHUP(ctx context.Context, log *slog.Logger, why string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				log.Warn("SIGHUP ignored: nothing to reload in this role", "why", why)
			}
		}
	}()
}
