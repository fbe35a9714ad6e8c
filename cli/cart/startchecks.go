package main

import (
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/discovery"
	"github.com/cartrouter/cart/controlplane/raftnode"
	"github.com/cartrouter/cart/dataplane/fdlimit"
	"github.com/cartrouter/cart/dataplane/server"
	"github.com/cartrouter/cart/internal/tracing"
)

// startChecks are the refusals of a role's start that Validate cannot
// make, because they read the machine (the open-files limit, what
// server.host resolves to, certificate, kubeconfig and data-dir files):
// every error a role's start returns before it serves, other than binding
// its listeners. The start runs them first and --config-check runs them
// too, so the check refuses what the start refuses. Left out: binding the
// ports and the data dir's lock, which a node running with the same config
// holds while its config is checked, and the listeners' own checks repeat
// at bind time (the exposure check on the address actually bound).
func startChecks(role config.Role) func(*config.Config) config.Problems {
	return func(cfg *config.Config) config.Problems {
		var ps config.Problems
		add := func(key string, err error) {
			if err != nil {
				ps = append(ps, cfg.At(key, err))
			}
		}
		if role != config.RoleControlPlane { // the proxy roles
			add("server.min_open_files", fdlimit.Check(uint64(cfg.Server.MinOpenFiles)))
			add("server.host", server.CheckExposureHost(cfg))
		}
		if cfg.Server.TLS.Enabled() { // the client listener, or the control-plane API
			_, err := cfg.Server.TLS.ServerConfig()
			add("server.tls", err)
		}
		if role != config.RoleAllInOne { // data planes dial the control plane; nodes forward and join
			_, err := cfg.DataPlane.ClientTLS.Config()
			add("dataplane.tls", err)
		}
		add("tracing", tracing.Check(cfg.Tracing))
		if role != config.RoleDataPlane { // who discovers
			_, err := discovery.Watchers(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)),
				discovery.NewMetrics(prometheus.NewRegistry()), func(string) discovery.Sink { return nil })
			add("discovery", err)
		}
		if role == config.RoleControlPlane {
			if t := cfg.ControlPlane.RaftTLS; t.Enabled() {
				_, err := t.ServerConfig()
				add("controlplane.raft_tls", err)
			}
			add("controlplane.data_dir", raftnode.CheckDataDir(cfg.ControlPlane.DataDir, cfg.ControlPlane.LogStore))
		}
		return ps
	}
}
