package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cartrouter/cart/kvevents"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Normalize puts URLs into their canonical form (trailing slashes trimmed)
// so that "http://w:8000/" and "http://w:8000" name the same worker in
// routing tables, metrics and Raft state. Load calls it; call it yourself
// after building or editing a Config in code. Invalid URLs are left as
// written so Validate can quote them back to the user.
func (c *Config) Normalize() {
	for i := range c.Workers {
		if u, err := NormalizeWorkerURL(c.Workers[i].URL); err == nil {
			c.Workers[i].URL = u
		}
		if len(c.Workers[i].Models) == 0 {
			// "models: []" and no key mean the same: keep one form so that
			// comparisons (reload diffs) do not tell them apart.
			c.Workers[i].Models = nil
		}
	}
	normalizeURLs(c.ControlPlane.Join)
	normalizeURLs(c.DataPlane.ControlPlane)
}

func normalizeURLs(urls []string) {
	for i, raw := range urls {
		if u, err := NormalizeWorkerURL(raw); err == nil {
			urls[i] = u
		}
	}
}

// NormalizeWorkerURL checks that raw is usable as a base URL for an HTTP
// peer (absolute http or https URL with a host, no credentials, query or
// fragment) and returns it with trailing slashes removed. It is exported so
// that workers added at run time (e.g. through the control plane API) obey
// the same rules as configured ones.
func NormalizeWorkerURL(raw string) (string, error) {
	if raw == "" {
		return "", fmt.Errorf("URL is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q is not a valid URL: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%q must start with http:// or https://", raw)
	}
	if u.Opaque != "" || u.Hostname() == "" {
		return "", fmt.Errorf("%q has no host", raw)
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("%q has an invalid port", raw)
		}
	}
	if u.User != nil {
		// Credentials in a URL end up in logs, metrics labels and the
		// --config-check output; upstream auth belongs in headers.
		return "", fmt.Errorf("%q must not contain credentials", raw)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
		// Request paths are appended to the base URL, so a query or
		// fragment here would end up in the middle of every request URL.
		return "", fmt.Errorf("%q must not have a query or fragment", raw)
	}
	return strings.TrimRight(raw, "/"), nil
}

// workerKey identifies a worker for duplicate detection: scheme and host are
// case-insensitive, the path is not.
func workerKey(normalized string) string {
	u, err := url.Parse(normalized)
	if err != nil {
		return normalized
	}
	return strings.ToLower(u.Scheme+"://"+u.Host) + u.EscapedPath()
}

// Validate applies value and cross-field rules, including the ones specific
// to role. It returns a *Problems listing every violation, or nil. Problems
// carry the file and line that set the offending key when the config came
// from Load.
func (c *Config) Validate(role Role) error {
	v := &validator{c: c}
	if role == RoleEPP {
		role = c.EPPBase()
		v.epp()
	}
	v.server()
	v.workers(role)
	v.cache()
	v.health()
	v.proxy()
	v.circuitBreaker()
	v.session()
	v.extract()
	v.responses()
	v.log()
	v.auth(role)
	v.controlPlane(role)
	v.dataPlane(role)
	v.discovery(role)
	v.kvEvents(role)
	v.tracing()
	v.flow()
	v.disaggregation(role)
	if role < RoleAllInOne || role > RoleDataPlane {
		v.add("", "unknown role %v", role)
	}
	return v.problems.asError()
}

type validator struct {
	c        *Config
	problems Problems
}

func (v *validator) add(key, format string, args ...any) {
	file, line := v.c.Origin(key)
	v.problems = append(v.problems, Problem{File: file, Line: line, Key: key, Reason: fmt.Sprintf(format, args...)})
}

func (v *validator) intRange(key string, n, lo, hi int64) {
	if n < lo || n > hi {
		v.add(key, "must be between %d and %d, got %d", lo, hi, n)
	}
}

func (v *validator) intAtLeast(key string, n, lo int64) {
	if n < lo {
		v.add(key, "must be at least %d, got %d", lo, n)
	}
}

// finite rejects NaN and infinities, which YAML can express (.nan, .inf) and
// which slip through ordinary range comparisons.
func (v *validator) finite(key string, f float64) bool {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		v.add(key, "must be a finite number, got %v", f)
		return false
	}
	return true
}

func (v *validator) positive(key string, f float64) {
	if v.finite(key, f) && f <= 0 {
		v.add(key, "must be greater than 0, got %v", f)
	}
}

func (v *validator) floatAtLeast(key string, f, lo float64) {
	if v.finite(key, f) && f < lo {
		v.add(key, "must be at least %v, got %v", lo, f)
	}
}

func (v *validator) fraction(key string, f float64) {
	if v.finite(key, f) && (f < 0 || f > 1) {
		v.add(key, "must be between 0 and 1, got %v", f)
	}
}

func (v *validator) oneOf(key, val string, allowed ...string) {
	for _, a := range allowed {
		if val == a {
			return
		}
	}
	v.add(key, "must be one of %s, got %q", strings.Join(allowed, ", "), val)
}

func (v *validator) hostPort(key, addr string) bool {
	if addr == "" {
		v.add(key, "is required (host:port)")
		return false
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(key, "must be host:port, got %q", addr)
		return false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		v.add(key, "port must be between 1 and 65535, got %q", port)
		return false
	}
	return true
}

func (v *validator) url(key, raw string) {
	if _, err := NormalizeWorkerURL(raw); err != nil {
		v.add(key, "%v", err)
	}
}

func (v *validator) tls(prefix string, t TLS) {
	v.keyPair(prefix, t.CertFile, t.KeyFile)
	if t.ClientCAFile != "" && t.CertFile == "" {
		v.add(prefix+".client_ca_file", "requires cert_file and key_file: client certificates can only be checked over TLS")
	}
}

// keyPair reports a certificate without its key or vice versa against the
// key that is set, because that is the one whose origin is known.
func (v *validator) keyPair(prefix, cert, key string) {
	switch {
	case cert != "" && key == "":
		v.add(prefix+".cert_file", "is set but %s.key_file is not: a certificate is unusable without its key", prefix)
	case cert == "" && key != "":
		v.add(prefix+".key_file", "is set but %s.cert_file is not: a key is unusable without its certificate", prefix)
	}
}

