package config

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestOrigin(t *testing.T) {
	paths := writeFiles(t,
		"server:\n  port: 1000\ncache:\n  threshold: 0.5\nworkers:\n  - url: http://a:1\n  - url: http://b:1\n",
		"# overlay\nserver:\n  port: 2000\nworkers:\n  - url: http://c:1\n    max_load: 2\n",
	)
	c, err := Load(paths...)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		file string
		line int
	}{
		{"server.port", paths[1], 3},
		{"server", paths[1], 2},
		{"cache.threshold", paths[0], 4},
		{"cache", paths[0], 3},
		{"workers", paths[1], 4},
		{"workers[0]", paths[1], 5},
		{"workers[0].url", paths[1], 5},
		{"workers[0].max_load", paths[1], 6},
		// The overlay replaced the list, so the base's second item is gone.
		{"workers[1].url", "", 0},
		{"log.level", "", 0},
		{"no.such.key", "", 0},
	}
	for _, tt := range tests {
		file, line := c.Origin(tt.key)
		if file != tt.file || line != tt.line {
			t.Errorf("Origin(%q) = %q, %d; want %q, %d", tt.key, file, line, tt.file, tt.line)
		}
	}
	if file, line := Default().Origin("server.port"); file != "" || line != 0 {
		t.Errorf("Default().Origin = %q, %d", file, line)
	}
}

func TestDiffKeys(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string
	}{
		{"identical", func(c *Config) {}, nil},
		{"workers compared as a whole", func(c *Config) { c.Workers[1].MaxLoad = 9 }, []string{"workers"}},
		{"worker added", func(c *Config) { c.Workers = append(c.Workers, Worker{URL: "http://c:1"}) }, []string{"workers"}},
		{"leaf keys in schema order", func(c *Config) {
			c.Log.Level = "debug"
			c.Server.Port = 1
			c.Cache.Threshold = 0.9
		}, []string{"server.port", "cache.threshold", "log.level"}},
		{"nested mapping leaf", func(c *Config) { c.ControlPlane.RaftTLS.KeyFile = "k" }, []string{"controlplane.raft_tls.key_file"}},
		{"scalar list", func(c *Config) { c.Proxy.RetryableStatuses = []int{503} }, []string{"proxy.retryable_statuses"}},
		{"nil and empty list are equal", func(c *Config) { c.DataPlane.ControlPlane = []string{} }, nil},
		{"bool", func(c *Config) { c.CircuitBreaker.Enabled = false }, []string{"circuit_breaker.enabled"}},
		{"secret", func(c *Config) { c.Auth.Token = "x" }, []string{"auth.token"}},
	}
	base := func() *Config {
		c := Default()
		c.Workers = []Worker{{URL: "http://a:1"}, {URL: "http://b:1"}}
		return c
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := base()
			tt.mutate(b)
			if got := DiffKeys(base(), b); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DiffKeys = %v, want %v", got, tt.want)
			}
			if got := DiffKeys(b, base()); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DiffKeys reversed = %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("NaN equals NaN", func(t *testing.T) {
		a, b := Default(), Default()
		a.Cache.Threshold, b.Cache.Threshold = math.NaN(), math.NaN()
		if got := DiffKeys(a, b); got != nil {
			t.Errorf("DiffKeys = %v", got)
		}
	})
	t.Run("nil is Default", func(t *testing.T) {
		if got := DiffKeys(nil, Default()); got != nil {
			t.Errorf("DiffKeys = %v", got)
		}
	})
	t.Run("origins are ignored", func(t *testing.T) {
		c := mustLoad(t, "server:\n  port: 6700\n")
		if got := DiffKeys(Default(), c); got != nil {
			t.Errorf("DiffKeys = %v", got)
		}
	})
}

func TestYAMLRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		files []string
	}{
		{"defaults", nil},
		{"example", []string{readExample(t)}},
		{"non-defaults everywhere", []string{`
server: {host: "::1", port: 7000, tls: {cert_file: "a b.pem", key_file: "k.pem"}}
workers:
  - {url: "http://a:1/v1", max_load: 8, load_penalty: 2, cache_capacity_tokens: 123456789012}
  - url: https://b
cache: {threshold: 0.125, ttl_secs: 1e-3, daily_cleanup_hour_utc: 3, capacity_tokens: 9007199254740993}
health: {endpoint: "/v1/health?deep: true", interval_secs: 0.5, timeout_secs: 0.25}
proxy: {retryable_statuses: [], jitter_factor: 0, remote_media_url_policy: 451}
session: {enabled: true, keys: ["header:X-Conv", "user"]}
log: {level: "debug", format: text}
auth: {token_file: "/run/secrets/token", allow_unauthenticated_remote: true}
controlplane: {node_id: "n1", join: ["http://x:1", "http://y:1"], snapshot_threshold: 18446744073709551615}
dataplane: {id: "yes", control_plane: ["http://x:1"], tls: {server_name: "null"}}
`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, tt.files...)
			out, err := c.YAML()
			if err != nil {
				t.Fatal(err)
			}
			back := mustLoad(t, string(out))
			if d := DiffKeys(c, back); d != nil {
				t.Errorf("keys changed by YAML round trip: %v\n%s", d, out)
			}
		})
	}
}

func TestYAMLRedactsTokens(t *testing.T) {
	c := validBase()
	c.Auth.Token = "s3cret-data"
	c.Auth.AdminToken = "s3cret-admin"
	c.Auth.RaftToken = "s3cret-raft"
	c.Auth.TokenFile = "/run/secrets/unused"
	c.Auth.ClientKeys = []ClientKey{{Name: "a", Key: "s3cret-client"}, {Name: "b", KeyFile: "/run/secrets/b"}}
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "s3cret") {
		t.Errorf("rendered YAML leaks a token:\n%s", s)
	}
	if strings.Count(s, Redacted) != 4 {
		t.Errorf("want four %q markers:\n%s", Redacted, s)
	}
	if !strings.Contains(s, "/run/secrets/unused") {
		t.Errorf("token file path should be shown:\n%s", s)
	}
	if c.Auth.Token != "s3cret-data" || c.Auth.ClientKeys[0].Key != "s3cret-client" {
		t.Errorf("YAML() modified the config")
	}
	back := mustLoad(t, s)
	if d := DiffKeys(c, back); !reflect.DeepEqual(d, []string{"auth.token", "auth.admin_token", "auth.raft_token", "auth.client_keys"}) {
		t.Errorf("DiffKeys after round trip = %v", d)
	}

	// Empty tokens stay empty rather than claiming a secret exists.
	out, err = Default().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), Redacted) {
		t.Errorf("empty token rendered as redacted:\n%s", out)
	}
}

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	data := write("data", "  tok-data\n")
	admin := write("admin", "tok-admin\r\n")
	empty := write("empty", " \n")
	tests := []struct {
		name                string
		auth                Auth
		wantData, wantAdmin string
		wantErr             string
	}{
		{name: "none"},
		{name: "inline", auth: Auth{Token: "a", AdminToken: "b"}, wantData: "a", wantAdmin: "b"},
		{name: "files trimmed", auth: Auth{TokenFile: data, AdminTokenFile: admin}, wantData: "tok-data", wantAdmin: "tok-admin"},
		{name: "empty file", auth: Auth{TokenFile: empty}, wantErr: "is empty"},
		{name: "missing file", auth: Auth{AdminTokenFile: filepath.Join(dir, "nope")}, wantErr: "auth.admin_token_file: reading token"},
		{name: "both", auth: Auth{Token: "a", TokenFile: data}, wantErr: "cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Auth = tt.auth
			d, a, err := c.Tokens()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || d != tt.wantData || a != tt.wantAdmin {
				t.Errorf("Tokens() = %q, %q, %v; want %q, %q", d, a, err, tt.wantData, tt.wantAdmin)
			}
		})
	}
}

