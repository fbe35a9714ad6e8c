package config

import (
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Role selects which role-specific rules Validate applies.
type Role int

const (
	// RoleAllInOne is the single-process router: it must have workers.
	RoleAllInOne Role = iota
	// RoleControlPlane is a Raft member that owns placement state.
	RoleControlPlane
	// RoleDataPlane proxies requests and asks the control plane for routes.
	RoleDataPlane
	// RoleEPP answers a gateway's ext_proc calls (cart epp) instead of
	// proxying: with dataplane.control_plane it is a data plane, without
	// an all-in-one router, and is validated as that role plus epp.*.
	RoleEPP
)

// String returns the role's CLI name, used in error messages.
func (r Role) String() string {
	switch r {
	case RoleAllInOne:
		return "all-in-one"
	case RoleControlPlane:
		return "controlplane"
	case RoleDataPlane:
		return "dataplane"
	case RoleEPP:
		return "epp"
	default:
		return fmt.Sprintf("Role(%d)", int(r))
	}
}

// Config is the complete effective configuration. The zero value is not
// useful; start from Default or Load.
//
// A Config is not modified after Load returns, so it may be shared between
// goroutines without locking.
type Config struct {
	Server         Server         `yaml:"server"`
	Workers        []Worker       `yaml:"workers"`
	Cache          Cache          `yaml:"cache"`
	Health         Health         `yaml:"health"`
	Proxy          Proxy          `yaml:"proxy"`
	CircuitBreaker CircuitBreaker `yaml:"circuit_breaker"`
	Session        Session        `yaml:"session"`
	Extract        Extract        `yaml:"extract"`
	Responses      Responses      `yaml:"responses"`
	Log            Log            `yaml:"log"`
	Auth           Auth           `yaml:"auth"`
	ControlPlane   ControlPlane   `yaml:"controlplane"`
	DataPlane      DataPlane      `yaml:"dataplane"`
	Discovery      Discovery      `yaml:"discovery"`
	KVEvents       KVEvents       `yaml:"kv_events"`
	Tracing        Tracing        `yaml:"tracing"`
	Flow           Flow           `yaml:"flow"`
	EPP            EPP            `yaml:"epp"`
	Disaggregation Disaggregation `yaml:"disaggregation"`

	// origins maps dotted keys to the file and line that last set them, so
	// validation errors can point at the offending file in a layered setup.
	origins map[string]origin
}

type origin struct {
	file string
	line int
}

// Server configures the client-facing HTTP listener.
type Server struct {
	Host string `yaml:"host"`
	Port int    `yaml:"port"`
	// MinOpenFiles is the RLIMIT_NOFILE the process needs (0 disables the
	// check): long-lived streaming connections exhaust the common 1024
	// default quickly, and failing at start beats failing under load.
	MinOpenFiles          int     `yaml:"min_open_files"`
	ReadHeaderTimeoutSecs float64 `yaml:"read_header_timeout_secs"`
	IdleTimeoutSecs       float64 `yaml:"idle_timeout_secs"`
	MaxHeaderBytes        int     `yaml:"max_header_bytes"`
	ShutdownGraceSecs     float64 `yaml:"shutdown_grace_secs"`
	TLS                   TLS     `yaml:"tls"`
	// MetricsAddr moves GET /metrics to its own plaintext listener
	// (host:port), so scrapers can be let in on a private interface while
	// the client port stays closed to them; empty keeps /metrics on the
	// client listener.
	MetricsAddr string `yaml:"metrics_addr"`
}

// TLS names the PEM files for a listener. An empty CertFile means plaintext.
type TLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile turns on mutual TLS: clients must present a certificate
	// signed by one of these CAs.
	ClientCAFile string `yaml:"client_ca_file"`
}

// Enabled reports whether the listener should serve TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

// ClientTLS configures outgoing TLS connections (data plane → control plane).
type ClientTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// Worker is one upstream inference server.
type Worker struct {
	URL string `yaml:"url"`
	// MaxLoad caps in-flight requests; 0 means no cap.
	MaxLoad int `yaml:"max_load"`
	// MaxConcurrency is how many requests the worker's engine runs at
	// once (vLLM --max-num-seqs, SGLang --max-running-requests): more are
	// held in CART's queue (flow.*) instead of the engine's. 0 learns it
	// from the engine's metrics when flow.learn_concurrency is on.
	MaxConcurrency int `yaml:"max_concurrency"`
	// LoadPenalty is added to this worker's load when balancing, to steer
	// traffic away from slower hardware without excluding it.
	LoadPenalty int `yaml:"load_penalty"`
	// CacheCapacityTokens overrides Cache.CapacityTokens for this worker;
	// 0 means use the global value.
	CacheCapacityTokens int64 `yaml:"cache_capacity_tokens"`
	// APIKeyFile holds the key this worker expects (vLLM --api-key); it is
	// sent as "Authorization: Bearer <key>" on requests and health probes.
	// Empty falls back to proxy.worker_api_key_file.
	APIKeyFile string `yaml:"api_key_file"`
	// Models are model ids (base models, LoRA adapters) this worker always
	// serves, in addition to those its /v1/models reports on each health
	// probe. A request for a model is routed only to workers serving it.
	Models []string `yaml:"models"`
	// KVEvents is where this worker's engine publishes its KV-cache
	// events (vLLM --kv-events-config, SGLang --kv-events-config).
	KVEvents WorkerKVEvents `yaml:"kv_events"`
	// Role is the part of requests the worker serves: "both" (whole
	// requests; "" means the same), "prefill" or "decode" (prefill/decode
	// disaggregation, see Disaggregation).
	Role string `yaml:"role"`
}

// Worker roles (Worker.Role, cartctl workers add --role, discovery).
const (
	RoleBothName    = "both"
	RolePrefillName = "prefill"
	RoleDecodeName  = "decode"
)

// ValidRole reports whether r names a worker role ("" is both).
func ValidRole(r string) bool {
	return r == "" || r == RoleBothName || r == RolePrefillName || r == RoleDecodeName
}

// RoleStored is a valid role as the worker set stores it (WorkerSpec.role):
// both is "", so that entries and snapshots from before roles read and
// compare as they did.
func RoleStored(r string) string {
	if r == RoleBothName {
		return ""
	}
	return r
}

// RoleShown is a stored role as people read it: "" (both, or a worker from
// a control plane older than roles) is "both".
func RoleShown(r string) string {
	if r == "" {
		return RoleBothName
	}
	return r
}