func (v *validator) server() {
	s := v.c.Server
	v.intRange("server.port", int64(s.Port), 1, 65535)
	v.intAtLeast("server.min_open_files", int64(s.MinOpenFiles), 0)
	v.positive("server.read_header_timeout_secs", s.ReadHeaderTimeoutSecs)
	v.positive("server.idle_timeout_secs", s.IdleTimeoutSecs)
	v.intAtLeast("server.max_header_bytes", int64(s.MaxHeaderBytes), 4096)
	v.floatAtLeast("server.shutdown_grace_secs", s.ShutdownGraceSecs, 0)
	v.tls("server.tls", s.TLS)
	if s.MetricsAddr != "" && v.hostPort("server.metrics_addr", s.MetricsAddr) && s.MetricsAddr == s.Addr() {
		v.add("server.metrics_addr", "must differ from the client listener (%s): leave it empty to serve /metrics there", s.Addr())
	}
}

// epp checks epp.* and what an endpoint picker needs besides: its port
// speaks gRPC only, so /metrics needs a listener of its own.
func (v *validator) epp() {
	v.intRange("epp.fallback_endpoints", int64(v.c.EPP.FallbackEndpoints), 0, MaxFallbackEndpoints)
	if v.c.Server.MetricsAddr == "" {
		v.add("server.metrics_addr", "is required by cart epp: server.port serves ext_proc (gRPC) only, so /metrics needs its own listener (e.g. 0.0.0.0:9090)")
	}
}

func (v *validator) workers(role Role) {
	if len(v.c.Workers) == 0 && role == RoleAllInOne && !v.c.Discovery.DNS.Enabled() && !v.c.Discovery.Kubernetes.Enabled {
		v.add("workers", "at least one worker is required: the all-in-one router has nowhere to send requests; add workers[].url, discovery.dns.name or discovery.kubernetes")
	}
	seen := make(map[string]int)
	for i, w := range v.c.Workers {
		key := fmt.Sprintf("workers[%d]", i)
		u, err := NormalizeWorkerURL(w.URL)
		if err != nil {
			v.add(key+".url", "%v", err)
		} else if first, dup := seen[workerKey(u)]; dup {
			v.add(key+".url", "duplicate worker %q (same as workers[%d])", u, first)
		} else {
			seen[workerKey(u)] = i
		}
		v.intAtLeast(key+".max_load", int64(w.MaxLoad), 0)
		v.intAtLeast(key+".max_concurrency", int64(w.MaxConcurrency), 0)
		v.intAtLeast(key+".load_penalty", int64(w.LoadPenalty), 0)
		v.intAtLeast(key+".cache_capacity_tokens", w.CacheCapacityTokens, 0)
		if !ValidRole(w.Role) {
			v.add(key+".role", "must be both, prefill or decode, got %q", w.Role)
		}
		if w.APIKeyFile != "" {
			v.secret(key+".api_key_file", "", w.APIKeyFile)
		}
		mseen := make(map[string]bool, len(w.Models))
		for j, m := range w.Models {
			switch {
			case strings.TrimSpace(m) == "":
				v.add(fmt.Sprintf("%s.models[%d]", key, j), "empty model id")
			case mseen[m]:
				v.add(fmt.Sprintf("%s.models[%d]", key, j), "duplicate model %q", m)
			}
			mseen[m] = true
		}
	}
}

func (v *validator) cache() {
	c := v.c.Cache
	v.fraction("cache.threshold", c.Threshold)
	v.intAtLeast("cache.match_abs_threshold", int64(c.MatchAbsThreshold), 0)
	v.intAtLeast("cache.balance_abs_threshold", int64(c.BalanceAbsThreshold), 0)
	v.floatAtLeast("cache.balance_rel_threshold", c.BalanceRelThreshold, 1)
	v.intAtLeast("cache.max_tree_size", int64(c.MaxTreeSize), 1)
	v.floatAtLeast("cache.eviction_interval_secs", c.EvictionIntervalSecs, 0)
	v.intRange("cache.daily_cleanup_hour_utc", int64(c.DailyCleanupHourUTC), -1, 23)
	v.intRange("cache.block_chars", int64(c.BlockChars), 1, 65536)
	v.intAtLeast("cache.capacity_tokens", c.CapacityTokens, 0)
	v.floatAtLeast("cache.ttl_secs", c.TTLSecs, 0)
	v.fraction("cache.hot_prefix_fraction", c.HotPrefixFraction)
}

func (v *validator) health() {
	h := v.c.Health
	if !strings.HasPrefix(h.Endpoint, "/") {
		v.add("health.endpoint", "must be a path starting with \"/\", got %q", h.Endpoint)
	}
	v.positive("health.interval_secs", h.IntervalSecs)
	v.positive("health.timeout_secs", h.TimeoutSecs)
	if h.TimeoutSecs > h.IntervalSecs && h.IntervalSecs > 0 {
		v.add("health.timeout_secs", "must not exceed health.interval_secs (%v), got %v: probes would overlap", h.IntervalSecs, h.TimeoutSecs)
	}
	v.intAtLeast("health.failure_threshold", int64(h.FailureThreshold), 1)
	v.intAtLeast("health.success_threshold", int64(h.SuccessThreshold), 1)
}

