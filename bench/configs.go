package bench

import (
	"fmt"
	"strings"
)

// NginxConfig returns an nginx.conf proxying 127.0.0.1:listen to the
// upstreams (host:port), round robin or least_conn, with keep-alive HTTP/1.1
// upstream connections and no response buffering (tokens stream through).
// Every path nginx writes to is under prefix.
func NginxConfig(prefix string, listen int, upstreams []string, leastConn bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
worker_rlimit_nofile 8192;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/client_body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 4m;
  keepalive_requests 100000;
  upstream pool {
`, prefix)
	if leastConn {
		b.WriteString("    least_conn;\n")
	}
	for _, u := range upstreams {
		fmt.Fprintf(&b, "    server %s max_fails=0;\n", u)
	}
	fmt.Fprintf(&b, `    keepalive 256;
    keepalive_requests 100000;
  }
  server {
    listen 127.0.0.1:%d;
    location / {
      proxy_pass http://pool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering on;
      proxy_read_timeout 600s;
      proxy_send_timeout 600s;
    }
  }
}
`, listen)
	return b.String()
}

// HAProxyConfig returns a haproxy.cfg balancing TCP connections on
// 127.0.0.1:listen round robin over the backends (host:port).
func HAProxyConfig(listen int, backends []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 8192
defaults
  mode tcp
  timeout connect 2s
  timeout client 10m
  timeout server 10m
frontend fe
  bind 127.0.0.1:%d
  default_backend be
backend be
  balance roundrobin
`, listen)
	for i, u := range backends {
		fmt.Fprintf(&b, "  server b%d %s\n", i+1, u)
	}
	return b.String()
}

// CaddyConfig is a Caddyfile proxying 127.0.0.1:listen to upstream
// (host:port) with Caddy's defaults (keep-alive to the upstream, no access
// log), its admin endpoint and automatic HTTPS off.
func CaddyConfig(listen int, upstream string) string {
	return fmt.Sprintf(`{
	admin off
	auto_https off
}
http://127.0.0.1:%d {
	reverse_proxy %s
}
`, listen, upstream)
}

// CartRouterConfig is what the suite varies in a generated cart config.
type CartRouterConfig struct {
	// Extra is YAML appended to the config as is (sections the rest does
	// not write: auth, flow).
	Extra string
	Port  int
	// MetricsPort, when > 0, moves /metrics to its own listener
	// (server.metrics_addr; an endpoint picker needs one).
	MetricsPort int
	Workers     []string // base URLs
	// CacheTokens is each worker's cache capacity (0 = unbounded).
	CacheTokens int
	// KVEvents and KVReplay are each worker's KV event PUB and replay
	// endpoints (parallel to Workers), used by variants with Events.
	KVEvents, KVReplay []string
	// Variant selects the routing-quality mechanisms (see CartVariants);
	// "" is the default set-up: the replicas' capacity declared.
	Variant string
	// ControlPlane, for a control-plane node.
	NodeID    string
	APIAddr   string
	RaftAddr  string
	DataDir   string
	Bootstrap bool
	Join      []string
	// DataPlane: control-plane API URLs.
	ControlPlanes []string
	DataPlaneID   string
	// BlockChars and BalanceAbs override cache.block_chars and
	// cache.balance_abs_threshold when > 0 (the failover benchmark's
	// short keys and small pool need both smaller).
	BlockChars int
	BalanceAbs int
	// PlacementBatchMs overrides controlplane.placement_batch_ms when > 0.
	PlacementBatchMs int
	// Roles are the workers' roles (parallel to Workers; "" = both).
	Roles []string
	// Blind turns prefix matching off (cache.threshold 1,
	// match_abs_threshold 0): the prefill benchmark's blind baseline.
	Blind bool
}

// CartVariant is a set of routing-quality mechanisms to switch on.
type CartVariant struct {
	Capacity    bool    // declare the replicas' cache capacity (capacity-aware index)
	ClosedLoop  bool    // cache.closed_loop
	HotFraction float64 // cache.hot_prefix_fraction
	// Events consumes the replicas' KV events (workers[].kv_events): no
	// capacity is declared, the engines report it.
	Events bool
}