// Disaggregation configures prefill/decode disaggregation: a request on a
// split endpoint, in a pool with prefill and decode workers, is split
// between a prefill worker (chosen by prefix) and a decode worker (least
// loaded). A pool without both kinds routes every request whole.
type Disaggregation struct {
	// Mode is who runs a split request's two legs: "vllm" (CART runs
	// vLLM's kv_transfer_params protocol itself: the prefill leg, then the
	// decode leg, streamed) or "sidecar" (llm-d's routing sidecar on the
	// decode worker runs them: CART sends the request to the decode worker
	// with x-prefiller-host-port naming the prefill worker). Data planes
	// and the all-in-one router read it.
	Mode string `yaml:"mode"`
	// ThresholdTokens: a request with fewer prompt tokens than this not
	// already cached on the worker that would take it whole goes whole (as
	// llm-d's pd-profile-handler threshold); 0 splits every one. Read
	// where routes are decided: the all-in-one router, the control plane.
	ThresholdTokens int `yaml:"threshold_tokens"`
	// Endpoints are the routed endpoints whose requests may be split
	// (chat_completions, completions, messages, responses). vLLM takes
	// kv_transfer_params on the first three; its Responses API has no such
	// field, so responses is for engines that do (llm-d-inference-sim).
	Endpoints []string `yaml:"endpoints"`
}

// DefaultDisaggregationEndpoints are the endpoints vLLM splits.
var DefaultDisaggregationEndpoints = []string{"chat_completions", "completions", "messages"}

// WorkerKVEvents locates one engine's KV event stream. It is on when
// Endpoint (CART dials the engine) or Topic (the engine dials
// kv_events.listen) is set.
type WorkerKVEvents struct {
	// Endpoint is the engine's PUB socket for data-parallel rank 0, e.g.
	// tcp://10.0.0.5:5557 for an engine bound to tcp://*:5557.
	Endpoint string `yaml:"endpoint"`
	// ReplayEndpoint is the engine's replay ROUTER for rank 0; "" means
	// every sequence gap is a loss.
	ReplayEndpoint string `yaml:"replay_endpoint"`
	// Topic is the engine's topic: any topic when dialling with "", the
	// engine's name on the listen endpoint.
	Topic string `yaml:"topic"`
	// DataParallelSize is the engine's data-parallel size: rank r
	// publishes (and replays) on the rank-0 ports + r, as vLLM offsets them.
	DataParallelSize int `yaml:"data_parallel_size"`
}

// On reports whether the worker's events are consumed.
func (k WorkerKVEvents) On() bool { return k.Endpoint != "" || k.Topic != "" }

// KVEvents configures the consumer of the engines' KV-cache events.
type KVEvents struct {
	// Listen is a ZMQ endpoint CART binds for engines that dial it (llm-d's
	// layout); workers[].kv_events.topic tells their streams apart.
	Listen string `yaml:"listen"`
	// AllowUnauthenticatedListen permits Listen on a non-loopback address.
	// ZMQ as the engines speak it carries no credentials: whoever reaches
	// the socket can publish a cache reset for any mapped worker.
	AllowUnauthenticatedListen bool `yaml:"allow_unauthenticated_listen"`
	// ReplayTimeoutMs bounds one replay exchange with an engine.
	ReplayTimeoutMs int `yaml:"replay_timeout_ms"`
	// AllowedPublishers lists the source addresses (IPs or CIDRs) whose
	// connections the listen socket accepts; empty accepts any. It lets a
	// non-loopback listen start without AllowUnauthenticatedListen.
	AllowedPublishers []string `yaml:"allowed_publishers"`
	// IPCSocketMode is the file mode of an ipc:// listen socket (octal; a
	// peer must be able to write it to connect).
	IPCSocketMode string `yaml:"ipc_socket_mode"`
	// MaxMessageBytes bounds one ZMQ message (and frame) from any event
	// peer, checked on each frame header before anything is allocated.
	MaxMessageBytes int64 `yaml:"max_message_bytes"`
	// MaxPublisherConnections bounds the connections the listen socket
	// keeps at once.
	MaxPublisherConnections int `yaml:"max_publisher_connections"`
	// MaxHashesPerRank bounds the block hashes CART keeps per engine
	// data-parallel rank; beyond it the oldest go.
	MaxHashesPerRank int `yaml:"max_hashes_per_rank"`
}