func (v *validator) proxy() {
	p := v.c.Proxy
	v.intAtLeast("proxy.max_body_bytes", p.MaxBodyBytes, 1024)
	if p.RemoteMediaURLPolicy != 0 && (p.RemoteMediaURLPolicy < 400 || p.RemoteMediaURLPolicy > 599) {
		v.add("proxy.remote_media_url_policy", "must be 0 (allow) or an HTTP status between 400 and 599, got %d", p.RemoteMediaURLPolicy)
	}
	v.positive("proxy.connect_timeout_secs", p.ConnectTimeoutSecs)
	v.positive("proxy.request_timeout_secs", p.RequestTimeoutSecs)
	v.floatAtLeast("proxy.stream_idle_timeout_secs", p.StreamIdleTimeoutSecs, 0)
	v.intRange("proxy.max_retries", int64(p.MaxRetries), 0, 10)
	v.intAtLeast("proxy.initial_backoff_ms", int64(p.InitialBackoffMs), 0)
	if p.MaxBackoffMs < p.InitialBackoffMs {
		v.add("proxy.max_backoff_ms", "must be at least proxy.initial_backoff_ms (%d), got %d", p.InitialBackoffMs, p.MaxBackoffMs)
	}
	v.floatAtLeast("proxy.backoff_multiplier", p.BackoffMultiplier, 1)
	v.fraction("proxy.jitter_factor", p.JitterFactor)
	for i, s := range p.RetryableStatuses {
		v.intRange(fmt.Sprintf("proxy.retryable_statuses[%d]", i), int64(s), 400, 599)
	}
	v.fraction("proxy.retry_budget_ratio", p.RetryBudgetRatio)
	v.intAtLeast("proxy.retry_budget_min", int64(p.RetryBudgetMin), 0)
	v.floatAtLeast("proxy.models_cache_secs", p.ModelsCacheSecs, 0)
	if p.WorkerAPIKeyFile != "" {
		v.secret("proxy.worker_api_key_file", "", p.WorkerAPIKeyFile)
	}
	for i, src := range p.WorkerAPIKeySources {
		key := fmt.Sprintf("proxy.worker_api_key_sources[%d]", i)
		switch {
		case !slices.Contains(WorkerSources, src):
			v.add(key, "must be one of %s, got %q", strings.Join(WorkerSources, ", "), src)
		case slices.Index(p.WorkerAPIKeySources, src) < i:
			v.add(key, "duplicate source %q", src)
		}
	}
	seen := map[string]bool{}
	for i, e := range p.PassThroughPaths {
		key := fmt.Sprintf("proxy.pass_through_paths[%d]", i)
		if err := passThroughPathError(e); err != "" {
			v.add(key, "%s, got %q", err, e)
		} else if seen[e] {
			v.add(key, "%q is listed twice", e)
		}
		seen[e] = true
	}
	if p.MaxInflightBodyBytes < p.MaxBodyBytes {
		v.add("proxy.max_inflight_body_bytes", "must be at least proxy.max_body_bytes (%d), or a largest-size request could never be accepted; got %d", p.MaxBodyBytes, p.MaxInflightBodyBytes)
	}
	v.positive("proxy.body_read_timeout_secs", p.BodyReadTimeoutSecs)
	v.intAtLeast("proxy.max_messages", int64(p.MaxMessages), 1)
}

// passThroughPathError says what is wrong with an allowlist entry: it must
// be an absolute, clean path, optionally ending in "/*".
func passThroughPathError(e string) string {
	base, prefix := strings.CutSuffix(e, "/*")
	switch {
	case !strings.HasPrefix(e, "/"):
		return "must start with \"/\""
	case strings.ContainsAny(e, "?#%\\ \t\r\n"):
		return "must be a plain path (no query, fragment, escapes or spaces)"
	case strings.Contains(base, "*"):
		return "may hold '*' only as a final \"/*\""
	case prefix && base == "":
		return "" // "/*" forwards everything; an explicit choice
	case path.Clean(base) != base:
		return fmt.Sprintf("must be a clean path (%q)", path.Clean(base))
	}
	return ""
}

func (v *validator) circuitBreaker() {
	cb := v.c.CircuitBreaker
	v.intAtLeast("circuit_breaker.failure_threshold", int64(cb.FailureThreshold), 1)
	v.intAtLeast("circuit_breaker.success_threshold", int64(cb.SuccessThreshold), 1)
	v.positive("circuit_breaker.timeout_secs", cb.TimeoutSecs)
}

func (v *validator) session() {
	s := v.c.Session
	if s.Enabled && len(s.Keys) == 0 {
		v.add("session.keys", "at least one key is required when session.enabled is true")
	}
	seen := make(map[string]bool)
	for i, k := range s.Keys {
		key := fmt.Sprintf("session.keys[%d]", i)
		switch {
		case k == "prompt_cache_key" || k == "user":
		case strings.HasPrefix(k, "header:"):
			if !isHeaderName(strings.TrimPrefix(k, "header:")) {
				v.add(key, "%q: header name after \"header:\" must be a valid HTTP header name", k)
				continue
			}
		default:
			v.add(key, "must be \"header:<Name>\", \"prompt_cache_key\" or \"user\", got %q", k)
			continue
		}
		// HTTP header names are case-insensitive, so compare them that way.
		norm := strings.ToLower(k)
		if seen[norm] {
			v.add(key, "%q is listed twice", k)
		}
		seen[norm] = true
	}
	v.positive("session.ttl_secs", s.TTLSecs)
	v.intAtLeast("session.max_sessions", int64(s.MaxSessions), 1)
}

func (v *validator) extract() {
	seen := make(map[string]bool)
	for i, p := range v.c.Extract.IgnoreSystemPrefixes {
		key := fmt.Sprintf("extract.ignore_system_prefixes[%d]", i)
		switch {
		case p == "":
			// Every text starts with "": it would drop every system prompt.
			v.add(key, "must not be empty")
		case seen[p]:
			v.add(key, "%q is listed twice", p)
		}
		seen[p] = true
	}
}

func (v *validator) responses() {
	r := v.c.Responses
	v.positive("responses.affinity_ttl_secs", r.AffinityTTLSecs)
	v.intAtLeast("responses.max_entries", int64(r.MaxEntries), 1)
}

