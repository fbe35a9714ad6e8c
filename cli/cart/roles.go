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
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/dataplane/fdlimit"
	"github.com/cartrouter/cart/dataplane/server"
)

// roleRun runs one role with its loaded config, a buffered logger and a
// context that ends on SIGINT or SIGTERM.
type roleRun func(ctx context.Context, cfg *config.Config, paths []string, log *slog.Logger) error

// configured gives cmd the -c and --config-check flags every role shares
// and a RunE that loads the config for role, then either reports the check
// or runs run.
func configured(cmd *cobra.Command, role config.Role, run roleRun) *cobra.Command {
	var paths []string
	var check bool
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if len(paths) == 0 {
			return errors.New("no config file: pass -c config.yaml (see config.example.yaml)")
		}
		cfg, err := loadConfig(paths, role)
		if check {
			if err == nil {
				for _, f := range cfg.ExposedSecretFiles() {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s: %s %s\n", f.Key, f.Path, f.Why)
				}
			}
			return reportCheck(cmd, cfg, err)
		}
		if err != nil {
			return err
		}
		logw := logging.NewBuffered(os.Stderr, 100*time.Millisecond)
		defer logw.Close()
		log := logging.New(logw, cfg.Log.Level, cfg.Log.Format)
		warnExposedSecrets(cfg, log)
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return run(ctx, cfg, paths, log)
	}
	cmd.Flags().StringArrayVarP(&paths, "config", "c", nil, "config file (repeatable; later files override earlier ones)")
	cmd.Flags().BoolVar(&check, "config-check", false, "validate the merged config, print the effective config and exit")
	return cmd
}

// warnExposedSecrets logs each secret file that others can read; with
// auth.refuse_insecure_secret_files the config was refused before this.
func warnExposedSecrets(cfg *config.Config, log *slog.Logger) {
	for _, f := range cfg.ExposedSecretFiles() {
		log.Warn("secret file readable beyond this process's user; fix its mode, or set auth.refuse_insecure_secret_files: true to refuse to start",
			"key", f.Key, "file", f.Path, "detail", f.Why)
	}
}

func newControlPlaneCmd() *cobra.Command {
	cmd := configured(&cobra.Command{
		Use:   "controlplane -c config.yaml",
		Short: "Run one control-plane node (Raft member serving Route and the admin API)",
	}, config.RoleControlPlane, runControlPlane)
	cmd.AddCommand(newMigrateLogCmd())
	return cmd
}

func newMigrateLogCmd() *cobra.Command {
	return configured(&cobra.Command{
		Use:   "migrate-log -c config.yaml",
		Short: "Move a stopped node's Raft log from bolt (raft.db) to a WAL, in its data_dir",
		Long: `Copies every entry and the stable store of controlplane.data_dir's raft.db
into a WAL, checks the copy entry by entry, puts it in place and moves raft.db
to raft.db.migrated (delete it once the node runs). The node must be stopped:
the data dir is locked. An interrupted run leaves raft.db in use; run it again.`,
	}, config.RoleControlPlane, runMigrateLog)
}

func runMigrateLog(ctx context.Context, cfg *config.Config, _ []string, log *slog.Logger) error {
	res, err := raftnode.MigrateToWAL(ctx, cfg.ControlPlane.DataDir, log)
	if err != nil {
		return err
	}
	// The result, whatever the log level: this is a one-off command.
	fmt.Printf("moved the raft log in %s to a WAL: %d entries (indexes %d-%d); the bolt log is now %s (delete it once the node runs)\n",
		cfg.ControlPlane.DataDir, res.Entries, res.First, res.Last, res.Backup)
	return nil
}

func newDataPlaneCmd() *cobra.Command {
	return configured(&cobra.Command{
		Use:   "dataplane -c config.yaml",
		Short: "Run a stateless data plane that asks the control plane where to route",
	}, config.RoleDataPlane, runDataPlane)
}

func runControlPlane(ctx context.Context, cfg *config.Config, _ []string, log *slog.Logger) error {
	onHUP(ctx, func() {
		log.Warn("SIGHUP ignored: the control plane's worker set changes through cartctl (AdminService), not config reloads")
	})
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
}

func runDataPlane(ctx context.Context, cfg *config.Config, _ []string, log *slog.Logger) error {
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
	onHUP(ctx, func() {
		log.Warn("SIGHUP ignored: a data plane learns its worker set from the control plane")
	})
	return d.Run(ctx, ln)
}

// onHUP calls fn for every SIGHUP until ctx ends. Every role handles the
// signal (reload tooling sends it to every unit), so none is killed by it.
func onHUP(ctx context.Context, fn func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				fn()
			}
		}
	}()
}
