package config

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validBase is a config that passes Validate for every role, so each table
// row below isolates exactly one rule.
func validBase() *Config {
	c := Default()
	c.Workers = []Worker{{URL: "http://127.0.0.1:8001"}}
	c.ControlPlane.NodeID = "cp-1"
	c.ControlPlane.DataDir = "/var/lib/cart"
	c.DataPlane.ControlPlane = []string{"http://127.0.0.1:6701"}
	return c
}

func TestValidBaseIsValid(t *testing.T) {
	for _, role := range []Role{RoleAllInOne, RoleControlPlane, RoleDataPlane} {
		if err := validBase().Validate(role); err != nil {
			t.Errorf("%v: %v", role, err)
		}
	}
}

func TestValidateRoles(t *testing.T) {
	// Validate reads secret files, so the token file must exist.
	tokenFile := filepath.Join(t.TempDir(), "cart_token")
	if err := os.WriteFile(tokenFile, []byte("cluster-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		role   Role
		mutate func(c *Config)
	}{
		{"control plane without workers", RoleControlPlane, func(c *Config) { c.Workers = nil }},
		{"data plane without workers", RoleDataPlane, func(c *Config) { c.Workers = nil }},
		{"all-in-one ignores control plane identity", RoleAllInOne, func(c *Config) { c.ControlPlane.NodeID, c.ControlPlane.DataDir = "", "" }},
		{"all-in-one ignores missing control plane URLs", RoleAllInOne, func(c *Config) { c.DataPlane.ControlPlane = nil }},
		{"restarted control plane needs neither bootstrap nor join", RoleControlPlane, func(c *Config) {}},
		{"control plane bootstrap", RoleControlPlane, func(c *Config) { c.ControlPlane.Bootstrap = true }},
		{"control plane join", RoleControlPlane, func(c *Config) { c.ControlPlane.Join = []string{"http://cp-2.internal:6701"} }},
		{"bind all interfaces with advertise", RoleControlPlane, func(c *Config) {
			c.Auth.Token, c.Auth.RaftToken = "cluster", "raft"
			c.ControlPlane.RaftAddr = "0.0.0.0:6702"
			c.ControlPlane.AdvertiseRaftAddr = "cp-1.internal:6702"
			c.ControlPlane.APIAddr = ":6701"
			c.ControlPlane.AdvertiseAPIURL = "https://cp-1.internal:6701"
		}},
		{"remote raft with a Raft token file", RoleControlPlane, func(c *Config) {
			c.Auth.RaftTokenFile = tokenFile
			c.ControlPlane.RaftAddr = "10.0.0.5:6702"
		}},
		{"rolling upgrade to the Raft token", RoleControlPlane, func(c *Config) {
			c.Auth.Token, c.Auth.RaftTokenFile, c.Auth.RaftAcceptClusterToken = "cluster", tokenFile, true
			c.ControlPlane.RaftAddr = "10.0.0.5:6702"
		}},
		{"remote raft with mutual TLS", RoleControlPlane, func(c *Config) {
			c.ControlPlane.RaftAddr = "10.0.0.5:6702"
			c.ControlPlane.RaftTLS = TLS{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"}
		}},
		{"remote raft explicitly unauthenticated", RoleControlPlane, func(c *Config) {
			c.ControlPlane.RaftAddr = "10.0.0.5:6702"
			c.ControlPlane.AllowUnauthenticatedRaft = true
		}},
		{"loopback raft needs no peer authentication", RoleControlPlane, func(c *Config) { c.ControlPlane.RaftAddr = "localhost:6702" }},
		{"remote raft address matters only to the control plane", RoleAllInOne, func(c *Config) { c.ControlPlane.RaftAddr = "10.0.0.5:6702" }},
		{"remote media refused with 403", RoleAllInOne, func(c *Config) { c.Proxy.RemoteMediaURLPolicy = 403 }},
		{"pass-through prefixes and none", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/v1/audio/*", "/x", "/"} }},
		{"pass-through everything on purpose", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/*"} }},
		{"no pass-through at all", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = nil }},
		{"session enabled", RoleAllInOne, func(c *Config) { c.Session.Enabled = true }},
		{"a split pool, llm-d's sidecar, a threshold", RoleAllInOne, func(c *Config) {
			c.Workers = []Worker{{URL: "http://p:8000", Role: "prefill"}, {URL: "http://d:8000", Role: "decode"}, {URL: "http://b:8000", Role: "both"}}
			c.Disaggregation = Disaggregation{Mode: "sidecar", ThresholdTokens: 256, Endpoints: []string{"chat_completions", "responses"}}
		}},
		{"disaggregation threshold on a control plane", RoleControlPlane, func(c *Config) { c.Disaggregation.ThresholdTokens = 256 }},
		{"zero disables optional checks", RoleAllInOne, func(c *Config) {
			c.Server.MinOpenFiles = 0
			c.Cache.MatchAbsThreshold = 0
			c.Cache.EvictionIntervalSecs = 0
			c.Proxy.StreamIdleTimeoutSecs = 0
			c.Proxy.MaxRetries = 0
		}},
		{"mutual TLS", RoleAllInOne, func(c *Config) {
			c.Server.TLS = TLS{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			if err := c.Validate(tt.role); err != nil {
				t.Errorf("Validate(%v) = %v", tt.role, err)
			}
		})
	}
}

func TestValidateRules(t *testing.T) {
	tests := []struct {
		name   string
		role   Role
		mutate func(c *Config)
		key    string
		reason string // substring
	}{
		// server
		{"port zero", RoleAllInOne, func(c *Config) { c.Server.Port = 0 }, "server.port", "between 1 and 65535, got 0"},
		{"port too big", RoleAllInOne, func(c *Config) { c.Server.Port = 65536 }, "server.port", "between 1 and 65535"},
		{"min open files negative", RoleAllInOne, func(c *Config) { c.Server.MinOpenFiles = -1 }, "server.min_open_files", "at least 0"},
		{"read header timeout zero", RoleAllInOne, func(c *Config) { c.Server.ReadHeaderTimeoutSecs = 0 }, "server.read_header_timeout_secs", "greater than 0"},
		{"idle timeout negative", RoleAllInOne, func(c *Config) { c.Server.IdleTimeoutSecs = -1 }, "server.idle_timeout_secs", "greater than 0"},
		{"max header bytes small", RoleAllInOne, func(c *Config) { c.Server.MaxHeaderBytes = 4095 }, "server.max_header_bytes", "at least 4096"},
		{"shutdown grace negative", RoleAllInOne, func(c *Config) { c.Server.ShutdownGraceSecs = -1 }, "server.shutdown_grace_secs", "at least 0"},
		{"tls cert without key", RoleAllInOne, func(c *Config) { c.Server.TLS.CertFile = "c.pem" }, "server.tls.cert_file", "server.tls.key_file is not"},
		{"tls key without cert", RoleAllInOne, func(c *Config) { c.Server.TLS.KeyFile = "k.pem" }, "server.tls.key_file", "server.tls.cert_file is not"},
		{"tls client ca without cert", RoleAllInOne, func(c *Config) { c.Server.TLS.ClientCAFile = "ca.pem" }, "server.tls.client_ca_file", "requires cert_file"},

		// discovery
		{"dns port missing", RoleAllInOne, func(c *Config) { c.Discovery.DNS.Name = "sim" }, "discovery.dns.port", "between 1 and 65535, got 0"},
		{"dns srv with port", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.RecordType = "SRV" }, "discovery.dns.port", "must be 0 with record_type SRV"},
		{"dns record type", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.RecordType = "CNAME" }, "discovery.dns.record_type", "A (A and AAAA records) or SRV"},
		{"dns scheme", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.Scheme = "ftp" }, "discovery.dns.scheme", "http or https"},
		{"dns resolver without port", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.Resolver = "127.0.0.1" }, "discovery.dns.resolver", "host:port"},
		{"dns interval bounds", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.MaxIntervalSecs = 0.5 }, "discovery.dns.max_interval_secs", "at least min_interval_secs"},
		{"dns remove_after zero", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.RemoveAfter = 0 }, "discovery.dns.remove_after", "between 1 and 1000"},
		{"dns add_after zero", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.AddAfter = 0 }, "discovery.dns.add_after", "between 1 and 1000"},
		{"dns on a data plane", RoleDataPlane, func(c *Config) { c.Discovery.DNS = dnsOK() }, "discovery.dns.name", "a data plane does not discover workers"},
		{"drain timeout zero", RoleAllInOne, func(c *Config) { c.Discovery.DrainTimeoutSecs = 0 }, "discovery.drain_timeout_secs", "greater than 0"},
		{"k8s service and selector", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Selector = "app=vllm" }, "discovery.kubernetes.selector", "both set"},
		{"k8s neither service nor selector", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Service = "" }, "discovery.kubernetes.service", "set service"},
		{"k8s set but disabled", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes.Service = "vllm" }, "discovery.kubernetes.service", "enabled is false"},
		{"k8s bad service name", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Service = "vLLM_0" }, "discovery.kubernetes.service", "not a Service name"},
		{"k8s bad selector", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Selector = "", "app in ("
		}, "discovery.kubernetes.selector", "not a label selector"},
		{"k8s bad namespace", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Namespace = "Prod/A" }, "discovery.kubernetes.namespace", "not a namespace name"},
		{"k8s port missing", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Port = "" }, "discovery.kubernetes.port", "required"},
		{"k8s port number", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Port = "0" }, "discovery.kubernetes.port", "1..65535"},
		{"k8s port name", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.Port = "HTTP_port" }, "discovery.kubernetes.port", "not a port name"},
		{"k8s kubeconfig missing", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Kubeconfig = "/nonexistent/kubeconfig"
		}, "discovery.kubernetes.kubeconfig", "no such file"},
		{"k8s interval bounds", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.MaxIntervalSecs = 0.5 }, "discovery.kubernetes.max_interval_secs", "at least min_interval_secs"},
		{"k8s remove_after zero", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.RemoveAfter = 0 }, "discovery.kubernetes.remove_after", "between 1 and 1000"},
		{"k8s on a data plane", RoleDataPlane, func(c *Config) { c.Discovery.Kubernetes = k8sOK() }, "discovery.kubernetes.enabled", "a data plane does not discover workers"},
		{"k8s pool and service", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Port, c.Discovery.Kubernetes.InferencePool = "", "chat"
		}, "discovery.kubernetes.inference_pool", "service or selector is set too"},
		{"k8s pool with a port", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.InferencePool = "", "chat"
		}, "discovery.kubernetes.port", "targetPorts are the ports"},
		{"k8s bad pool name", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Port, c.Discovery.Kubernetes.InferencePool = "", "", "Chat_Pool"
		}, "discovery.kubernetes.inference_pool", "not an InferencePool name"},
		{"k8s pool set but disabled", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes.InferencePool = "chat" }, "discovery.kubernetes.inference_pool", "enabled is false"},
		// epp
		{"epp without a metrics listener", RoleEPP, func(c *Config) {}, "server.metrics_addr", "required by cart epp"},
		{"epp fallbacks negative", RoleEPP, func(c *Config) { c.Server.MetricsAddr = "127.0.0.1:9090"; c.EPP.FallbackEndpoints = -1 }, "epp.fallback_endpoints", "between 0 and 8"},
		{"epp fallbacks too many", RoleEPP, func(c *Config) { c.Server.MetricsAddr = "127.0.0.1:9090"; c.EPP.FallbackEndpoints = 9 }, "epp.fallback_endpoints", "between 0 and 8"},
		{"epp as a data plane: no discovery", RoleEPP, func(c *Config) {
			c.Server.MetricsAddr = "127.0.0.1:9090"
			c.DataPlane.ControlPlane = []string{"http://cp:6701"}
			c.Discovery.Kubernetes = k8sOK()
		}, "discovery.kubernetes.enabled", "a data plane does not discover workers"},
		{"epp all-in-one needs workers", RoleEPP, func(c *Config) {
			c.Server.MetricsAddr = "127.0.0.1:9090"
			c.Workers, c.DataPlane.ControlPlane = nil, nil
		}, "workers", "at least one worker"},

		// workers
		{"no workers all-in-one", RoleAllInOne, func(c *Config) { c.Workers = nil }, "workers",
			"at least one worker is required: the all-in-one router has nowhere to send requests; add workers[].url"},
		{"worker url empty", RoleControlPlane, func(c *Config) { c.Workers = []Worker{{}} }, "workers[0].url", "URL is empty"},
		{"worker url scheme", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "ftp://a:1" }, "workers[0].url", "http:// or https://"},
		{"worker url without scheme", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "localhost:8000" }, "workers[0].url", "http:// or https://"},
		{"worker url without host", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "http:///v1" }, "workers[0].url", "has no host"},
		{"worker url with query", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "http://a:1/?x=1" }, "workers[0].url", "query or fragment"},
		{"worker url with fragment", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "http://a:1#x" }, "workers[0].url", "query or fragment"},
		{"worker url with credentials", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "http://u:p@a:1" }, "workers[0].url", "credentials"},
		{"worker url bad port", RoleAllInOne, func(c *Config) { c.Workers[0].URL = "http://a:0" }, "workers[0].url", "invalid port"},
		{"worker url unparsable", RoleDataPlane, func(c *Config) { c.Workers[0].URL = "http://a b:1" }, "workers[0].url", "not a valid URL"},
		{"duplicate workers after normalizing", RoleAllInOne, func(c *Config) {
			c.Workers = []Worker{{URL: "http://a:1"}, {URL: "http://b:1"}, {URL: "HTTP://A:1/"}}
		}, "workers[2].url", "same as workers[0]"},
		{"worker max load negative", RoleAllInOne, func(c *Config) { c.Workers[0].MaxLoad = -1 }, "workers[0].max_load", "at least 0"},
		{"worker load penalty negative", RoleAllInOne, func(c *Config) { c.Workers[0].LoadPenalty = -1 }, "workers[0].load_penalty", "at least 0"},
		{"worker cache capacity negative", RoleAllInOne, func(c *Config) { c.Workers[0].CacheCapacityTokens = -1 }, "workers[0].cache_capacity_tokens", "at least 0"},

		// cache
		{"threshold above 1", RoleAllInOne, func(c *Config) { c.Cache.Threshold = 1.01 }, "cache.threshold", "between 0 and 1"},
		{"threshold negative", RoleAllInOne, func(c *Config) { c.Cache.Threshold = -0.1 }, "cache.threshold", "between 0 and 1"},
		{"threshold NaN", RoleAllInOne, func(c *Config) { c.Cache.Threshold = math.NaN() }, "cache.threshold", "finite"},
		{"match abs negative", RoleAllInOne, func(c *Config) { c.Cache.MatchAbsThreshold = -1 }, "cache.match_abs_threshold", "at least 0"},
		{"balance abs negative", RoleAllInOne, func(c *Config) { c.Cache.BalanceAbsThreshold = -1 }, "cache.balance_abs_threshold", "at least 0"},
		{"balance rel below 1", RoleAllInOne, func(c *Config) { c.Cache.BalanceRelThreshold = 0.9 }, "cache.balance_rel_threshold", "at least 1"},
		{"balance rel infinite", RoleAllInOne, func(c *Config) { c.Cache.BalanceRelThreshold = math.Inf(1) }, "cache.balance_rel_threshold", "finite"},
		{"max tree size zero", RoleAllInOne, func(c *Config) { c.Cache.MaxTreeSize = 0 }, "cache.max_tree_size", "at least 1"},
		{"eviction interval negative", RoleAllInOne, func(c *Config) { c.Cache.EvictionIntervalSecs = -1 }, "cache.eviction_interval_secs", "at least 0"},
		{"cleanup hour 24", RoleAllInOne, func(c *Config) { c.Cache.DailyCleanupHourUTC = 24 }, "cache.daily_cleanup_hour_utc", "between -1 and 23"},
		{"cleanup hour -2", RoleAllInOne, func(c *Config) { c.Cache.DailyCleanupHourUTC = -2 }, "cache.daily_cleanup_hour_utc", "between -1 and 23"},
		{"block chars zero", RoleAllInOne, func(c *Config) { c.Cache.BlockChars = 0 }, "cache.block_chars", "between 1 and 65536"},
		{"block chars too big", RoleAllInOne, func(c *Config) { c.Cache.BlockChars = 65537 }, "cache.block_chars", "between 1 and 65536"},
		{"capacity negative", RoleAllInOne, func(c *Config) { c.Cache.CapacityTokens = -1 }, "cache.capacity_tokens", "at least 0"},
		{"cache ttl negative", RoleAllInOne, func(c *Config) { c.Cache.TTLSecs = -1 }, "cache.ttl_secs", "at least 0"},

		// health
		{"endpoint without slash", RoleAllInOne, func(c *Config) { c.Health.Endpoint = "health" }, "health.endpoint", `starting with "/"`},
		{"health interval zero", RoleAllInOne, func(c *Config) { c.Health.IntervalSecs, c.Health.TimeoutSecs = 0, 0.5 }, "health.interval_secs", "greater than 0"},
		{"health timeout zero", RoleAllInOne, func(c *Config) { c.Health.TimeoutSecs = 0 }, "health.timeout_secs", "greater than 0"},
		{"health timeout above interval", RoleAllInOne, func(c *Config) { c.Health.TimeoutSecs = 11 }, "health.timeout_secs", "must not exceed health.interval_secs (10)"},
		{"health failure threshold zero", RoleAllInOne, func(c *Config) { c.Health.FailureThreshold = 0 }, "health.failure_threshold", "at least 1"},
		{"health success threshold zero", RoleAllInOne, func(c *Config) { c.Health.SuccessThreshold = 0 }, "health.success_threshold", "at least 1"},

		// proxy
		{"max body small", RoleAllInOne, func(c *Config) { c.Proxy.MaxBodyBytes = 1023 }, "proxy.max_body_bytes", "at least 1024"},
		{"remote media policy 200", RoleAllInOne, func(c *Config) { c.Proxy.RemoteMediaURLPolicy = 200 }, "proxy.remote_media_url_policy", "between 400 and 599"},
		{"remote media policy 600", RoleAllInOne, func(c *Config) { c.Proxy.RemoteMediaURLPolicy = 600 }, "proxy.remote_media_url_policy", "between 400 and 599"},
		{"pass-through relative", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"v1/x"} }, "proxy.pass_through_paths[0]", `must start with "/"`},
		{"pass-through dot segments", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/ok", "/v1/../sim/*"} }, "proxy.pass_through_paths[1]", `clean path ("/sim")`},
		{"pass-through trailing slash", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/v1/x/"} }, "proxy.pass_through_paths[0]", "clean path"},
		{"pass-through inner star", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/v1/*/x"} }, "proxy.pass_through_paths[0]", "only as a final"},
		{"pass-through bare star suffix", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/v1*"} }, "proxy.pass_through_paths[0]", "only as a final"},
		{"pass-through query", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/x?a=1"} }, "proxy.pass_through_paths[0]", "plain path"},
		{"pass-through escape", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/x%2Fy"} }, "proxy.pass_through_paths[0]", "plain path"},
		{"pass-through duplicate", RoleAllInOne, func(c *Config) { c.Proxy.PassThroughPaths = []string{"/x", "/x"} }, "proxy.pass_through_paths[1]", "listed twice"},
		{"connect timeout zero", RoleAllInOne, func(c *Config) { c.Proxy.ConnectTimeoutSecs = 0 }, "proxy.connect_timeout_secs", "greater than 0"},
		{"request timeout zero", RoleAllInOne, func(c *Config) { c.Proxy.RequestTimeoutSecs = 0 }, "proxy.request_timeout_secs", "greater than 0"},
		{"stream idle negative", RoleAllInOne, func(c *Config) { c.Proxy.StreamIdleTimeoutSecs = -1 }, "proxy.stream_idle_timeout_secs", "at least 0"},
		{"max retries 11", RoleAllInOne, func(c *Config) { c.Proxy.MaxRetries = 11 }, "proxy.max_retries", "between 0 and 10"},
		{"max retries negative", RoleAllInOne, func(c *Config) { c.Proxy.MaxRetries = -1 }, "proxy.max_retries", "between 0 and 10"},
		{"initial backoff negative", RoleAllInOne, func(c *Config) { c.Proxy.InitialBackoffMs = -1 }, "proxy.initial_backoff_ms", "at least 0"},
		{"max backoff below initial", RoleAllInOne, func(c *Config) { c.Proxy.MaxBackoffMs = 49 }, "proxy.max_backoff_ms", "at least proxy.initial_backoff_ms (50)"},
		{"backoff multiplier below 1", RoleAllInOne, func(c *Config) { c.Proxy.BackoffMultiplier = 0.5 }, "proxy.backoff_multiplier", "at least 1"},
		{"jitter above 1", RoleAllInOne, func(c *Config) { c.Proxy.JitterFactor = 1.5 }, "proxy.jitter_factor", "between 0 and 1"},
		{"retryable status 200", RoleAllInOne, func(c *Config) { c.Proxy.RetryableStatuses = []int{503, 200} }, "proxy.retryable_statuses[1]", "between 400 and 599"},
		{"retry budget ratio above 1", RoleAllInOne, func(c *Config) { c.Proxy.RetryBudgetRatio = 2 }, "proxy.retry_budget_ratio", "between 0 and 1"},
		{"inflight body budget below max body", RoleAllInOne, func(c *Config) { c.Proxy.MaxInflightBodyBytes = c.Proxy.MaxBodyBytes - 1 }, "proxy.max_inflight_body_bytes", "at least proxy.max_body_bytes"},
		{"body read timeout zero", RoleAllInOne, func(c *Config) { c.Proxy.BodyReadTimeoutSecs = 0 }, "proxy.body_read_timeout_secs", "greater than 0"},
		{"max messages zero", RoleAllInOne, func(c *Config) { c.Proxy.MaxMessages = 0 }, "proxy.max_messages", "at least 1"},
		{"max sessions zero", RoleAllInOne, func(c *Config) { c.Session.MaxSessions = 0 }, "session.max_sessions", "at least 1"},
		{"api body read timeout zero", RoleControlPlane, func(c *Config) { c.ControlPlane.APIBodyReadTimeoutSecs = 0 }, "controlplane.api_body_read_timeout_secs", "greater than 0"},
		{"retry budget min negative", RoleAllInOne, func(c *Config) { c.Proxy.RetryBudgetMin = -1 }, "proxy.retry_budget_min", "at least 0"},
		{"models cache negative", RoleAllInOne, func(c *Config) { c.Proxy.ModelsCacheSecs = -1 }, "proxy.models_cache_secs", "at least 0"},

		// circuit breaker
		{"breaker failure threshold zero", RoleAllInOne, func(c *Config) { c.CircuitBreaker.FailureThreshold = 0 }, "circuit_breaker.failure_threshold", "at least 1"},
		{"breaker success threshold zero", RoleAllInOne, func(c *Config) { c.CircuitBreaker.SuccessThreshold = 0 }, "circuit_breaker.success_threshold", "at least 1"},
		{"breaker timeout zero", RoleAllInOne, func(c *Config) { c.CircuitBreaker.TimeoutSecs = 0 }, "circuit_breaker.timeout_secs", "greater than 0"},

		// session
		{"session key unknown", RoleAllInOne, func(c *Config) { c.Session.Keys = []string{"user", "cookie:sid"} }, "session.keys[1]", `got "cookie:sid"`},
		{"session header empty", RoleAllInOne, func(c *Config) { c.Session.Keys = []string{"header:"} }, "session.keys[0]", "valid HTTP header name"},
		{"session header with space", RoleAllInOne, func(c *Config) { c.Session.Keys = []string{"header:X Session"} }, "session.keys[0]", "valid HTTP header name"},
		{"session key twice", RoleAllInOne, func(c *Config) { c.Session.Keys = []string{"header:X-Sid", "header:x-sid"} }, "session.keys[1]", "listed twice"},
		{"session enabled without keys", RoleAllInOne, func(c *Config) { c.Session.Enabled, c.Session.Keys = true, nil }, "session.keys", "at least one key"},
		{"ignore prefix empty", RoleAllInOne, func(c *Config) { c.Extract.IgnoreSystemPrefixes = []string{"x", ""} }, "extract.ignore_system_prefixes[1]", "must not be empty"},
		{"ignore prefix twice", RoleAllInOne, func(c *Config) { c.Extract.IgnoreSystemPrefixes = []string{"x", "x"} }, "extract.ignore_system_prefixes[1]", "listed twice"},
		{"session ttl zero", RoleAllInOne, func(c *Config) { c.Session.TTLSecs = 0 }, "session.ttl_secs", "greater than 0"},
		{"responses affinity ttl zero", RoleAllInOne, func(c *Config) { c.Responses.AffinityTTLSecs = 0 }, "responses.affinity_ttl_secs", "greater than 0"},
		{"responses max entries zero", RoleAllInOne, func(c *Config) { c.Responses.MaxEntries = 0 }, "responses.max_entries", "at least 1"},

		// log
		{"log level", RoleAllInOne, func(c *Config) { c.Log.Level = "warning" }, "log.level", `debug, info, warn, error, got "warning"`},
		{"log format", RoleAllInOne, func(c *Config) { c.Log.Format = "xml" }, "log.format", "json, text"},

		// auth
		{"token and token file", RoleAllInOne, func(c *Config) { c.Auth.Token, c.Auth.TokenFile = "t", "f" }, "auth.token_file", "cannot be combined with auth.token"},
		{"admin token and file", RoleAllInOne, func(c *Config) { c.Auth.AdminToken, c.Auth.AdminTokenFile = "t", "f" }, "auth.admin_token_file", "cannot be combined with auth.admin_token"},
		{"token file missing", RoleDataPlane, func(c *Config) { c.Auth.TokenFile = "/nonexistent/cart-token" }, "auth.token_file", "no such file"},
		{"admin token file missing", RoleControlPlane, func(c *Config) { c.Auth.AdminTokenFile = "/nonexistent/cart-admin" }, "auth.admin_token_file", "no such file"},
		{"raft token and file", RoleControlPlane, func(c *Config) { c.Auth.RaftToken, c.Auth.RaftTokenFile = "t", "f" }, "auth.raft_token_file", "cannot be combined with auth.raft_token"},
		{"raft token file missing", RoleControlPlane, func(c *Config) { c.Auth.RaftTokenFile = "/nonexistent/cart-raft" }, "auth.raft_token_file", "no such file"},
		{"raft token equals cluster token", RoleControlPlane, func(c *Config) { c.Auth.Token, c.Auth.RaftToken = "same", "same" }, "auth.raft_token", "same value as auth.token"},
		{"raft token equals admin token", RoleControlPlane, func(c *Config) { c.Auth.AdminToken, c.Auth.RaftToken = "same", "same" }, "auth.raft_token", "same value as auth.admin_token"},
		{"client key equals raft token", RoleControlPlane, func(c *Config) {
			c.Auth.RaftToken = "shared"
			c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "shared"}}
		}, "auth.client_keys[0]", "same value as auth.raft_token"},
		{"raft token on a data plane", RoleDataPlane, func(c *Config) { c.Auth.RaftToken = "r" }, "auth.raft_token", "a data plane must never hold it"},
		{"raft token file on an all-in-one router", RoleAllInOne, func(c *Config) { c.Auth.RaftTokenFile = "f" }, "auth.raft_token_file", "runs no Raft"},
		{"raft transition without a raft token", RoleControlPlane, func(c *Config) { c.Auth.Token, c.Auth.RaftAcceptClusterToken = "t", true }, "auth.raft_accept_cluster_token", "needs auth.raft_token_file"},
		{"raft transition without a cluster token", RoleControlPlane, func(c *Config) { c.Auth.RaftToken, c.Auth.RaftAcceptClusterToken = "r", true }, "auth.raft_accept_cluster_token", "no cluster token to accept"},
		{"raft transition on a data plane", RoleDataPlane, func(c *Config) { c.Auth.RaftAcceptClusterToken = true }, "auth.raft_accept_cluster_token", "control-plane nodes only"},
		{"admin token equals cluster token", RoleControlPlane, func(c *Config) { c.Auth.Token, c.Auth.AdminToken = "same", "same" }, "auth.admin_token", "same value as auth.token"},
		{"client key equals cluster token", RoleDataPlane, func(c *Config) {
			c.Auth.Token = "shared"
			c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "shared"}}
		}, "auth.client_keys[0]", "same value as auth.token"},
		{"client key equals admin token", RoleAllInOne, func(c *Config) {
			c.Auth.AdminToken = "shared"
			c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "shared"}}
		}, "auth.client_keys[0]", "same value as auth.admin_token"},
		{"two tenants share a key", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "k"}, {Name: "b", Key: "k"}} }, "auth.client_keys[1]", "same value as auth.client_keys[0]"},
		{"client key without name", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Key: "k"}} }, "auth.client_keys[0].name", "is required"},
		{"client key name charset", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "team a", Key: "k"}} }, "auth.client_keys[0].name", "may only contain"},
		{"return credit negative", RoleAllInOne, func(c *Config) { c.Flow.ReturnCredit = -1 }, "flow.return_credit", "between 0 and 64"},
		{"return credit past its bound", RoleAllInOne, func(c *Config) { c.Flow.ReturnCredit = MaxReturnCredit + 1 }, "flow.return_credit", "between 0 and 64"},
		{"client key name anonymous", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "anonymous", Key: "k"}} }, "auth.client_keys[0].name", "reserved"},
		{"client key names duplicate", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "k1"}, {Name: "a", Key: "k2"}} }, "auth.client_keys[1].name", "duplicate tenant name"},
		{"client key without secret", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a"}} }, "auth.client_keys[0].key_file", "is required"},
		{"client key inline and file", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "k", KeyFile: "f"}} }, "auth.client_keys[0].key_file", "cannot be combined with key"},
		{"client key file missing", RoleAllInOne, func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a", KeyFile: "/nonexistent/key"}} }, "auth.client_keys[0].key_file", "no such file"},
		{"worker api key file missing", RoleAllInOne, func(c *Config) { c.Workers[0].APIKeyFile = "/nonexistent/worker-key" }, "workers[0].api_key_file", "no such file"},
		{"worker model id empty", RoleAllInOne, func(c *Config) { c.Workers[0].Models = []string{"m", " "} }, "workers[0].models[1]", "empty model id"},
		{"worker model id duplicate", RoleAllInOne, func(c *Config) { c.Workers[0].Models = []string{"m", "m"} }, "workers[0].models[1]", "duplicate model"},
		{"worker key source unknown", RoleDataPlane, func(c *Config) { c.Proxy.WorkerAPIKeySources = []string{"static", "consul"} }, "proxy.worker_api_key_sources[1]", "must be one of static, admin, dns, kubernetes"},
		{"worker key source twice", RoleAllInOne, func(c *Config) { c.Proxy.WorkerAPIKeySources = []string{"dns", "dns"} }, "proxy.worker_api_key_sources[1]", "duplicate source"},
		{"allowed network invalid", RoleControlPlane, func(c *Config) { c.Discovery.AllowedNetworks = []string{"10.0.0.0/8", "10.0.0.0/33"} }, "discovery.allowed_networks[1]", "not a network"},
		{"allowed network a name", RoleAllInOne, func(c *Config) { c.Discovery.AllowedNetworks = []string{"workers.internal"} }, "discovery.allowed_networks[0]", "not a network"},
		{"allowed networks on a data plane", RoleDataPlane, func(c *Config) { c.Discovery.AllowedNetworks = []string{"10.0.0.0/8"} }, "discovery.allowed_networks", "a data plane does not discover"},
		{"pool worker api key file missing", RoleDataPlane, func(c *Config) { c.Proxy.WorkerAPIKeyFile = "/nonexistent/worker-key" }, "proxy.worker_api_key_file", "no such file"},
		{"metrics addr invalid", RoleAllInOne, func(c *Config) { c.Server.MetricsAddr = "9090" }, "server.metrics_addr", "must be host:port"},
		{"metrics addr same as client listener", RoleAllInOne, func(c *Config) { c.Server.MetricsAddr = "0.0.0.0:6700" }, "server.metrics_addr", "must differ from the client listener"},

		// control plane
		{"node id missing", RoleControlPlane, func(c *Config) { c.ControlPlane.NodeID = "" }, "controlplane.node_id", "is required for the control plane"},
		{"node id charset", RoleAllInOne, func(c *Config) { c.ControlPlane.NodeID = "cp 1" }, "controlplane.node_id", "may only contain"},
		{"data dir missing", RoleControlPlane, func(c *Config) { c.ControlPlane.DataDir = "" }, "controlplane.data_dir", "is required for the control plane"},
		{"api addr not host:port", RoleAllInOne, func(c *Config) { c.ControlPlane.APIAddr = "localhost" }, "controlplane.api_addr", "must be host:port"},
		{"api addr empty", RoleAllInOne, func(c *Config) { c.ControlPlane.APIAddr = "" }, "controlplane.api_addr", "is required"},
		{"raft addr bad port", RoleAllInOne, func(c *Config) { c.ControlPlane.RaftAddr = "127.0.0.1:0" }, "controlplane.raft_addr", "between 1 and 65535"},
		{"advertise raft addr invalid", RoleAllInOne, func(c *Config) { c.ControlPlane.AdvertiseRaftAddr = "cp-1" }, "controlplane.advertise_raft_addr", "must be host:port"},
		{"advertise raft addr unspecified", RoleAllInOne, func(c *Config) { c.ControlPlane.AdvertiseRaftAddr = "0.0.0.0:6702" }, "controlplane.advertise_raft_addr", "peers can dial"},
		{"raft bound to all interfaces", RoleControlPlane, func(c *Config) { c.Auth.RaftToken, c.ControlPlane.RaftAddr = "t", "0.0.0.0:6702" }, "controlplane.advertise_raft_addr", "is required when raft_addr"},
		{"api bound to all interfaces", RoleControlPlane, func(c *Config) { c.ControlPlane.APIAddr = "[::]:6701" }, "controlplane.advertise_api_url", "is required when api_addr"},
		{"advertise api url invalid", RoleAllInOne, func(c *Config) { c.ControlPlane.AdvertiseAPIURL = "cp-1:6701" }, "controlplane.advertise_api_url", "http:// or https://"},
		{"bootstrap and join", RoleControlPlane, func(c *Config) {
			c.ControlPlane.Bootstrap = true
			c.ControlPlane.Join = []string{"http://cp-2:6701"}
		}, "controlplane.join", "must be empty when controlplane.bootstrap is true"},
		{"join url invalid", RoleControlPlane, func(c *Config) { c.ControlPlane.Join = []string{"cp-2:6701"} }, "controlplane.join[0]", "http:// or https://"},
		{"placement batch ms zero", RoleAllInOne, func(c *Config) { c.ControlPlane.PlacementBatchMs = 0 }, "controlplane.placement_batch_ms", "at least 1"},
		{"placement batch max zero", RoleAllInOne, func(c *Config) { c.ControlPlane.PlacementBatchMax = 0 }, "controlplane.placement_batch_max", "at least 1"},
		{"load lease zero", RoleAllInOne, func(c *Config) { c.ControlPlane.LoadLeaseSecs = 0 }, "controlplane.load_lease_secs", "greater than 0"},
		{"unsettled tickets zero", RoleControlPlane, func(c *Config) { c.ControlPlane.MaxUnsettledTickets = 0 }, "controlplane.max_unsettled_tickets", "between 1 and"},
		{"handover threshold zero", RoleControlPlane, func(c *Config) { c.ControlPlane.SlowLeaderHandover.ThresholdMs = 0 }, "controlplane.slow_leader_handover.threshold_ms", "between 1 and 60000"},
		{"handover window too short", RoleControlPlane, func(c *Config) { c.ControlPlane.SlowLeaderHandover.WindowSecs = 0.5 }, "controlplane.slow_leader_handover.window_secs", "between 1 and 3600"},
		{"handover window nan", RoleControlPlane, func(c *Config) { c.ControlPlane.SlowLeaderHandover.WindowSecs = math.NaN() }, "controlplane.slow_leader_handover.window_secs", "finite"},
		{"handover interval below window", RoleControlPlane, func(c *Config) { c.ControlPlane.SlowLeaderHandover.MinIntervalSecs = 2 }, "controlplane.slow_leader_handover.min_interval_secs", "between window_secs (3) and 86400"},
		{"unknown log store", RoleControlPlane, func(c *Config) { c.ControlPlane.LogStore = "rocksdb" }, "controlplane.log_store", "must be one of auto, wal, bolt"},
		{"snapshot threshold zero", RoleAllInOne, func(c *Config) { c.ControlPlane.SnapshotThreshold = 0 }, "controlplane.snapshot_threshold", "at least 1"},
		{"raft tls cert without key", RoleControlPlane, func(c *Config) { c.ControlPlane.RaftTLS.CertFile = "c.pem" }, "controlplane.raft_tls.cert_file", "key_file is not"},
		{"remote raft without peer authentication", RoleControlPlane, func(c *Config) { c.ControlPlane.RaftAddr = "10.0.0.5:6702" },
			"controlplane.raft_addr", "Raft peers are not authenticated"},
		{"advertised raft address remote without peer authentication", RoleControlPlane, func(c *Config) { c.ControlPlane.AdvertiseRaftAddr = "cp-1.internal:6702" },
			"controlplane.raft_addr", `"cp-1.internal:6702" is reachable beyond loopback`},
		{"the cluster token is not Raft peer authentication", RoleControlPlane, func(c *Config) { c.Auth.Token, c.ControlPlane.RaftAddr = "t", "10.0.0.5:6702" },
			"controlplane.raft_addr", "no longer authenticates Raft peers"},
		{"server TLS alone is not peer authentication", RoleControlPlane, func(c *Config) {
			c.ControlPlane.RaftAddr = "10.0.0.5:6702"
			c.ControlPlane.RaftTLS = TLS{CertFile: "c.pem", KeyFile: "k.pem"}
		}, "controlplane.raft_addr", "Raft peers are not authenticated"},
		{"raft handshake timeout small", RoleAllInOne, func(c *Config) { c.ControlPlane.RaftHandshakeTimeoutMs = 99 }, "controlplane.raft_handshake_timeout_ms", "between 100 and 60000"},
		{"raft max conns small", RoleAllInOne, func(c *Config) { c.ControlPlane.RaftMaxConns = 15 }, "controlplane.raft_max_conns", "between 16 and 65536"},
		{"raft tls client ca without cert", RoleControlPlane, func(c *Config) { c.ControlPlane.RaftTLS.ClientCAFile = "ca.pem" }, "controlplane.raft_tls.client_ca_file", "requires cert_file"},

		// data plane
		{"control plane URLs missing", RoleDataPlane, func(c *Config) { c.DataPlane.ControlPlane = nil }, "dataplane.control_plane", "at least one control plane URL is required"},
		{"control plane URL invalid", RoleDataPlane, func(c *Config) { c.DataPlane.ControlPlane = []string{"http://a:1", "a:1"} }, "dataplane.control_plane[1]", "http:// or https://"},
		{"data plane id charset", RoleDataPlane, func(c *Config) { c.DataPlane.ID = "dp/1" }, "dataplane.id", "may only contain"},
		{"route timeout zero", RoleDataPlane, func(c *Config) { c.DataPlane.RouteTimeoutMs = 0 }, "dataplane.route_timeout_ms", "at least 1"},
		{"report interval small", RoleDataPlane, func(c *Config) { c.DataPlane.ReportIntervalMs = 0 }, "dataplane.report_interval_ms", "between 1 and 10000"},
		{"route breaker failures negative", RoleDataPlane, func(c *Config) { c.DataPlane.RouteBreakerFailures = -1 }, "dataplane.route_breaker_failures", "between 0 and 1000"},
		{"route breaker cooloff zero", RoleDataPlane, func(c *Config) { c.DataPlane.RouteBreakerCooloffMs = 0 }, "dataplane.route_breaker_cooloff_ms", "between 1 and 600000"},
		{"worker sync interval small", RoleDataPlane, func(c *Config) { c.DataPlane.WorkerSyncIntervalMs = 49 }, "dataplane.worker_sync_interval_ms", "at least 50"},
		{"client tls key without cert", RoleDataPlane, func(c *Config) { c.DataPlane.ClientTLS.KeyFile = "k.pem" }, "dataplane.tls.key_file", "dataplane.tls.cert_file is not"},

		// tracing
		{"trace ratio above one", RoleAllInOne, func(c *Config) { c.Tracing.SampleRatio = 1.5 }, "tracing.sample_ratio", "between 0 and 1, got 1.5"},
		{"trace ratio negative", RoleDataPlane, func(c *Config) { c.Tracing.SampleRatio = -0.1 }, "tracing.sample_ratio", "between 0 and 1"},
		{"trace ratio NaN", RoleControlPlane, func(c *Config) { c.Tracing.SampleRatio = math.NaN() }, "tracing.sample_ratio", "finite"},
		{"otlp endpoint without scheme", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "collector:4318" }, "tracing.otlp_endpoint", "http:// or https://"},
		{"otlp endpoint grpc scheme", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "grpc://collector:4317" }, "tracing.otlp_endpoint", "http:// or https://"},
		{"otlp endpoint unparsable", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "http://a b:4318" }, "tracing.otlp_endpoint", "not a valid URL"},
		{"otlp endpoint without host", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "http:///v1/traces" }, "tracing.otlp_endpoint", "has no host"},
		{"otlp endpoint bad port", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "http://collector:0" }, "tracing.otlp_endpoint", "invalid port"},
		{"otlp endpoint credentials", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "https://u:p@collector" }, "tracing.otlp_endpoint", "credentials"},
		{"otlp endpoint query", RoleAllInOne, func(c *Config) { c.Tracing.OTLPEndpoint = "http://collector:4318/?a=1" }, "tracing.otlp_endpoint", "query or fragment"},
		{"trace ca with http", RoleAllInOne, func(c *Config) {
			c.Tracing.OTLPEndpoint, c.Tracing.CAFile = "http://collector:4318", "ca.pem"
		}, "tracing.ca_file", "plaintext"},
		{"trace ca without endpoint", RoleAllInOne, func(c *Config) { c.Tracing.CAFile = "ca.pem" }, "tracing.ca_file", "tracing is off"},

		// prefill/decode
		{"worker role", RoleAllInOne, func(c *Config) { c.Workers[0].Role = "Prefill" }, "workers[0].role", "both, prefill or decode"},
		{"disaggregation mode", RoleAllInOne, func(c *Config) { c.Disaggregation.Mode = "nixl" }, "disaggregation.mode", "vllm, sidecar"},
		{"disaggregation threshold negative", RoleAllInOne, func(c *Config) { c.Disaggregation.ThresholdTokens = -1 }, "disaggregation.threshold_tokens", "at least 0"},
		{"disaggregation threshold on a data plane", RoleDataPlane, func(c *Config) { c.Disaggregation.ThresholdTokens = 256 }, "disaggregation.threshold_tokens", "set it on the control plane"},
		{"disaggregation endpoint", RoleAllInOne, func(c *Config) { c.Disaggregation.Endpoints = []string{"embeddings"} }, "disaggregation.endpoints[0]", "must be one of"},
		{"disaggregation endpoint twice", RoleAllInOne, func(c *Config) { c.Disaggregation.Endpoints = []string{"messages", "messages"} }, "disaggregation.endpoints[1]", "duplicate"},
		{"dns role names clash", RoleAllInOne, func(c *Config) { c.Discovery.DNS = dnsOK(); c.Discovery.DNS.DecodeName = c.Discovery.DNS.Name }, "discovery.dns.decode_name", "one name per role"},
		{"k8s role label with a service", RoleAllInOne, func(c *Config) { c.Discovery.Kubernetes = k8sOK(); c.Discovery.Kubernetes.RoleLabel = "llm-d.ai/role" }, "discovery.kubernetes.role_label", "needs selector"},
		{"k8s role label not a label", RoleAllInOne, func(c *Config) {
			c.Discovery.Kubernetes = k8sOK()
			c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Selector, c.Discovery.Kubernetes.RoleLabel = "", "app=vllm", "llm-d.ai/role?"
		}, "discovery.kubernetes.role_label", "not a label key"},

		{"unknown role", Role(7), func(c *Config) {}, "", "unknown role Role(7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			err := c.Validate(tt.role)
			ps := problemsOf(t, err)
			if len(ps) != 1 {
				t.Fatalf("got %d problems, want 1:\n%v", len(ps), err)
			}
			if ps[0].Key != tt.key || !strings.Contains(ps[0].Reason, tt.reason) {
				t.Errorf("problem = %q\nwant key %q with reason containing %q", ps[0], tt.key, tt.reason)
			}
		})
	}
}