// isHeaderName reports whether s is an RFC 9110 token.
func isHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func (v *validator) log() {
	v.oneOf("log.level", v.c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", v.c.Log.Format, "json", "text")
}

func (v *validator) auth(role Role) {
	a := v.c.Auth
	v.raftAuth(role)
	if a.RefuseInsecureSecretFiles {
		for _, f := range v.c.ExposedSecretFiles() {
			v.add(f.Key, "%s %s (auth.refuse_insecure_secret_files is on)", f.Path, f.Why)
		}
	}
	// owner maps each secret to the key that set it: one value serving two
	// roles would let a client key act as the cluster or admin credential.
	owner := map[string]string{}
	claim := func(key, secret string) {
		if secret == "" {
			return
		}
		if first, dup := owner[secret]; dup {
			v.add(key, "has the same value as %s: client keys, the cluster token, the admin token and the Raft token must all differ, or one role's credential would work for another", first)
			return
		}
		owner[secret] = key
	}
	if a.Token != "" && a.TokenFile != "" {
		v.add("auth.token_file", "cannot be combined with auth.token: set only one of them")
	} else {
		claim("auth.token", v.secret("auth.token_file", a.Token, a.TokenFile))
	}
	if a.AdminToken != "" && a.AdminTokenFile != "" {
		v.add("auth.admin_token_file", "cannot be combined with auth.admin_token: set only one of them")
	} else {
		claim("auth.admin_token", v.secret("auth.admin_token_file", a.AdminToken, a.AdminTokenFile))
	}
	if a.RaftToken != "" && a.RaftTokenFile != "" {
		v.add("auth.raft_token_file", "cannot be combined with auth.raft_token: set only one of them")
	} else if role == RoleControlPlane { // other roles are refused it (raftAuth)
		claim("auth.raft_token", v.secret("auth.raft_token_file", a.RaftToken, a.RaftTokenFile))
	}
	names := map[string]int{}
	for i, k := range a.ClientKeys {
		key := fmt.Sprintf("auth.client_keys[%d]", i)
		switch {
		case k.Name == "":
			v.add(key+".name", "is required: it labels the tenant in logs and metrics")
		case !idPattern.MatchString(k.Name) || len(k.Name) > 64:
			v.add(key+".name", "may only contain letters, digits, '.', '_' and '-' (at most 64), got %q", k.Name)
		case k.Name == AnonymousTenant:
			v.add(key+".name", "%q is reserved for requests without a client key", AnonymousTenant)
		default:
			if first, dup := names[k.Name]; dup {
				v.add(key+".name", "duplicate tenant name %q (same as auth.client_keys[%d])", k.Name, first)
			}
			names[k.Name] = i
		}
		v.intRange(key+".priority", int64(k.Priority), MinPriority, MaxPriority)
		if k.MaxPriority != nil {
			v.intRange(key+".max_priority", int64(*k.MaxPriority), MinPriority, MaxPriority)
			if *k.MaxPriority < k.Priority {
				v.add(key+".max_priority", "is below priority (%d): the key's own default would exceed what it may ask for", k.Priority)
			}
		}
		if k.Weight != 0 {
			v.positive(key+".weight", k.Weight)
		}
		switch {
		case k.Key != "" && k.KeyFile != "":
			v.add(key+".key_file", "cannot be combined with key: set only one of them")
		case k.Key == "" && k.KeyFile == "":
			v.add(key+".key_file", "is required (or an inline key): a client key without a secret would admit anyone")
		default:
			claim(key, v.secret(key+".key_file", k.Key, k.KeyFile))
		}
	}
}

// MinPriority and MaxPriority bound flow-control priorities (config and
// headers alike), which also keeps the priority label of the metrics to a
// bounded set.
const (
	MinPriority = -100
	MaxPriority = 100
)

// MaxReturnCredit bounds flow.return_credit: a credit that large lets a
// returning tenant's bursts run ahead of everyone for so long that the
// fair share would only hold over hours.
const MaxReturnCredit = 64

func (v *validator) flow() {
	f := v.c.Flow
	v.positive("flow.queue_timeout_secs", f.QueueTimeoutSecs)
	v.intAtLeast("flow.max_queued", int64(f.MaxQueued), 1)
	v.intAtLeast("flow.max_queued_bytes", f.MaxQueuedBytes, 1)
	v.intAtLeast("flow.max_queued_per_tenant", int64(f.MaxQueuedPerTenant), 1)
	v.intAtLeast("flow.max_queued_bytes_per_tenant", f.MaxQueuedBytesPerTenant, 1)
	if f.MaxQueuedPerTenant > f.MaxQueued {
		v.add("flow.max_queued_per_tenant", "exceeds flow.max_queued (%d)", f.MaxQueued)
	}
	for i, h := range f.PriorityHeaders {
		if !headerName.MatchString(h) {
			v.add(fmt.Sprintf("flow.priority_headers[%d]", i), "%q is not an HTTP header name", h)
		}
	}
	for _, h := range []struct{ key, v string }{{"flow.tenant_header", f.TenantHeader}, {"flow.deadline_header", f.DeadlineHeader}} {
		if h.v != "" && !headerName.MatchString(h.v) {
			v.add(h.key, "%q is not an HTTP header name", h.v)
		}
	}
	v.intRange("flow.reserve_priority", int64(f.ReservePriority), MinPriority, MaxPriority)
	v.intAtLeast("flow.reserve_slots", int64(f.ReserveSlots), 0)
	v.positive("flow.reserve_window_secs", f.ReserveWindowSecs)
	v.intRange("flow.return_credit", int64(f.ReturnCredit), 0, MaxReturnCredit)
	if f.LearnConcurrency {
		if !strings.HasPrefix(f.MetricsEndpoint, "/") {
			v.add("flow.metrics_endpoint", "must be a path starting with /, got %q", f.MetricsEndpoint)
		}
		v.positive("flow.metrics_interval_secs", f.MetricsIntervalSecs)
	}
	v.intAtLeast("flow.retry_after_secs", int64(f.RetryAfterSecs), 1)
}

// headerName is an HTTP field name (RFC 9110 token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// raftAuth checks the Raft secret's settings against the role: only
// control-plane nodes may hold it (a data plane holding it could act as a
// Raft peer, the very thing it is for), and the transition setting needs
// both the secret it moves to and the one it moves from.
func (v *validator) raftAuth(role Role) {
	a := v.c.Auth
	set := a.RaftToken != "" || a.RaftTokenFile != ""
	if set && role != RoleControlPlane {
		key := "auth.raft_token"
		if a.RaftTokenFile != "" {
			key = "auth.raft_token_file"
		}
		what := "a data plane must never hold it (it would make the data plane a Raft peer)"
		if role == RoleAllInOne {
			what = "the all-in-one router runs no Raft"
		}
		v.add(key, "is for control-plane nodes only: %s; remove it", what)
	}
	if !a.RaftAcceptClusterToken {
		return
	}
	switch {
	case role != RoleControlPlane:
		v.add("auth.raft_accept_cluster_token", "is for control-plane nodes only; remove it")
	case !set:
		v.add("auth.raft_accept_cluster_token", "needs auth.raft_token_file: it is the transition to the Raft token, during which a node accepts both")
	case a.Token == "" && a.TokenFile == "":
		v.add("auth.raft_accept_cluster_token", "needs auth.token or auth.token_file: there is no cluster token to accept")
	}
}

// secret resolves an inline-or-file secret, reporting an unreadable or
// empty file against fileKey, so `--config-check` catches a missing secret
// mount before the process starts without it.
func (v *validator) secret(fileKey, inline, file string) string {
	s, err := resolveToken(inline, file, fileKey)
	if err != nil {
		v.add(fileKey, "%v", strings.TrimPrefix(err.Error(), fileKey+": "))
		return ""
	}
	return s
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

func (v *validator) controlPlane(role Role) {
	cp := v.c.ControlPlane
	if cp.NodeID == "" {
		if role == RoleControlPlane {
			v.add("controlplane.node_id", "is required for the control plane: it names this node in the Raft cluster and must not change across restarts")
		}
	} else if !idPattern.MatchString(cp.NodeID) {
		v.add("controlplane.node_id", "may only contain letters, digits, '.', '_' and '-', got %q", cp.NodeID)
	}
	if cp.DataDir == "" && role == RoleControlPlane {
		v.add("controlplane.data_dir", "is required for the control plane: the Raft log and snapshots are kept there")
	}
	v.oneOf("controlplane.log_store", cp.LogStore, "auto", "wal", "bolt")
	apiOK := v.hostPort("controlplane.api_addr", cp.APIAddr)
	raftOK := v.hostPort("controlplane.raft_addr", cp.RaftAddr)
	if cp.AdvertiseRaftAddr != "" {
		if v.hostPort("controlplane.advertise_raft_addr", cp.AdvertiseRaftAddr) && unspecifiedHost(cp.AdvertiseRaftAddr) {
			v.add("controlplane.advertise_raft_addr", "must name an address peers can dial, got %q", cp.AdvertiseRaftAddr)
		}
	} else if raftOK && role == RoleControlPlane && unspecifiedHost(cp.RaftAddr) {
		v.add("controlplane.advertise_raft_addr", "is required when raft_addr (%q) binds to all interfaces: peers cannot dial that address", cp.RaftAddr)
	}
	if cp.AdvertiseAPIURL != "" {
		v.url("controlplane.advertise_api_url", cp.AdvertiseAPIURL)
	} else if apiOK && role == RoleControlPlane && unspecifiedHost(cp.APIAddr) {
		v.add("controlplane.advertise_api_url", "is required when api_addr (%q) binds to all interfaces: other nodes cannot reach that address", cp.APIAddr)
	}
	if cp.Bootstrap && len(cp.Join) > 0 {
		v.add("controlplane.join", "must be empty when controlplane.bootstrap is true: a node either starts a new cluster or joins an existing one")
	}
	for i, j := range cp.Join {
		v.url(fmt.Sprintf("controlplane.join[%d]", i), j)
	}
	v.intAtLeast("controlplane.placement_batch_ms", int64(cp.PlacementBatchMs), 1)
	v.intAtLeast("controlplane.placement_batch_max", int64(cp.PlacementBatchMax), 1)
	v.positive("controlplane.load_lease_secs", cp.LoadLeaseSecs)
	v.intRange("controlplane.max_unsettled_tickets", int64(cp.MaxUnsettledTickets), 1, 1<<24)
	v.positive("controlplane.api_body_read_timeout_secs", cp.APIBodyReadTimeoutSecs)
	v.intRange("controlplane.heartbeat_timeout_ms", int64(cp.HeartbeatTimeoutMs), 50, 60000)
	v.intRange("controlplane.election_timeout_ms", int64(cp.ElectionTimeoutMs), 50, 60000)
	v.intRange("controlplane.leader_lease_timeout_ms", int64(cp.LeaderLeaseTimeoutMs), 25, 60000)
	if cp.LeaderLeaseTimeoutMs > cp.HeartbeatTimeoutMs {
		v.add("controlplane.leader_lease_timeout_ms", "must not exceed heartbeat_timeout_ms (%d)", cp.HeartbeatTimeoutMs)
	}
	if cp.SnapshotThreshold < 1 {
		v.add("controlplane.snapshot_threshold", "must be at least 1, got 0")
	}
	h := cp.SlowLeaderHandover
	v.intRange("controlplane.slow_leader_handover.threshold_ms", int64(h.ThresholdMs), 1, 60000)
	if v.finite("controlplane.slow_leader_handover.window_secs", h.WindowSecs) && (h.WindowSecs < 1 || h.WindowSecs > 3600) {
		// Below a second a window holds too few sync reports to tell a
		// slow leader from one slow moment.
		v.add("controlplane.slow_leader_handover.window_secs", "must be between 1 and 3600, got %v", h.WindowSecs)
	}
	if v.finite("controlplane.slow_leader_handover.min_interval_secs", h.MinIntervalSecs) && (h.MinIntervalSecs < h.WindowSecs || h.MinIntervalSecs > 86400) {
		v.add("controlplane.slow_leader_handover.min_interval_secs", "must be between window_secs (%v) and 86400, got %v", h.WindowSecs, h.MinIntervalSecs)
	}
	v.tls("controlplane.raft_tls", cp.RaftTLS)
	v.intRange("controlplane.raft_handshake_timeout_ms", int64(cp.RaftHandshakeTimeoutMs), 100, 60000)
	// Each peer holds a few pooled connections plus a pipeline: 16 leaves
	// room for a five-node cluster; fewer would starve replication.
	v.intRange("controlplane.raft_max_conns", int64(cp.RaftMaxConns), 16, 65536)
	if role == RoleControlPlane && raftOK && !cp.AllowUnauthenticatedRaft && !v.c.RaftPeerAuthenticated() {
		for _, a := range []string{cp.RaftAddr, cp.AdvertiseRaftAddr} {
			if a != "" && !LoopbackHostPort(a) {
				v.add("controlplane.raft_addr", "%q is reachable beyond loopback but Raft peers are not authenticated: anyone who reaches it could join the cluster and rewrite the worker set; set auth.raft_token_file (peer handshake; the cluster token, which data planes hold, no longer authenticates Raft peers), or controlplane.raft_tls with client_ca_file (mutual TLS), or controlplane.allow_unauthenticated_raft: true on a network you trust", a)
				break
			}
		}
	}
}

// RaftPeerAuthenticated reports whether Raft peers must authenticate: a
// Raft token (the peer handshake) or mutual TLS on the Raft transport. The
// cluster token does not count: every data plane holds it.
func (c *Config) RaftPeerAuthenticated() bool {
	t := c.ControlPlane.RaftTLS
	return c.Auth.RaftToken != "" || c.Auth.RaftTokenFile != "" || (t.CertFile != "" && t.ClientCAFile != "")
}

// LoopbackHostPort reports whether host:port names a loopback address
// ("localhost" or a loopback IP). A wildcard or any other name is not.
func LoopbackHostPort(addr string) bool {
	return hostIs(addr, "localhost", net.IP.IsLoopback)
}

// unspecifiedHost reports whether a host:port binds to all interfaces
// (empty host, 0.0.0.0 or ::), which is fine to listen on but not to
// advertise.
func unspecifiedHost(addr string) bool {
	return hostIs(addr, "", net.IP.IsUnspecified)
}

// hostIs reports whether the host of host:port is name, or an IP for which
// ipIs holds.
func hostIs(addr, name string, ipIs func(net.IP) bool) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == name {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ipIs(ip)
}

func (v *validator) dataPlane(role Role) {
	dp := v.c.DataPlane
	if dp.ID != "" && !idPattern.MatchString(dp.ID) {
		v.add("dataplane.id", "may only contain letters, digits, '.', '_' and '-', got %q", dp.ID)
	}
	if len(dp.ControlPlane) == 0 && role == RoleDataPlane {
		v.add("dataplane.control_plane", "at least one control plane URL is required: the data plane asks the control plane where to route each request; add dataplane.control_plane[] (e.g. http://cp-1.internal:6701)")
	}
	for i, u := range dp.ControlPlane {
		v.url(fmt.Sprintf("dataplane.control_plane[%d]", i), u)
	}
	v.intAtLeast("dataplane.route_timeout_ms", int64(dp.RouteTimeoutMs), 1)
	v.intRange("dataplane.report_interval_ms", int64(dp.ReportIntervalMs), 1, 10000)
	v.intAtLeast("dataplane.worker_sync_interval_ms", int64(dp.WorkerSyncIntervalMs), 50)
	v.intRange("dataplane.route_breaker_failures", int64(dp.RouteBreakerFailures), 0, 1000)
	v.intRange("dataplane.route_breaker_cooloff_ms", int64(dp.RouteBreakerCooloffMs), 1, 600000)
	v.intRange("dataplane.route_stream_max_in_flight", int64(dp.RouteStreamMaxInFlight), 1, 256)
	v.keyPair("dataplane.tls", dp.ClientTLS.CertFile, dp.ClientTLS.KeyFile)
}

func (v *validator) discovery(role Role) {
	d := v.c.Discovery
	v.positive("discovery.drain_timeout_secs", d.DrainTimeoutSecs)
	if len(d.AllowedNetworks) > 0 && role == RoleDataPlane {
		v.add("discovery.allowed_networks", "a data plane does not discover workers: set discovery on the control plane (its leader runs it)")
	}
	for i, n := range d.AllowedNetworks {
		if _, err := ParseNetworks([]string{n}); err != nil {
			v.add(fmt.Sprintf("discovery.allowed_networks[%d]", i), "%v", err)
		}
	}
	v.discoveryKubernetes(role)
	n := d.DNS
	if !n.Enabled() {
		return
	}
	if role == RoleDataPlane {
		v.add("discovery.dns.name", "a data plane does not discover workers: set discovery on the control plane (its leader runs it)")
	}
	names := map[string]string{}
	for _, kv := range [][2]string{{"name", n.Name}, {"prefill_name", n.PrefillName}, {"decode_name", n.DecodeName}} {
		if kv[1] == "" {
			continue
		}
		if other, dup := names[kv[1]]; dup {
			v.add("discovery.dns."+kv[0], "%q is also discovery.dns.%s: one name per role", kv[1], other)
		}
		names[kv[1]] = kv[0]
	}
	switch n.RecordType {
	case "A":
		v.intRange("discovery.dns.port", int64(n.Port), 1, 65535)
	case "SRV":
		if n.Port != 0 {
			v.add("discovery.dns.port", "must be 0 with record_type SRV (the port comes from each SRV record), got %d", n.Port)
		}
	default:
		v.add("discovery.dns.record_type", "must be A (A and AAAA records) or SRV, got %q", n.RecordType)
	}
	if n.Scheme != "http" && n.Scheme != "https" {
		v.add("discovery.dns.scheme", "must be http or https, got %q", n.Scheme)
	}
	if n.Resolver != "" {
		if _, port, err := net.SplitHostPort(n.Resolver); err != nil || port == "" {
			v.add("discovery.dns.resolver", "must be host:port (e.g. 127.0.0.1:53), got %q", n.Resolver)
		}
	}
	v.positive("discovery.dns.timeout_secs", n.TimeoutSecs)
	v.sourceRules("discovery.dns", n.MinIntervalSecs, n.MaxIntervalSecs, n.AddAfter, n.RemoveAfter, n.MaxLoad, n.LoadPenalty, n.CacheCapacityTokens)
}

// sourceRules checks what every discovery source shares: its re-read
// interval, its damping and the settings of the workers it discovers.
func (v *validator) sourceRules(prefix string, minSecs, maxSecs float64, addAfter, removeAfter, maxLoad, penalty int, capTokens int64) {
	v.positive(prefix+".min_interval_secs", minSecs)
	v.positive(prefix+".max_interval_secs", maxSecs)
	if maxSecs < minSecs {
		v.add(prefix+".max_interval_secs", "must be at least min_interval_secs (%v), got %v", minSecs, maxSecs)
	}
	v.intRange(prefix+".add_after", int64(addAfter), 1, 1000)
	v.intRange(prefix+".remove_after", int64(removeAfter), 1, 1000)
	v.intAtLeast(prefix+".max_load", int64(maxLoad), 0)
	v.intAtLeast(prefix+".load_penalty", int64(penalty), 0)
	v.intAtLeast(prefix+".cache_capacity_tokens", capTokens, 0)
}

// kvEvents checks workers[].kv_events and kv_events.*: endpoints ZMQ can
// use, one topic per engine on the listen endpoint, and only in the roles
// that consume them (the all-in-one router, the control-plane leader).
func (v *validator) kvEvents(role Role) {
	k := v.c.KVEvents
	v.intAtLeast("kv_events.replay_timeout_ms", int64(k.ReplayTimeoutMs), 1)
	// A batch is one engine step's events; below 64 KiB real ones are cut.
	v.intRange("kv_events.max_message_bytes", k.MaxMessageBytes, 64<<10, 1<<30)
	v.intRange("kv_events.max_publisher_connections", int64(k.MaxPublisherConnections), 1, 65536)
	v.intAtLeast("kv_events.max_hashes_per_rank", int64(k.MaxHashesPerRank), 1)
	if _, err := k.Publishers(); err != nil {
		v.add("kv_events.allowed_publishers", "%v", err)
	}
	if mode, err := k.SocketMode(); err != nil {
		v.add("kv_events.ipc_socket_mode", "%v", err)
	} else if mode&0o007 != 0 {
		v.add("kv_events.ipc_socket_mode", "%q lets every local user connect and publish events; grant a group (e.g. 0660) instead", k.IPCSocketMode)
	}
	if k.Listen != "" {
		if err := kvevents.CheckEndpoint(k.Listen); err != nil {
			v.add("kv_events.listen", "%v", err)
		} else if !k.AllowUnauthenticatedListen && len(k.AllowedPublishers) == 0 && !loopbackEndpoint(k.Listen) {
			v.add("kv_events.listen", "%q accepts KV events from anyone who reaches it (ZMQ carries no credentials, and a forged cache reset empties a worker's holdings): bind 127.0.0.1 or ipc://, list the engines' addresses in kv_events.allowed_publishers, or set kv_events.allow_unauthenticated_listen and restrict the port (NetworkPolicy, firewall)", k.Listen)
		} else if len(k.AllowedPublishers) > 0 && strings.HasPrefix(k.Listen, "ipc://") {
			v.add("kv_events.allowed_publishers", "source addresses do not apply to an ipc:// listen socket: its file mode (kv_events.ipc_socket_mode) decides who connects")
		}
	} else if len(k.AllowedPublishers) > 0 {
		v.add("kv_events.allowed_publishers", "applies to kv_events.listen, which is not set (CART dials engines otherwise)")
	}
	used := k.Listen != ""
	topics := map[string]int{}
	for i, w := range v.c.Workers {
		key := fmt.Sprintf("workers[%d].kv_events", i)
		e := w.KVEvents
		if !e.On() {
			if e.ReplayEndpoint != "" || e.DataParallelSize != 0 {
				v.add(key, "set endpoint (CART dials the engine) or topic (the engine dials kv_events.listen)")
			}
			continue
		}
		used = true
		v.intAtLeast(key+".data_parallel_size", int64(e.DataParallelSize), 0)
		for _, f := range []struct{ name, ep string }{{"endpoint", e.Endpoint}, {"replay_endpoint", e.ReplayEndpoint}} {
			if f.ep == "" {
				continue
			}
			if err := kvevents.CheckEndpoint(f.ep); err != nil {
				v.add(key+"."+f.name, "%v", err)
			} else if _, err := kvevents.OffsetPort(f.ep, max(e.DataParallelSize, 1)-1); err != nil {
				v.add(key+"."+f.name, "%v", err)
			}
		}
		if e.Endpoint == "" {
			if k.Listen == "" {
				v.add(key+".topic", "an engine without an endpoint dials kv_events.listen, which is not set")
			}
			if first, dup := topics[e.Topic]; dup {
				v.add(key+".topic", "topic %q already names workers[%d] on kv_events.listen", e.Topic, first)
			}
			topics[e.Topic] = i
		}
	}
	if used && role == RoleDataPlane {
		v.add("kv_events", "KV events are consumed by the control-plane leader, never by a data plane: move kv_events to the control-plane nodes' config")
	}
}

func (v *validator) tracing() {
	t := v.c.Tracing
	v.fraction("tracing.sample_ratio", t.SampleRatio)
	if !t.Enabled() {
		if t.CAFile != "" {
			v.add("tracing.ca_file", "is set but tracing.otlp_endpoint is not: tracing is off")
		}
		return
	}
	u, err := url.Parse(t.OTLPEndpoint)
	switch {
	case err != nil:
		v.add("tracing.otlp_endpoint", "%q is not a valid URL: %v", t.OTLPEndpoint, err)
		return
	case u.Scheme != "http" && u.Scheme != "https":
		v.add("tracing.otlp_endpoint", "%q must start with http:// or https:// (OTLP/HTTP, e.g. http://otel-collector:4318)", t.OTLPEndpoint)
		return
	case u.Opaque != "" || u.Hostname() == "":
		v.add("tracing.otlp_endpoint", "%q has no host", t.OTLPEndpoint)
		return
	case u.User != nil:
		v.add("tracing.otlp_endpoint", "%q must not contain credentials (they would be printed by --config-check); use OTEL_EXPORTER_OTLP_HEADERS", t.OTLPEndpoint)
		return
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		v.add("tracing.otlp_endpoint", "%q must not have a query or fragment", t.OTLPEndpoint)
		return
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			v.add("tracing.otlp_endpoint", "%q has an invalid port", t.OTLPEndpoint)
		}
	}
	if t.CAFile != "" && u.Scheme != "https" {
		v.add("tracing.ca_file", "is set but tracing.otlp_endpoint %q is plaintext http://: use https:// or drop ca_file", t.OTLPEndpoint)
	}
}

func (v *validator) discoveryKubernetes(role Role) {
	k := v.c.Discovery.Kubernetes
	if !k.Enabled {
		for _, kv := range [][2]string{{"service", k.Service}, {"selector", k.Selector}, {"inference_pool", k.InferencePool}, {"namespace", k.Namespace}, {"port", k.Port}, {"kubeconfig", k.Kubeconfig}} {
			if kv[1] != "" {
				v.add("discovery.kubernetes."+kv[0], "is set but discovery.kubernetes.enabled is false: set enabled: true, or remove it")
			}
		}
		return
	}
	if role == RoleDataPlane {
		v.add("discovery.kubernetes.enabled", "a data plane does not discover workers: set discovery on the control plane (its leader runs it)")
	}
	switch {
	case k.InferencePool != "" && (k.Service != "" || k.Selector != ""):
		v.add("discovery.kubernetes.inference_pool", "service or selector is set too: watch one InferencePool, one Service's EndpointSlices or pods by label")
	case k.InferencePool != "":
		if errs := validation.IsDNS1123Subdomain(k.InferencePool); len(errs) > 0 {
			v.add("discovery.kubernetes.inference_pool", "not an InferencePool name: %s", strings.Join(errs, "; "))
		}
	case k.Service != "" && k.Selector != "":
		v.add("discovery.kubernetes.selector", "service and selector are both set: watch one Service's EndpointSlices or pods by label, not both")
	case k.Service == "" && k.Selector == "":
		v.add("discovery.kubernetes.service", "set service (a Service's EndpointSlices), selector (pods by label) or inference_pool when enabled")
	case k.Service != "":
		if errs := validation.IsDNS1035Label(k.Service); len(errs) > 0 {
			v.add("discovery.kubernetes.service", "not a Service name: %s", strings.Join(errs, "; "))
		}
	default:
		if sel, err := labels.Parse(k.Selector); err != nil {
			v.add("discovery.kubernetes.selector", "not a label selector: %v", err)
		} else if sel.Empty() {
			v.add("discovery.kubernetes.selector", "%q selects every pod of the namespace; name a label (e.g. app=vllm)", k.Selector)
		}
	}
	if k.Namespace != "" {
		if errs := validation.IsDNS1123Label(k.Namespace); len(errs) > 0 {
			v.add("discovery.kubernetes.namespace", "not a namespace name: %s", strings.Join(errs, "; "))
		}
	}
	if k.InferencePool != "" {
		if k.Port != "" {
			v.add("discovery.kubernetes.port", "must be empty with inference_pool: the pool's targetPorts are the ports")
		}
	} else if err := checkPort(k.Port); err != nil {
		v.add("discovery.kubernetes.port", "%v", err)
	}
	if k.Scheme != "http" && k.Scheme != "https" {
		v.add("discovery.kubernetes.scheme", "must be http or https, got %q", k.Scheme)
	}
	if k.Kubeconfig != "" {
		if _, err := os.Stat(k.Kubeconfig); err != nil {
			v.add("discovery.kubernetes.kubeconfig", "%v", err)
		}
	}
	if k.RoleLabel != "" {
		if errs := validation.IsQualifiedName(k.RoleLabel); len(errs) > 0 {
			v.add("discovery.kubernetes.role_label", "not a label key: %s", strings.Join(errs, "; "))
		} else if k.Service != "" {
			v.add("discovery.kubernetes.role_label", "needs selector (pods by label): a Service's EndpointSlices do not carry the pods' labels")
		}
	}
	v.positive("discovery.kubernetes.sync_timeout_secs", k.SyncTimeoutSecs)
	v.sourceRules("discovery.kubernetes", k.MinIntervalSecs, k.MaxIntervalSecs, k.AddAfter, k.RemoveAfter, k.MaxLoad, k.LoadPenalty, k.CacheCapacityTokens)
}

// checkPort accepts a port number (1..65535) or a port name as Services
// and containers name them (IANA service name).
func checkPort(p string) error {
	if p == "" {
		return errors.New("required: the port name (e.g. http) or number of the workers")
	}
	if p[0] >= '0' && p[0] <= '9' {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("a port number must be 1..65535, got %q", p)
		}
		return nil
	}
	if errs := validation.IsValidPortName(p); len(errs) > 0 {
		return fmt.Errorf("not a port name or number: %s", strings.Join(errs, "; "))
	}
	return nil
}