func TestDurations(t *testing.T) {
	c := Default()
	tests := []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"health interval", c.Health.Interval(), 10 * time.Second},
		{"health timeout", c.Health.Timeout(), 5 * time.Second},
		{"read header timeout", c.Server.ReadHeaderTimeout(), 10 * time.Second},
		{"idle timeout", c.Server.IdleTimeout(), 120 * time.Second},
		{"shutdown grace", c.Server.ShutdownGrace(), 30 * time.Second},
		{"eviction interval", c.Cache.EvictionInterval(), time.Minute},
		{"cache ttl disabled", c.Cache.TTL(), 0},
		{"connect timeout", c.Proxy.ConnectTimeout(), 2 * time.Second},
		{"request timeout", c.Proxy.RequestTimeout(), 10 * time.Minute},
		{"stream idle", c.Proxy.StreamIdleTimeout(), 2 * time.Minute},
		{"initial backoff", c.Proxy.InitialBackoff(), 50 * time.Millisecond},
		{"max backoff", c.Proxy.MaxBackoff(), 2 * time.Second},
		{"models cache", c.Proxy.ModelsCacheTTL(), 10 * time.Minute},
		{"breaker timeout", c.CircuitBreaker.Timeout(), 30 * time.Second},
		{"session ttl", c.Session.TTL(), 30 * time.Minute},
		{"placement batch", c.ControlPlane.PlacementBatch(), 50 * time.Millisecond},
		{"load lease", c.ControlPlane.LoadLease(), 5 * time.Second},
		{"handover threshold", c.ControlPlane.SlowLeaderHandover.Threshold(), 15 * time.Millisecond},
		{"handover window", c.ControlPlane.SlowLeaderHandover.Window(), 3 * time.Second},
		{"handover interval", c.ControlPlane.SlowLeaderHandover.MinInterval(), time.Minute},
		{"route timeout", c.DataPlane.RouteTimeout(), 20 * time.Millisecond},
		{"report interval", c.DataPlane.ReportInterval(), 10 * time.Millisecond},
		{"worker sync", c.DataPlane.WorkerSyncInterval(), 500 * time.Millisecond},
		{"route breaker cooloff", c.DataPlane.RouteBreakerCooloff(), time.Second},
		{"fractional seconds", Health{IntervalSecs: 0.25}.Interval(), 250 * time.Millisecond},
		{"huge seconds saturate", Cache{TTLSecs: 1e300}.TTL(), time.Duration(math.MaxInt64)},
		{"huge millis saturate", Proxy{MaxBackoffMs: math.MaxInt}.MaxBackoff(), time.Duration(math.MaxInt64)},
		{"NaN is zero", Session{TTLSecs: math.NaN()}.TTL(), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestAddressHelpers(t *testing.T) {
	c := Default()
	if got := c.Server.Addr(); got != "0.0.0.0:6700" {
		t.Errorf("Server.Addr() = %q", got)
	}
	if got := (Server{Host: "::1", Port: 80}).Addr(); got != "[::1]:80" {
		t.Errorf("Server.Addr() = %q", got)
	}
	if got := c.ControlPlane.EffectiveAdvertiseRaftAddr(); got != "127.0.0.1:6702" {
		t.Errorf("EffectiveAdvertiseRaftAddr() = %q", got)
	}
	if got := c.ControlPlane.EffectiveAdvertiseAPIURL(); got != "http://127.0.0.1:6701" {
		t.Errorf("EffectiveAdvertiseAPIURL() = %q", got)
	}
	c.ControlPlane.AdvertiseRaftAddr = "cp:1"
	c.ControlPlane.AdvertiseAPIURL = "https://cp:2"
	if c.ControlPlane.EffectiveAdvertiseRaftAddr() != "cp:1" || c.ControlPlane.EffectiveAdvertiseAPIURL() != "https://cp:2" {
		t.Errorf("advertise overrides ignored: %+v", c.ControlPlane)
	}
}

func TestYAMLRoundTripAwkwardStrings(t *testing.T) {
	for _, s := range []string{
		"", "null", "~", "yes", "off", "0x10", "1e3", ".nan", "- x", "a: b", "#x", "!tag",
		" leading", "trailing ", "\t", "multi\nline", "multi\nline\n", "\n", "  \n ",
		"\u0085", "\u2028", "\ufeffbom", "\x00", "\x7f", "'\"", strings.Repeat("long ", 60),
	} {
		c := Default()
		c.Server.Host = s
		c.Log.Level = s
		c.Session.Keys = []string{s, s + "x"}
		out, err := c.YAML()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		back, err := Load(writeFiles(t, string(out))...)
		if err != nil {
			t.Errorf("%q: rendered YAML does not load: %v\n%s", s, err, out)
			continue
		}
		if d := DiffKeys(c, back); d != nil {
			t.Errorf("%q: round trip changed %v:\n%s", s, d, out)
		}
	}
}
