package discovery

import (
	"fmt"
	"log/slog"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/state"
)

// DNSResolverFrom builds the DNS discovery resolver from discovery.dns.*.
func DNSResolverFrom(cfg *config.Config) (*DNSResolver, error) {
	d := cfg.Discovery.DNS
	return NewDNSResolver(DNSOptions{Name: d.Name, SRV: d.RecordType == "SRV", Port: d.Port,
		Scheme: d.Scheme, Server: d.Resolver, Timeout: config.Seconds(d.TimeoutSecs)})
}

// RulesFrom translates discovery.* into the reconciler's rules.
func RulesFrom(cfg *config.Config) Options {
	d := cfg.Discovery
	return Options{AddAfter: d.DNS.AddAfter, RemoveAfter: d.DNS.RemoveAfter, DrainTimeout: config.Seconds(d.DrainTimeoutSecs),
		MinInterval: config.Seconds(d.DNS.MinIntervalSecs), MaxInterval: config.Seconds(d.DNS.MaxIntervalSecs)}
}

// Watchers builds a watcher for every enabled worker source (the metrics
// are shared: they are labelled by source). The all-in-one data plane and
// the control-plane leader both run them. own are the host:port addresses
// the process listens on: a discovered endpoint naming one is refused, as
// are those discovery.allowed_networks refuses (see AddressPolicy).
func Watchers(cfg *config.Config, log *slog.Logger, m *Metrics, sink func(source string) Sink, own ...string) ([]*Watcher, error) {
	allowed, err := config.ParseNetworks(cfg.Discovery.AllowedNetworks)
	if err != nil {
		return nil, fmt.Errorf("discovery.allowed_networks: %w", err)
	}
	policy := &AddressPolicy{Allowed: allowed, Own: OwnListeners(own...)}
	var out []*Watcher
	if cfg.Discovery.DNS.Enabled() {
		res, err := DNSSourceFrom(cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, NewWatcher(WatchOptions{
			Source: state.SourceDNS, Resolver: res, Sink: sink(state.SourceDNS), Rules: RulesFrom(cfg),
			Metrics: m, Logger: log, Policy: policy,
		}))
	}
	if cfg.Discovery.Kubernetes.Enabled {
		k := cfg.Discovery.Kubernetes
		src, err := NewKubernetesSource(KubernetesOptions{Service: k.Service, Selector: k.Selector, InferencePool: k.InferencePool, RoleLabel: k.RoleLabel,
			Namespace: k.Namespace, Port: k.Port, Scheme: k.Scheme, Kubeconfig: k.Kubeconfig,
			SyncTimeout: config.Seconds(k.SyncTimeoutSecs), Logger: log})
		if err != nil {
			return nil, err
		}
		log.Info("kubernetes discovery configured", "watch", src.Describe())
		out = append(out, NewWatcher(WatchOptions{
			Source: state.SourceKubernetes, Resolver: src, Sink: sink(state.SourceKubernetes),
			Rules: Options{AddAfter: k.AddAfter, RemoveAfter: k.RemoveAfter, DrainTimeout: config.Seconds(cfg.Discovery.DrainTimeoutSecs),
				MinInterval: config.Seconds(k.MinIntervalSecs), MaxInterval: config.Seconds(k.MaxIntervalSecs)},
			Metrics: m, Logger: log, Policy: policy,
		}))
	}
	return out, nil
}

// Defaults are the settings of a worker that source discovered:
// max_load, load_penalty, cache_capacity_tokens.
func Defaults(cfg *config.Config, source string) (maxLoad, loadPenalty int, capacityTokens int64) {
	if source == state.SourceKubernetes {
		k := cfg.Discovery.Kubernetes
		return k.MaxLoad, k.LoadPenalty, k.CacheCapacityTokens
	}
	d := cfg.Discovery.DNS
	return d.MaxLoad, d.LoadPenalty, d.CacheCapacityTokens
}