// loopbackEndpoint reports whether a ZMQ endpoint is reachable only from
// this host: ipc://, or tcp:// on a loopback address.
func loopbackEndpoint(ep string) bool {
	if strings.HasPrefix(ep, "ipc://") {
		return true
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// disaggregationEndpoints are the endpoint names disaggregation.endpoints
// may list (dataplane/extract's table; config imports none of ours).
var disaggregationEndpoints = []string{"chat_completions", "completions", "messages", "responses"}

func (v *validator) disaggregation(role Role) {
	d := v.c.Disaggregation
	v.oneOf("disaggregation.mode", d.Mode, "vllm", "sidecar")
	v.intAtLeast("disaggregation.threshold_tokens", int64(d.ThresholdTokens), 0)
	if d.ThresholdTokens != 0 && role == RoleDataPlane {
		v.add("disaggregation.threshold_tokens", "a data plane does not decide routes: set it on the control plane, whose leader applies it")
	}
	seen := map[string]bool{}
	for i, e := range d.Endpoints {
		key := fmt.Sprintf("disaggregation.endpoints[%d]", i)
		switch {
		case !slices.Contains(disaggregationEndpoints, e):
			v.add(key, "must be one of %s, got %q", strings.Join(disaggregationEndpoints, ", "), e)
		case seen[e]:
			v.add(key, "duplicate endpoint %q", e)
		}
		seen[e] = true
	}
}