func TestValidateReportsAllProblemsWithOrigins(t *testing.T) {
	paths := writeFiles(t,
		"workers:\n  - url: http://a:1\n  - url: ftp://b:1\n",
		"# overlay\ncache:\n  threshold: 2\nlog:\n  level: loud\n",
	)
	c, err := Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	c.Server.Port = 0 // set in code, so no origin is known
	err = c.Validate(RoleAllInOne)
	ps := problemsOf(t, err)
	want := []struct {
		file string
		line int
		key  string
	}{
		{"", 0, "server.port"},
		{paths[0], 3, "workers[1].url"},
		{paths[1], 3, "cache.threshold"},
		{paths[1], 5, "log.level"},
	}
	if len(ps) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ps), len(want), err)
	}
	for i, w := range want {
		if ps[i].File != w.file || ps[i].Line != w.line || ps[i].Key != w.key {
			t.Errorf("problem %d = %s, want %s:%d %s", i, ps[i], w.file, w.line, w.key)
		}
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("Error() has %d lines, want %d:\n%s", len(lines), len(want), err)
	}
	if wantLine := paths[1] + ":3: cache.threshold: must be between 0 and 1, got 2"; lines[2] != wantLine {
		t.Errorf("line = %q, want %q", lines[2], wantLine)
	}
	if !strings.HasPrefix(lines[0], "server.port: ") {
		t.Errorf("line without origin = %q", lines[0])
	}
}