// Publishers parses AllowedPublishers: an IP stands for itself (/32 or
// /128).
func (k KVEvents) Publishers() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range k.AllowedPublishers {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an IP address nor a CIDR", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// SocketMode parses IPCSocketMode ("" is 0600).
func (k KVEvents) SocketMode() (fs.FileMode, error) {
	if k.IPCSocketMode == "" {
		return 0o600, nil
	}
	m, err := strconv.ParseUint(k.IPCSocketMode, 8, 32)
	if err != nil || m > 0o777 || m&0o200 == 0 {
		return 0, fmt.Errorf("%q: want an octal file mode up to 0777 that the owner can write, e.g. 0600 or 0660", k.IPCSocketMode)
	}
	return fs.FileMode(m), nil
}

// Cache tunes the cache-aware routing decision and the prefix index.
type Cache struct {
	Threshold float64 `yaml:"threshold"`
	// MatchAbsThreshold routes by cache when at least this many characters
	// match even if the relative match is below Threshold; 0 disables it.
	MatchAbsThreshold    int     `yaml:"match_abs_threshold"`
	BalanceAbsThreshold  int     `yaml:"balance_abs_threshold"`
	BalanceRelThreshold  float64 `yaml:"balance_rel_threshold"`
	MaxTreeSize          int     `yaml:"max_tree_size"`
	EvictionIntervalSecs float64 `yaml:"eviction_interval_secs"`
	// DailyCleanupHourUTC clears the index once a day at this hour; -1
	// disables it.
	DailyCleanupHourUTC int     `yaml:"daily_cleanup_hour_utc"`
	BlockChars          int     `yaml:"block_chars"`
	CapacityTokens      int64   `yaml:"capacity_tokens"`
	TTLSecs             float64 `yaml:"ttl_secs"`
	// ClosedLoop adapts each worker's modelled cache capacity to the
	// cached tokens it reports in usage.
	ClosedLoop bool `yaml:"closed_loop"`
	// HotPrefixFraction: a prefix present in at least this fraction of
	// recent requests is spread instead of pinned (0 disables).
	HotPrefixFraction float64 `yaml:"hot_prefix_fraction"`
}

// Health configures active health checks against workers.
type Health struct {
	Endpoint         string  `yaml:"endpoint"`
	IntervalSecs     float64 `yaml:"interval_secs"`
	TimeoutSecs      float64 `yaml:"timeout_secs"`
	FailureThreshold int     `yaml:"failure_threshold"`
	SuccessThreshold int     `yaml:"success_threshold"`
}

// Proxy configures forwarding to workers, including retries.
type Proxy struct {
	MaxBodyBytes        int64 `yaml:"max_body_bytes"`
	AddRoutedPeerHeader bool  `yaml:"add_routed_peer_header"`
	// RemoteMediaURLPolicy is 0 to forward requests with remote media URLs,
	// or the HTTP status used to refuse them (workers fetching arbitrary
	// URLs is an SSRF vector some deployments must close).
	RemoteMediaURLPolicy int `yaml:"remote_media_url_policy"`
	// RemoteMediaAllowFile lets file: media URLs through the policy, for
	// engines configured to read a local media directory (vLLM's
	// --allowed-local-media-path).
	RemoteMediaAllowFile bool `yaml:"remote_media_allow_file"`
	// PassThroughPaths are the request paths, besides the routed ones and
	// GET /v1/models, forwarded to a worker: exact paths, or "/prefix/*".
	// Anything else gets 404, so that clients never reach an engine's
	// admin endpoints.
	PassThroughPaths      []string `yaml:"pass_through_paths"`
	ConnectTimeoutSecs    float64  `yaml:"connect_timeout_secs"`
	RequestTimeoutSecs    float64  `yaml:"request_timeout_secs"`
	StreamIdleTimeoutSecs float64  `yaml:"stream_idle_timeout_secs"`
	MaxRetries            int      `yaml:"max_retries"`
	InitialBackoffMs      int      `yaml:"initial_backoff_ms"`
	MaxBackoffMs          int      `yaml:"max_backoff_ms"`
	BackoffMultiplier     float64  `yaml:"backoff_multiplier"`
	JitterFactor          float64  `yaml:"jitter_factor"`
	RetryableStatuses     []int    `yaml:"retryable_statuses"`
	// RetryBudgetRatio and RetryBudgetMin bound retries to a fraction of
	// recent traffic so a failing fleet is not hit by a retry storm.
	RetryBudgetRatio float64 `yaml:"retry_budget_ratio"`
	RetryBudgetMin   int     `yaml:"retry_budget_min"`
	ModelsCacheSecs  float64 `yaml:"models_cache_secs"`
	// WorkerAPIKeyFile is the pool-wide worker key, for workers without
	// their own api_key_file (including workers added through cartctl).
	WorkerAPIKeyFile string `yaml:"worker_api_key_file"`
	// WorkerAPIKeySources are the worker sources (static, admin, dns,
	// kubernetes) whose workers get the pool-wide key: a discovered
	// endpoint is not the operator's word, so discovery sources are
	// opt-in.
	WorkerAPIKeySources []string `yaml:"worker_api_key_sources"`

	// MaxInflightBodyBytes bounds the request body bytes held by all
	// requests at once, so concurrent large or stalled uploads cannot
	// exhaust memory; over it, requests are refused with 503.
	MaxInflightBodyBytes int64 `yaml:"max_inflight_body_bytes"`
	// BodyReadTimeoutSecs bounds the time to receive one request body
	// (408), from a client or, in the picker, from the gateway's stream.
	BodyReadTimeoutSecs float64 `yaml:"body_read_timeout_secs"`
	// MaxMessages bounds the array items (messages, content parts, tool
	// calls, prompts) of one routed request, which decode into far more
	// memory than their bytes.
	MaxMessages int `yaml:"max_messages"`
}

// DefaultPassThroughPaths are the inference APIs of vLLM and SGLang other
// than the routed ones: embeddings, tokenize/detokenize,
// score/rerank, audio, pooling, classification, SGLang's /generate and
// /encode, Anthropic's token counting. They are also the only pass-through paths whose POSTs CART
// resends to another worker after a failure.
var DefaultPassThroughPaths = []string{
	"/v1/embeddings",
	"/tokenize", "/detokenize",
	"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
	"/v1/audio/transcriptions", "/v1/audio/translations",
	"/pooling", "/classify",
	"/generate", "/encode", "/v1/messages/count_tokens",
}

// CircuitBreaker configures per-worker passive failure detection.
type CircuitBreaker struct {
	Enabled          bool    `yaml:"enabled"`
	FailureThreshold int     `yaml:"failure_threshold"`
	SuccessThreshold int     `yaml:"success_threshold"`
	TimeoutSecs      float64 `yaml:"timeout_secs"`
}

// Tracing configures OpenTelemetry traces, exported over OTLP/HTTP.
type Tracing struct {
	// OTLPEndpoint is the collector's OTLP/HTTP URL (http:// plaintext,
	// https:// TLS); "" turns tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the fraction of new traces recorded; a request that
	// carries a traceparent follows its caller's sampled flag instead.
	SampleRatio float64 `yaml:"sample_ratio"`
	// CAFile verifies an https endpoint's certificate (system roots when
	// empty).
	CAFile string `yaml:"ca_file"`
	// ServiceName replaces the per-role service.name (cart-all-in-one,
	// cart-dataplane, cart-controlplane) when set.
	ServiceName string `yaml:"service_name"`
}

// Enabled reports whether spans are exported.
func (t Tracing) Enabled() bool { return t.OTLPEndpoint != "" }

// Discovery configures worker sources beside the static list: the
// all-in-one router and the control-plane leader run them.
type Discovery struct {
	// DrainTimeoutSecs bounds how long a worker that left its source keeps
	// its in-flight requests before it is removed anyway.
	DrainTimeoutSecs float64 `yaml:"drain_timeout_secs"`
	// AllowedNetworks are the networks (CIDR, or single addresses) a
	// discovered endpoint must lie in. Empty: any address but loopback and
	// link-local. Unspecified and multicast addresses and this process's
	// own listeners are refused whatever it says.
	AllowedNetworks []string            `yaml:"allowed_networks"`
	DNS             DiscoveryDNS        `yaml:"dns"`
	Kubernetes      DiscoveryKubernetes `yaml:"kubernetes"`
}

// DiscoveryKubernetes discovers workers from the ready endpoints of a
// Service's EndpointSlices, from ready pods matching a label selector, or
// from the ready pods of an InferencePool (its selector, on each of its
// target ports), through a client-go watch.
type DiscoveryKubernetes struct {
	Enabled bool `yaml:"enabled"`
	// Exactly one of Service, Selector and InferencePool.
	Service  string `yaml:"service"`
	Selector string `yaml:"selector"`
	// InferencePool names an inference.networking.k8s.io/v1 InferencePool
	// (Gateway API Inference Extension); its targetPorts are the ports.
	InferencePool string `yaml:"inference_pool"`
	// Namespace; "" = the pod's own namespace in-cluster, the kubeconfig
	// context's namespace, else "default".
	Namespace string `yaml:"namespace"`
	// Port is a port name or number (a string so that both read).
	Port   string `yaml:"port"`
	Scheme string `yaml:"scheme"`
	// Kubeconfig is a kubeconfig file; "" = in-cluster config.
	Kubeconfig string `yaml:"kubeconfig"`
	// RoleLabel is the pod label holding a worker's role (prefill, decode
	// or both; llm-d's llm-d.ai/role). A pod without it serves whole
	// requests; a pod with another value (an encode worker) is left out.
	// Needs selector: EndpointSlices do not carry pod labels.
	RoleLabel       string  `yaml:"role_label"`
	SyncTimeoutSecs float64 `yaml:"sync_timeout_secs"`
	MinIntervalSecs float64 `yaml:"min_interval_secs"`
	MaxIntervalSecs float64 `yaml:"max_interval_secs"`
	AddAfter        int     `yaml:"add_after"`
	RemoveAfter     int     `yaml:"remove_after"`
	// Defaults for discovered workers.
	MaxLoad             int   `yaml:"max_load"`
	LoadPenalty         int   `yaml:"load_penalty"`
	CacheCapacityTokens int64 `yaml:"cache_capacity_tokens"`
}

// DiscoveryDNS discovers workers from A/AAAA records (with Port) or SRV
// records of Name.
type DiscoveryDNS struct {
	// Name is the DNS name to resolve; "" disables DNS discovery unless
	// a name below is set. Its workers serve whole requests (role both).
	Name string `yaml:"name"`
	// PrefillName and DecodeName are resolved like Name, their workers
	// of role prefill and decode (a split pool behind one name per role).
	PrefillName string `yaml:"prefill_name"`
	DecodeName  string `yaml:"decode_name"`
	// RecordType is "A" (A and AAAA records, port from Port) or "SRV".
	RecordType string `yaml:"record_type"`
	Port       int    `yaml:"port"`
	Scheme     string `yaml:"scheme"`
	// Resolver is host:port of the DNS server; "" = first nameserver of
	// /etc/resolv.conf.
	Resolver        string  `yaml:"resolver"`
	TimeoutSecs     float64 `yaml:"timeout_secs"`
	MinIntervalSecs float64 `yaml:"min_interval_secs"`
	MaxIntervalSecs float64 `yaml:"max_interval_secs"`
	// AddAfter and RemoveAfter are the damping: consecutive resolutions an
	// endpoint must be present (absent) in before it is added (drained).
	AddAfter    int `yaml:"add_after"`
	RemoveAfter int `yaml:"remove_after"`
	// Defaults for discovered workers.
	MaxLoad             int   `yaml:"max_load"`
	LoadPenalty         int   `yaml:"load_penalty"`
	CacheCapacityTokens int64 `yaml:"cache_capacity_tokens"`
}

// Enabled reports whether DNS discovery runs.
func (d DiscoveryDNS) Enabled() bool {
	return d.Name != "" || d.PrefillName != "" || d.DecodeName != ""
}

// Session configures sticky routing by a client-supplied session key.
type Session struct {
	Enabled bool `yaml:"enabled"`
	// Keys are tried in order; the first one present in a request wins.
	Keys    []string `yaml:"keys"`
	TTLSecs float64  `yaml:"ttl_secs"`

	// MaxSessions bounds the session table; the least recently used
	// session is forgotten to make room.
	MaxSessions int `yaml:"max_sessions"`
}

// Extract configures how the prompt key is derived from request bodies.
type Extract struct {
	// IgnoreSystemPrefixes: a system block (Anthropic system string or text
	// block, chat system/developer message content or text part) whose
	// text starts with one of these is left out of the key, the way engines
	// drop volatile blocks before templating.
	IgnoreSystemPrefixes []string `yaml:"ignore_system_prefixes"`
}

// Responses configures the Responses API's response affinity: which
// replica produced each response id, so that previous_response_id and
// GET/DELETE /v1/responses/{id} reach the one replica storing it.
type Responses struct {
	// AffinityTTLSecs is how long an id is remembered after it was last
	// produced or used.
	AffinityTTLSecs float64 `yaml:"affinity_ttl_secs"`
	// MaxEntries bounds the table; the least recently used id goes first.
	MaxEntries int `yaml:"max_entries"`
}

// AffinityTTL is how long a response id stays pinned to its replica.
func (r Responses) AffinityTTL() time.Duration { return Seconds(r.AffinityTTLSecs) }

// Log configures the process logger.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Auth configures the credentials of the roles that talk to CART. They
// never stand in for one another:
//
//   - client keys (ClientKeys): what API clients present to the proxy
//     (all-in-one router and data planes);
//   - the cluster token (Token): what data planes and control-plane peers
//     present to the control-plane API (RouterService);
//   - the admin token (AdminToken): AdminService and the proxy's /workers;
//   - the Raft token (RaftToken): what control-plane nodes prove to each
//     other on the Raft port. Data planes never hold it.
//
// Secrets may be given inline or read from files (preferred: keeps them out
// of config repos and process listings); use Config.Tokens and
// Config.ClientKeys to obtain the effective values.
type Auth struct {
	Token          string `yaml:"token"`
	TokenFile      string `yaml:"token_file"`
	AdminToken     string `yaml:"admin_token"`
	AdminTokenFile string `yaml:"admin_token_file"`
	// RaftToken keys the peer handshake on the Raft port (control plane
	// only): every node of a cluster holds the same one.
	RaftToken     string `yaml:"raft_token"`
	RaftTokenFile string `yaml:"raft_token_file"`
	// RaftAcceptClusterToken is the rolling-upgrade setting from releases
	// whose Raft handshake was keyed by the cluster token: the node also
	// accepts that handshake, and uses it towards peers that refuse the
	// Raft token's. Remove it once every node has the Raft token: while it
	// is on, the cluster token (every data plane's) still opens the port.
	RaftAcceptClusterToken bool `yaml:"raft_accept_cluster_token"`
	// RefuseInsecureSecretFiles makes a secret file readable by its group
	// or by others (token, key and TLS private key files) a config error,
	// instead of a warning at start.
	RefuseInsecureSecretFiles bool `yaml:"refuse_insecure_secret_files"`
	// ClientKeys are the named API keys clients send as
	// "Authorization: Bearer <key>" or "x-api-key: <key>". The name is the
	// tenant label in logs and metrics.
	ClientKeys []ClientKey `yaml:"client_keys"`
	// AllowUnauthenticatedRemote is the explicit opt-in to serve without
	// credentials on a non-loopback address: a proxy role without client
	// keys, or a control plane without a cluster token. Validate does not
	// enforce it: the defaults (0.0.0.0, no keys) must stay loadable, and
	// only the server knows which listeners it actually opens. The roles'
	// start checks (which --config-check runs too) refuse server.host, and
	// the server refuses the address it bound.
	AllowUnauthenticatedRemote bool `yaml:"allow_unauthenticated_remote"`
}

// ClientKey is one tenant's API key.
type ClientKey struct {
	// Name labels the tenant in logs and metrics (bounded cardinality:
	// only configured names appear).
	Name    string `yaml:"name"`
	Key     string `yaml:"key"`
	KeyFile string `yaml:"key_file"`
	// Priority is this tenant's default flow-control priority: higher
	// goes first when the pool is saturated; below 0 is sheddable (429 at
	// once while the pool is saturated). Default 0.
	Priority int `yaml:"priority"`
	// MaxPriority is the highest priority this tenant's requests may ask
	// for with a priority header (flow.priority_headers); nil: Priority,
	// so a header can only lower it.
	MaxPriority *int `yaml:"max_priority"`
	// Weight scales this tenant's fair share of tokens within its
	// priority (2 = twice the tokens of a tenant of weight 1). Default 1.
	Weight float64 `yaml:"weight"`
	// IsolateCache gives the tenant a prefix cache of its own on the
	// workers: its requests carry a vLLM cache_salt derived from its key
	// (combined with any cache_salt the client sends), and the router's
	// index is seeded with it, so no other tenant shares its cached blocks
	// or learns from their timing what it sent. The cost: no sharing of
	// common prefixes (system prompts) with other tenants. vLLM ignores
	// cache_salt on /v1/messages, so that endpoint is refused for the
	// tenant.
	IsolateCache bool `yaml:"isolate_cache"`
}

// NamedKey is a resolved client key.
type NamedKey struct {
	Name         string
	Key          string
	IsolateCache bool
}

// AnonymousTenant labels requests when no client keys are configured (and
// requests refused for lack of a valid key). Config names may not use it.
const AnonymousTenant = "anonymous"

// ControlPlane configures a Raft-backed control plane node.
type ControlPlane struct {
	NodeID   string `yaml:"node_id"`
	APIAddr  string `yaml:"api_addr"`
	RaftAddr string `yaml:"raft_addr"`
	// AdvertiseRaftAddr and AdvertiseAPIURL are what peers use to reach this
	// node; they differ from the bind addresses behind NAT or when binding
	// to 0.0.0.0. Use EffectiveAdvertiseRaftAddr/EffectiveAdvertiseAPIURL.
	AdvertiseRaftAddr string   `yaml:"advertise_raft_addr"`
	AdvertiseAPIURL   string   `yaml:"advertise_api_url"`
	DataDir           string   `yaml:"data_dir"`
	Bootstrap         bool     `yaml:"bootstrap"`
	Join              []string `yaml:"join"`
	// PlacementBatchMs and PlacementBatchMax trade how far followers' indexes
	// lag the leader's (what a failover loses of it) for fewer, larger Raft
	// entries: routing answers never wait for a batch.
	PlacementBatchMs  int     `yaml:"placement_batch_ms"`
	PlacementBatchMax int     `yaml:"placement_batch_max"`
	LoadLeaseSecs     float64 `yaml:"load_lease_secs"`
	SnapshotThreshold uint64  `yaml:"snapshot_threshold"`
	TrailingLogs      uint64  `yaml:"trailing_logs"`
	// LogStore is the Raft log of a data dir that has none yet: "wal"
	// (also "auto") or "bolt". A data dir keeps the log it holds; asking
	// for the other kind stops the node with an error.
	LogStore string `yaml:"log_store"`
	// DebugPprof serves Go's profiler under /debug/pprof/ on the API
	// address, to loopback callers (or, with auth.admin_token set, to
	// holders of the admin token only).
	DebugPprof bool `yaml:"debug_pprof"`
	// Raft timing. Election happens HeartbeatTimeoutMs after the leader
	// goes silent; shorter means faster failover but more spurious
	// elections on a starved host.
	HeartbeatTimeoutMs   int `yaml:"heartbeat_timeout_ms"`
	ElectionTimeoutMs    int `yaml:"election_timeout_ms"`
	LeaderLeaseTimeoutMs int `yaml:"leader_lease_timeout_ms"`
	RaftTLS              TLS `yaml:"raft_tls"`

	// MaxUnsettledTickets caps the decisions the leader remembers until a
	// data plane settles them; past it the oldest is settled as undelivered.
	MaxUnsettledTickets int `yaml:"max_unsettled_tickets"`
	// APIBodyReadTimeoutSecs bounds the time to receive one API request
	// body, so stalled uploads cannot pin memory.
	APIBodyReadTimeoutSecs float64 `yaml:"api_body_read_timeout_secs"`
	// AllowUnauthenticatedRaft is the explicit opt-in to run a Raft port
	// reachable beyond loopback with neither a Raft token (peer handshake)
	// nor mutual TLS: anyone who reaches it could join.
	AllowUnauthenticatedRaft bool `yaml:"allow_unauthenticated_raft"`
	// RaftHandshakeTimeoutMs bounds the TLS and peer handshakes of one
	// Raft connection; a silent connection is closed after it.
	RaftHandshakeTimeoutMs int `yaml:"raft_handshake_timeout_ms"`
	// RaftMaxConns caps inbound Raft connections (authenticating or
	// authenticated); beyond it new ones are closed at once.
	RaftMaxConns int `yaml:"raft_max_conns"`
	// SlowLeaderHandover moves leadership away from a leader its data
	// planes see as slow (see SlowLeaderHandover).
	SlowLeaderHandover SlowLeaderHandover `yaml:"slow_leader_handover"`
}

// SlowLeaderHandover configures the leader's handover when most data
// planes, in their Sync reports, see its Route answers as slow for a
// sustained window while a follower is healthy.
type SlowLeaderHandover struct {
	Enabled bool `yaml:"enabled"`
	// ThresholdMs: a data plane whose p90 Route latency over a sync
	// interval reaches it (a call that timed out counts as the time it
	// waited) sees the leader as slow; so does one whose control-plane
	// breaker is open.
	ThresholdMs int `yaml:"threshold_ms"`
	// WindowSecs is how long a majority of reporting data planes must see
	// the leader as slow before it hands over.
	WindowSecs float64 `yaml:"window_secs"`
	// MinIntervalSecs: a node hands over at most once per interval, and
	// not in its first interval as leader.
	MinIntervalSecs float64 `yaml:"min_interval_secs"`
}

// Threshold, Window and MinInterval convert the handover settings.
func (h SlowLeaderHandover) Threshold() time.Duration   { return millis(h.ThresholdMs) }
func (h SlowLeaderHandover) Window() time.Duration      { return Seconds(h.WindowSecs) }
func (h SlowLeaderHandover) MinInterval() time.Duration { return Seconds(h.MinIntervalSecs) }

// DataPlane configures a stateless proxy node that asks the control plane
// where to route.
type DataPlane struct {
	// ID identifies this node to the control plane; when empty the caller
	// derives one (hostname-pid), because only it knows the process context.
	ID                   string    `yaml:"id"`
	ControlPlane         []string  `yaml:"control_plane"`
	RouteTimeoutMs       int       `yaml:"route_timeout_ms"`
	ReportIntervalMs     int       `yaml:"report_interval_ms"`
	WorkerSyncIntervalMs int       `yaml:"worker_sync_interval_ms"`
	ClientTLS            ClientTLS `yaml:"tls"`
	// RouteBreakerFailures consecutive Route timeouts/unavailable answers
	// (calls that were in flight together count once) stop Route calls for
	// RouteBreakerCooloffMs (0 disables the breaker), 100 ms after a call that
	// was refused at once. As many timeouts in a row also drop the
	// connections to the node (dataplane/remote/redial.go), and while the
	// breaker is open the Route stream retries at least once a cool-off.
	RouteBreakerFailures  int `yaml:"route_breaker_failures"`
	RouteBreakerCooloffMs int `yaml:"route_breaker_cooloff_ms"`
	// RouteStream carries Route, Complete and Sync on one long-lived
	// stream to the leader, with the unary calls as the fallback;
	// RouteStreamMaxInFlight bounds the calls in flight on it.
	RouteStream            bool `yaml:"route_stream"`
	RouteStreamMaxInFlight int  `yaml:"route_stream_max_in_flight"`
	// RouteStreamPlacementFeed asks the leader on that stream for every
	// placement it makes, for the local fallback's shadow index.
	RouteStreamPlacementFeed bool `yaml:"route_stream_placement_feed"`
}

// Flow configures flow control: what happens when every worker a request
// may use is saturated (at its max_load, or its engine's concurrency).
type Flow struct {
	// Enabled queues requests in front of a saturated pool (fleet-wide on
	// the control-plane leader) instead of answering 503. A pool with room
	// is unaffected: no request waits while an eligible worker has room.
	Enabled bool `yaml:"enabled"`
	// QueueTimeoutSecs: a request still waiting after this long is
	// answered 429 with Retry-After.
	QueueTimeoutSecs float64 `yaml:"queue_timeout_secs"`
	// MaxQueued and MaxQueuedBytes bound the queue (requests and body
	// bytes); the PerTenant ones each tenant's share. Past a bound: 429.
	MaxQueued               int   `yaml:"max_queued"`
	MaxQueuedBytes          int64 `yaml:"max_queued_bytes"`
	MaxQueuedPerTenant      int   `yaml:"max_queued_per_tenant"`
	MaxQueuedBytesPerTenant int64 `yaml:"max_queued_bytes_per_tenant"`
	// PriorityHeaders are read in order for a request's priority (an
	// integer; the first present wins), clamped to the client key's
	// max_priority. Dynamo's and SMG's names are accepted by default.
	PriorityHeaders []string `yaml:"priority_headers"`
	// TenantHeader, when set, refines the tenant for fairness: client key
	// name + "/" + the header's value (e.g. llm-d's
	// x-llm-d-inference-fairness-id). Metrics keep the key name.
	TenantHeader string `yaml:"tenant_header"`
	// DeadlineHeader carries a request's own deadline in milliseconds from
	// arrival: it orders the tenant's requests (earliest first) and ends
	// the wait if earlier than the queue timeout.
	DeadlineHeader string `yaml:"deadline_header"`
	// ReservePriority and ReserveSlots keep ReserveSlots of every worker's
	// limit for requests of priority >= ReservePriority while such
	// requests came within ReserveWindowSecs. 0 slots: no headroom.
	ReservePriority   int     `yaml:"reserve_priority"`
	ReserveSlots      int     `yaml:"reserve_slots"`
	ReserveWindowSecs float64 `yaml:"reserve_window_secs"`
	// ReturnCredit is how many requests (each the size of the one it
	// brings) a tenant returning from idle may start behind the others'
	// fair-share counters: with equal requests, a burst of ReturnCredit+2
	// goes before the backlogged tenants' next ones. Its share over time
	// is unchanged (a tenant served past its share gets no credit).
	ReturnCredit int `yaml:"return_credit"`
	// EnginePriority sets vLLM's request field "priority" (lower runs
	// first under --scheduling-policy priority) to minus the request's
	// priority, so the engine's own scheduler agrees with CART's.
	EnginePriority bool `yaml:"engine_priority"`
	// LearnConcurrency reads each worker's engine metrics
	// (MetricsEndpoint, every MetricsIntervalSecs) and learns its
	// concurrency from the requests it runs when it starts queueing, for
	// workers without max_concurrency.
	LearnConcurrency    bool    `yaml:"learn_concurrency"`
	MetricsEndpoint     string  `yaml:"metrics_endpoint"`
	MetricsIntervalSecs float64 `yaml:"metrics_interval_secs"`
	// RetryAfterSecs is the Retry-After of a 429 from flow control.
	RetryAfterSecs int `yaml:"retry_after_secs"`
}

// EPP configures the endpoint picker role (cart epp): CART answering a
// gateway's Envoy ext_proc calls, as the Gateway API Inference Extension's
// Endpoint Picker, with the destination instead of proxying.
type EPP struct {
	// FallbackEndpoints is how many endpoints may follow the chosen one in
	// an answer ("ip:port,ip:port,..."), for a gateway that tries them in
	// order when one cannot be reached. 0 answers the chosen one alone,
	// which every gateway reads (Envoy's ORIGINAL_DST cluster takes one
	// address).
	FallbackEndpoints int `yaml:"fallback_endpoints"`
}

// MaxFallbackEndpoints bounds epp.fallback_endpoints.
const MaxFallbackEndpoints = 8

// EPPBase is the role an endpoint picker is otherwise: a data plane when
// it has control planes to ask, else an all-in-one router.
func (c *Config) EPPBase() Role {
	if len(c.DataPlane.ControlPlane) > 0 {
		return RoleDataPlane
	}
	return RoleAllInOne
}

// QueueTimeout is flow.queue_timeout_secs.
func (f Flow) QueueTimeout() time.Duration { return Seconds(f.QueueTimeoutSecs) }

// DefaultPriorityHeaders are read for a request's priority: CART's own,
// then Dynamo's and SGLang Model Gateway's.
var DefaultPriorityHeaders = []string{"X-CART-Priority", "X-Dynamo-Request-Priority", "X-SMG-Priority"}

// Default returns a new Config with every default filled in. Each call
// returns fresh slices, so callers may modify the result freely.
func Default() *Config {
	return &Config{
		Server: Server{
			Host:                  "0.0.0.0",
			Port:                  6700,
			MinOpenFiles:          65535,
			ReadHeaderTimeoutSecs: 10,
			IdleTimeoutSecs:       120,
			MaxHeaderBytes:        1 << 20,
			ShutdownGraceSecs:     30,
		},
		Cache: Cache{
			Threshold:            0.3,
			MatchAbsThreshold:    8192,
			BalanceAbsThreshold:  64,
			BalanceRelThreshold:  1.5,
			MaxTreeSize:          1 << 20,
			EvictionIntervalSecs: 60,
			DailyCleanupHourUTC:  -1,
			BlockChars:           128, // ~32 tokens: bench/results/2026-12-01-blocksize
		},
		Health: Health{
			Endpoint:         "/health",
			IntervalSecs:     10,
			TimeoutSecs:      5,
			FailureThreshold: 3,
			SuccessThreshold: 2,
		},
		Proxy: Proxy{
			MaxBodyBytes:          32 << 20,
			ConnectTimeoutSecs:    2,
			RequestTimeoutSecs:    600,
			StreamIdleTimeoutSecs: 120,
			MaxRetries:            2,
			InitialBackoffMs:      50,
			MaxBackoffMs:          2000,
			BackoffMultiplier:     2,
			JitterFactor:          0.2,
			RetryableStatuses:     []int{408, 429, 500, 502, 503, 504},
			PassThroughPaths:      slices.Clone(DefaultPassThroughPaths),
			RetryBudgetRatio:      0.2,
			RetryBudgetMin:        3,
			ModelsCacheSecs:       600,
			WorkerAPIKeySources:   []string{SourceStatic, SourceAdmin},

			MaxInflightBodyBytes: 256 << 20,
			BodyReadTimeoutSecs:  30,
			MaxMessages:          10000,
		},
		CircuitBreaker: CircuitBreaker{
			Enabled:          true,
			FailureThreshold: 5,
			SuccessThreshold: 2,
			TimeoutSecs:      30,
		},
		Session: Session{
			Keys:    []string{"header:X-Session-Id", "prompt_cache_key", "user"},
			TTLSecs: 1800,

			MaxSessions: 100000,
		},
		Extract: Extract{
			// Claude Code's first system block holds a per-request hash;
			// vLLM drops it before templating.
			IgnoreSystemPrefixes: []string{"x-anthropic-billing-header"},
		},
		Responses: Responses{AffinityTTLSecs: 3600, MaxEntries: 100000},
		Log:       Log{Level: "info", Format: "json"},
		ControlPlane: ControlPlane{
			APIAddr:              "127.0.0.1:6701",
			RaftAddr:             "127.0.0.1:6702",
			PlacementBatchMs:     50,
			PlacementBatchMax:    512,
			LoadLeaseSecs:        5,
			MaxUnsettledTickets:  1 << 18,
			SnapshotThreshold:    8192,
			TrailingLogs:         2048,
			LogStore:             "auto",
			HeartbeatTimeoutMs:   500,
			ElectionTimeoutMs:    500,
			LeaderLeaseTimeoutMs: 500,

			APIBodyReadTimeoutSecs: 10,
			RaftHandshakeTimeoutMs: 5000,
			RaftMaxConns:           256,
			SlowLeaderHandover:     SlowLeaderHandover{Enabled: false, ThresholdMs: 15, WindowSecs: 3, MinIntervalSecs: 60},
		},
		DataPlane: DataPlane{
			RouteTimeoutMs:           20,
			ReportIntervalMs:         10,
			WorkerSyncIntervalMs:     500,
			RouteBreakerFailures:     5,
			RouteBreakerCooloffMs:    1000,
			RouteStream:              true,
			RouteStreamMaxInFlight:   128,
			RouteStreamPlacementFeed: true,
		},
		KVEvents: KVEvents{ReplayTimeoutMs: 2000, IPCSocketMode: "0600", MaxMessageBytes: 4 << 20,
			MaxPublisherConnections: 128, MaxHashesPerRank: 1_000_000},
		Discovery: Discovery{
			DrainTimeoutSecs: 60,
			DNS: DiscoveryDNS{
				RecordType:      "A",
				Scheme:          "http",
				TimeoutSecs:     2,
				MinIntervalSecs: 1,
				MaxIntervalSecs: 30,
				AddAfter:        1,
				RemoveAfter:     3,
			},
			Kubernetes: DiscoveryKubernetes{
				Scheme:          "http",
				SyncTimeoutSecs: 10,
				MinIntervalSecs: 1,
				MaxIntervalSecs: 60,
				AddAfter:        1,
				RemoveAfter:     1,
			},
		},
		Tracing:        Tracing{SampleRatio: 1},
		Disaggregation: Disaggregation{Mode: "vllm", Endpoints: slices.Clone(DefaultDisaggregationEndpoints)},
		Flow: Flow{
			Enabled:                 true,
			QueueTimeoutSecs:        30,
			MaxQueued:               10000,
			MaxQueuedBytes:          256 << 20,
			MaxQueuedPerTenant:      2000,
			MaxQueuedBytesPerTenant: 64 << 20,
			PriorityHeaders:         slices.Clone(DefaultPriorityHeaders),
			DeadlineHeader:          "X-CART-Deadline-Ms",
			ReservePriority:         1,
			ReserveWindowSecs:       10,
			ReturnCredit:            2,
			LearnConcurrency:        true,
			MetricsEndpoint:         "/metrics",
			MetricsIntervalSecs:     1,
			RetryAfterSecs:          1,
		},
	}
}

// Origin reports the file and line that last set a dotted key such as
// "cache.threshold", "workers" or "workers[1].url". It returns "" and 0 when
// the key still holds its default (or was set programmatically).
func (c *Config) Origin(key string) (file string, line int) {
	o, ok := c.origins[key]
	if !ok {
		return "", 0
	}
	return o.file, o.line
}

// Tokens returns the effective cluster and admin bearer tokens, reading
// token files when configured. File contents are trimmed because editors and
// `echo` add trailing newlines that would otherwise become part of the
// secret. An empty result means that kind of authentication is disabled.
func (c *Config) Tokens() (cluster, admin string, err error) {
	cluster, err = resolveToken(c.Auth.Token, c.Auth.TokenFile, "auth.token_file")
	if err != nil {
		return "", "", err
	}
	admin, err = resolveToken(c.Auth.AdminToken, c.Auth.AdminTokenFile, "auth.admin_token_file")
	if err != nil {
		return "", "", err
	}
	return cluster, admin, nil
}

// RaftToken returns the effective Raft token, reading the file when
// configured; "" means none.
func (c *Config) RaftToken() (string, error) {
	return resolveToken(c.Auth.RaftToken, c.Auth.RaftTokenFile, "auth.raft_token_file")
}

// ClientKeys returns the configured client keys with key files read.
func (c *Config) ClientKeys() ([]NamedKey, error) {
	out := make([]NamedKey, 0, len(c.Auth.ClientKeys))
	for i, k := range c.Auth.ClientKeys {
		key, err := resolveToken(k.Key, k.KeyFile, fmt.Sprintf("auth.client_keys[%d].key_file", i))
		if err != nil {
			return nil, err
		}
		if key == "" {
			return nil, fmt.Errorf("auth.client_keys[%d]: key or key_file is required", i)
		}
		out = append(out, NamedKey{Name: k.Name, Key: key, IsolateCache: k.IsolateCache})
	}
	return out, nil
}

// Worker sources: where a worker in the pool came from.
const (
	SourceStatic     = "static"     // the config's workers list
	SourceAdmin      = "admin"      // cartctl (AdminService)
	SourceDNS        = "dns"        // discovery.dns
	SourceKubernetes = "kubernetes" // discovery.kubernetes
)

// WorkerSources are every worker source, in documentation order.
var WorkerSources = []string{SourceStatic, SourceAdmin, SourceDNS, SourceKubernetes}

// WorkerKeySet is the key each worker gets as its bearer token (vLLM
// --api-key): its own (workers[].api_key_file, by URL), else the pool's
// (proxy.worker_api_key_file) when its source is one the operator trusts
// with it (proxy.worker_api_key_sources).
type WorkerKeySet struct {
	PerWorker      map[string]string
	Default        string
	DefaultSources []string
}

// Get returns the key for worker, which came from source ("" reads as
// static, as the replicated state does), or "" for none.
func (k WorkerKeySet) Get(worker, source string) string {
	if s, ok := k.PerWorker[worker]; ok {
		return s
	}
	if source == "" {
		source = SourceStatic
	}
	if k.Default != "" && slices.Contains(k.DefaultSources, source) {
		return k.Default
	}
	return ""
}

// WorkerKeys resolves the keys each configured worker expects and the pool
// default, with the sources the default may go to.
func (c *Config) WorkerKeys() (WorkerKeySet, error) {
	poolDefault, err := resolveToken("", c.Proxy.WorkerAPIKeyFile, "proxy.worker_api_key_file")
	if err != nil {
		return WorkerKeySet{}, err
	}
	perWorker := make(map[string]string, len(c.Workers))
	for i, w := range c.Workers {
		k, err := resolveToken("", w.APIKeyFile, fmt.Sprintf("workers[%d].api_key_file", i))
		if err != nil {
			return WorkerKeySet{}, err
		}
		if k != "" {
			perWorker[w.URL] = k
		}
	}
	return WorkerKeySet{PerWorker: perWorker, Default: poolDefault, DefaultSources: slices.Clone(c.Proxy.WorkerAPIKeySources)}, nil
}

func resolveToken(inline, file, key string) (string, error) {
	if inline != "" && file != "" {
		return "", fmt.Errorf("%s: cannot be combined with an inline token", key)
	}
	if file == "" {
		return inline, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: reading token: %w", key, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		// Treating an empty file as "no token" would silently turn
		// authentication off, e.g. when a secret mount failed.
		return "", fmt.Errorf("%s: %s is empty", key, file)
	}
	return tok, nil
}

// EffectiveAdvertiseRaftAddr is the Raft address peers should dial.
func (cp ControlPlane) EffectiveAdvertiseRaftAddr() string {
	if cp.AdvertiseRaftAddr != "" {
		return cp.AdvertiseRaftAddr
	}
	return cp.RaftAddr
}

// EffectiveAdvertiseAPIURL is the base URL other nodes use for this node's
// API, e.g. when a follower redirects writes to the leader.
func (cp ControlPlane) EffectiveAdvertiseAPIURL() string {
	if cp.AdvertiseAPIURL != "" {
		return cp.AdvertiseAPIURL
	}
	return "http://" + cp.APIAddr
}

// Addr returns the listen address in host:port form.
func (s Server) Addr() string {
	return net.JoinHostPort(s.Host, fmt.Sprint(s.Port))
}

// ReadHeaderTimeout bounds how long a client may take to send headers.
func (s Server) ReadHeaderTimeout() time.Duration { return Seconds(s.ReadHeaderTimeoutSecs) }

// IdleTimeout bounds keep-alive idle time on client connections.
func (s Server) IdleTimeout() time.Duration { return Seconds(s.IdleTimeoutSecs) }

// ShutdownGrace is how long in-flight requests may drain on shutdown.
func (s Server) ShutdownGrace() time.Duration { return Seconds(s.ShutdownGraceSecs) }

// EvictionInterval is the period of the index eviction pass; 0 disables it.
func (c Cache) EvictionInterval() time.Duration { return Seconds(c.EvictionIntervalSecs) }

// TTL is how long an index entry lives without use; 0 means no expiry.
func (c Cache) TTL() time.Duration { return Seconds(c.TTLSecs) }

// Interval is the period between health probes of one worker.
func (h Health) Interval() time.Duration { return Seconds(h.IntervalSecs) }

// Timeout bounds a single health probe.
func (h Health) Timeout() time.Duration { return Seconds(h.TimeoutSecs) }

// ConnectTimeout bounds dialing a worker.
func (p Proxy) ConnectTimeout() time.Duration { return Seconds(p.ConnectTimeoutSecs) }

// RequestTimeout bounds the wait for upstream response headers.
func (p Proxy) RequestTimeout() time.Duration { return Seconds(p.RequestTimeoutSecs) }

// StreamIdleTimeout bounds the gap between body chunks; 0 disables it.
func (p Proxy) StreamIdleTimeout() time.Duration { return Seconds(p.StreamIdleTimeoutSecs) }

// InitialBackoff is the delay before the first retry.
func (p Proxy) InitialBackoff() time.Duration { return millis(p.InitialBackoffMs) }

// MaxBackoff caps the delay between retries.
func (p Proxy) MaxBackoff() time.Duration { return millis(p.MaxBackoffMs) }

// ModelsCacheTTL is how long an aggregated /v1/models answer is reused.
func (p Proxy) ModelsCacheTTL() time.Duration { return Seconds(p.ModelsCacheSecs) }

// Timeout is how long an open breaker waits before probing again.
func (cb CircuitBreaker) Timeout() time.Duration { return Seconds(cb.TimeoutSecs) }

// TTL is how long an idle session stays pinned to its worker.
func (s Session) TTL() time.Duration { return Seconds(s.TTLSecs) }

// PlacementBatch is the longest a placement waits for its batch to fill.
func (cp ControlPlane) PlacementBatch() time.Duration { return millis(cp.PlacementBatchMs) }

// LoadLease is how long a data plane's load report counts before it lapses.
func (cp ControlPlane) LoadLease() time.Duration { return Seconds(cp.LoadLeaseSecs) }

// RouteBreakerCooloff is how long the data plane stops asking a control
// plane that keeps timing out, and the interval between its probes.
func (dp DataPlane) RouteBreakerCooloff() time.Duration { return millis(dp.RouteBreakerCooloffMs) }

// RouteTimeout bounds a routing query to the control plane.
func (dp DataPlane) RouteTimeout() time.Duration { return millis(dp.RouteTimeoutMs) }

// ReportInterval is how often completed requests are reported (batched)
// to the control plane.
func (dp DataPlane) ReportInterval() time.Duration { return millis(dp.ReportIntervalMs) }

// WorkerSyncInterval is the period of worker-list refreshes.
func (dp DataPlane) WorkerSyncInterval() time.Duration { return millis(dp.WorkerSyncIntervalMs) }

// Seconds converts a validated *_secs value (fractional seconds), saturating instead of
// overflowing so that a huge-but-valid setting means "practically forever"
// rather than a negative duration.
func Seconds(s float64) time.Duration {
	if !(s > 0) { // also catches NaN
		return 0
	}
	d := s * float64(time.Second)
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

func millis(ms int) time.Duration {
	if ms <= 0 {
		return 0
	}
	if int64(ms) > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