// CartVariants are the all-in-one variants the suite can compare: scenario
// "cart-<name>" runs variant <name>; plain "cart" runs "".
var CartVariants = map[string]CartVariant{
	"":           {Capacity: true},
	"plain":      {},
	"capacity":   {Capacity: true},
	"closedloop": {ClosedLoop: true},
	"hot":        {HotFraction: 0.3},
	"all":        {Capacity: true, ClosedLoop: true, HotFraction: 0.3},
	"events":     {Events: true},
}

// CartConfig renders a cart YAML config. Keys follow config.example.yaml;
// only what differs from the defaults (or matters for the benchmark) is set.
func CartConfig(c CartRouterConfig) string {
	var b strings.Builder
	port := c.Port
	if port == 0 {
		port = 6700 // unused by a control plane, but must be valid
	}
	fmt.Fprintf(&b, `server:
  host: 127.0.0.1
  port: %d
  min_open_files: 1024
  shutdown_grace_secs: 2
`, port)
	if c.MetricsPort > 0 {
		fmt.Fprintf(&b, "  metrics_addr: 127.0.0.1:%d\n", c.MetricsPort)
	}
	b.WriteString("workers:\n")
	v := CartVariants[c.Variant]
	declare := c.CacheTokens > 0 && v.Capacity
	for i, w := range c.Workers {
		fmt.Fprintf(&b, "  - url: %s\n", w)
		if i < len(c.Roles) && c.Roles[i] != "" {
			fmt.Fprintf(&b, "    role: %s\n", c.Roles[i])
		}
		if declare {
			fmt.Fprintf(&b, "    cache_capacity_tokens: %d\n", c.CacheTokens)
		}
		if v.Events && i < len(c.KVEvents) {
			fmt.Fprintf(&b, "    kv_events: {endpoint: %q, replay_endpoint: %q}\n", c.KVEvents[i], c.KVReplay[i])
		}
	}
	b.WriteString("cache:\n")
	if declare {
		fmt.Fprintf(&b, "  capacity_tokens: %d\n", c.CacheTokens)
	}
	fmt.Fprintf(&b, "  closed_loop: %t\n  hot_prefix_fraction: %g\n", v.ClosedLoop, v.HotFraction)
	if c.Blind {
		b.WriteString("  threshold: 1\n  match_abs_threshold: 0\n")
	}
	if c.BlockChars > 0 {
		fmt.Fprintf(&b, "  block_chars: %d\n", c.BlockChars)
	}
	if c.BalanceAbs > 0 {
		fmt.Fprintf(&b, "  balance_abs_threshold: %d\n", c.BalanceAbs)
	}
	b.WriteString(`health:
  interval_secs: 1
  timeout_secs: 1
  failure_threshold: 3
  success_threshold: 1
proxy:
  add_routed_peer_header: true
log:
  level: warn
  format: text
`)
	if c.NodeID != "" {
		fmt.Fprintf(&b, "controlplane:\n  node_id: %s\n  api_addr: %s\n  raft_addr: %s\n  data_dir: %s\n", c.NodeID, c.APIAddr, c.RaftAddr, c.DataDir)
		if c.Bootstrap {
			b.WriteString("  bootstrap: true\n")
		}
		if len(c.Join) > 0 {
			fmt.Fprintf(&b, "  join: [%s]\n", strings.Join(c.Join, ", "))
		}
		if c.PlacementBatchMs > 0 {
			fmt.Fprintf(&b, "  placement_batch_ms: %d\n", c.PlacementBatchMs)
		}
	}
	if len(c.ControlPlanes) > 0 {
		// The suite runs three control-plane nodes, up to four data planes,
		// the replicas, HAProxy and the load generator on one small
		// machine, where a loopback Route call queues behind all of them:
		// 100 ms instead of the production default of 20 ms keeps the
		// measurement about routing, not about CPU starvation.
		fmt.Fprintf(&b, "dataplane:\n  control_plane: [%s]\n  route_timeout_ms: 100\n", strings.Join(c.ControlPlanes, ", "))
		if c.DataPlaneID != "" {
			fmt.Fprintf(&b, "  id: %s\n", c.DataPlaneID)
		}
	}
	b.WriteString(c.Extra)
	return b.String()
}