func TestProblemString(t *testing.T) {
	tests := []struct {
		p    Problem
		want string
	}{
		{Problem{File: "a.yaml", Line: 3, Key: "k", Reason: "bad"}, "a.yaml:3: k: bad"},
		{Problem{File: "a.yaml", Key: "k", Reason: "bad"}, "a.yaml: k: bad"},
		{Problem{File: "a.yaml", Line: 1, Reason: "bad"}, "a.yaml:1: bad"},
		{Problem{Key: "k", Reason: "bad"}, "k: bad"},
		{Problem{Line: 2, Reason: "bad"}, "line 2: bad"},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.p, got, tt.want)
		}
	}
}

func TestNormalizeWorkerURL(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"http://a:8000", "http://a:8000", true},
		{"http://a:8000/", "http://a:8000", true},
		{"https://a/v1///", "https://a/v1", true},
		{"http://[::1]:8000/", "http://[::1]:8000", true},
		{"http://a:8000?", "", false},
		{"", "", false},
		{"/v1", "", false},
		{"http://a:65536", "", false},
		{"mailto:x@y", "", false},
	}
	for _, tt := range tests {
		got, err := NormalizeWorkerURL(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("NormalizeWorkerURL(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// TestSecretFilesAreRead: a secret mount that is present but empty must not
// silently turn authentication off, and a good file must pass.
func TestSecretFilesAreRead(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("k3y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		mutate func(c *Config)
		key    string
	}{
		{"cluster token", func(c *Config) { c.Auth.TokenFile = empty }, "auth.token_file"},
		{"client key", func(c *Config) { c.Auth.ClientKeys = []ClientKey{{Name: "a", KeyFile: empty}} }, "auth.client_keys[0].key_file"},
		{"worker key", func(c *Config) { c.Workers[0].APIKeyFile = empty }, "workers[0].api_key_file"},
		{"pool worker key", func(c *Config) { c.Proxy.WorkerAPIKeyFile = empty }, "proxy.worker_api_key_file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			err := c.Validate(RoleAllInOne)
			if err == nil || !strings.Contains(err.Error(), tt.key) || !strings.Contains(err.Error(), "is empty") {
				t.Fatalf("Validate = %v, want %s reported empty", err, tt.key)
			}
		})
	}
	c := validBase()
	c.Auth.ClientKeys = []ClientKey{{Name: "team-a", KeyFile: good}, {Name: "team-b", Key: "inline", IsolateCache: true}}
	c.Workers[0].APIKeyFile = good
	c.Workers = append(c.Workers, Worker{URL: "http://127.0.0.1:8002"})
	c.Proxy.WorkerAPIKeyFile = filepath.Join(dir, "pool")
	if err := os.WriteFile(c.Proxy.WorkerAPIKeyFile, []byte("pool-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Fatal(err)
	}
	keys, err := c.ClientKeys()
	if err != nil || len(keys) != 2 || keys[0] != (NamedKey{"team-a", "k3y", false}) || keys[1] != (NamedKey{"team-b", "inline", true}) {
		t.Fatalf("ClientKeys() = %v, %v", keys, err)
	}
	wk, err := c.WorkerKeys()
	if err != nil || wk.Default != "pool-key" || len(wk.PerWorker) != 1 {
		t.Fatalf("WorkerKeys() = %+v, %v", wk, err)
	}
	// A worker's own key goes to it whatever its source; the pool key only
	// to workers of the sources trusted with it: static and admin by
	// default, discovered ones when listed.
	for _, tc := range []struct{ worker, source, want string }{
		{"http://127.0.0.1:8001", "dns", "k3y"},
		{"http://127.0.0.1:8002", "static", "pool-key"},
		{"http://127.0.0.1:8002", "", "pool-key"},
		{"http://10.0.0.9:8000", "admin", "pool-key"},
		{"http://10.0.0.9:8000", "dns", ""},
		{"http://10.0.0.9:8000", "kubernetes", ""},
		{"http://10.0.0.9:8000", "unknown", ""},
	} {
		if got := wk.Get(tc.worker, tc.source); got != tc.want {
			t.Errorf("Get(%s, %q) = %q, want %q", tc.worker, tc.source, got, tc.want)
		}
	}
	c.Proxy.WorkerAPIKeySources = []string{"static", "dns"}
	if wk, err = c.WorkerKeys(); err != nil || wk.Get("http://10.0.0.9:8000", "dns") != "pool-key" || wk.Get("http://10.0.0.9:8000", "admin") != "" {
		t.Errorf("with sources static and dns: %+v, %v", wk, err)
	}
}

func dnsOK() DiscoveryDNS {
	d := Default().Discovery.DNS
	d.Name, d.Port = "sim", 8000
	return d
}

func TestTracingEndpointsAccepted(t *testing.T) {
	for _, ep := range []string{"http://otel-collector:4318", "https://collector.example:443/v1/traces", "http://[::1]:4318/"} {
		c := validBase()
		c.Tracing.OTLPEndpoint, c.Tracing.SampleRatio = ep, 0
		if err := c.Validate(RoleDataPlane); err != nil {
			t.Errorf("endpoint %q, ratio 0: %v", ep, err)
		}
	}
	c := validBase()
	c.Tracing = Tracing{OTLPEndpoint: "https://collector:4318", CAFile: "ca.pem", SampleRatio: 1}
	if err := c.Validate(RoleControlPlane); err != nil {
		t.Errorf("https with ca_file: %v", err)
	}
	if Default().Tracing.Enabled() || Default().Tracing.SampleRatio != 1 {
		t.Errorf("tracing defaults: %+v (want off, ratio 1)", Default().Tracing)
	}
}

func k8sOK() DiscoveryKubernetes {
	d := Default().Discovery.Kubernetes
	d.Enabled, d.Service, d.Port = true, "vllm", "http"
	return d
}

func TestKubernetesDiscoveryConfig(t *testing.T) {
	c := validBase()
	c.Workers = nil
	c.Discovery.Kubernetes = k8sOK()
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Fatalf("all-in-one with Kubernetes discovery and no static workers: %v", err)
	}
	c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Selector = "", "app=vllm,tier in (gpu)"
	if err := c.Validate(RoleControlPlane); err != nil {
		t.Fatalf("selector mode on a control plane: %v", err)
	}
	// A port written as a YAML number reads as the string.
	path := filepath.Join(t.TempDir(), "k8s.yaml")
	if err := os.WriteFile(path, []byte("discovery:\n  kubernetes:\n    enabled: true\n    service: vllm\n    port: 8000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Discovery.Kubernetes; got.Port != "8000" || got.Service != "vllm" || got.RemoveAfter != 1 {
		t.Fatalf("loaded %+v", got)
	}
}

func TestInferencePoolAndEPPConfig(t *testing.T) {
	c := validBase()
	c.Workers, c.DataPlane.ControlPlane = nil, nil
	c.Discovery.Kubernetes = k8sOK()
	c.Discovery.Kubernetes.Service, c.Discovery.Kubernetes.Port, c.Discovery.Kubernetes.InferencePool = "", "", "chat-pool"
	c.Server.MetricsAddr = "0.0.0.0:9090"
	c.EPP.FallbackEndpoints = 2
	if err := c.Validate(RoleEPP); err != nil {
		t.Fatalf("an all-in-one endpoint picker over an InferencePool: %v", err)
	}
	if c.EPPBase() != RoleAllInOne || RoleEPP.String() != "epp" {
		t.Fatalf("EPPBase %v, String %q", c.EPPBase(), RoleEPP.String())
	}
	d := validBase()
	d.Workers = nil
	d.DataPlane.ControlPlane = []string{"http://cp:6701"}
	d.Server.MetricsAddr = "0.0.0.0:9090"
	if err := d.Validate(RoleEPP); err != nil || d.EPPBase() != RoleDataPlane {
		t.Fatalf("an endpoint picker asking a control plane: %v (base %v)", err, d.EPPBase())
	}
}

func TestDiscoveryAllowsNoStaticWorkers(t *testing.T) {
	c := validBase()
	c.Workers = nil
	c.Discovery.DNS = dnsOK()
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Fatalf("all-in-one with DNS discovery and no static workers: %v", err)
	}
	c.Discovery.DNS.Name = ""
	if err := c.Validate(RoleAllInOne); err == nil {
		t.Fatal("all-in-one with neither workers nor discovery validated")
	}
}

// A role's three spellings: as configured, as stored (both is ""), as
// shown (nothing stored is both).
func TestRoleForms(t *testing.T) {
	for _, c := range []struct{ in, stored, shown string }{
		{"", "", "both"},
		{"both", "", "both"},
		{"prefill", "prefill", "prefill"},
		{"decode", "decode", "decode"},
	} {
		if !ValidRole(c.in) || RoleStored(c.in) != c.stored || RoleShown(RoleStored(c.in)) != c.shown {
			t.Errorf("%q: valid %v, stored %q, shown %q; want %q, %q", c.in, ValidRole(c.in), RoleStored(c.in), RoleShown(RoleStored(c.in)), c.stored, c.shown)
		}
	}
	for _, bad := range []string{"Prefill", "encode", "both "} {
		if ValidRole(bad) {
			t.Errorf("%q accepted as a role", bad)
		}
	}
}
