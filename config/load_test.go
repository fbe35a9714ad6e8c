package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// writeFiles writes each content to its own file in a fresh temp dir and
// returns the paths in order.
func writeFiles(t *testing.T, contents ...string) []string {
	t.Helper()
	dir := t.TempDir()
	paths := make([]string, len(contents))
	for i, c := range contents {
		paths[i] = filepath.Join(dir, "c"+string(rune('0'+i))+".yaml")
		if err := os.WriteFile(paths[i], []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return paths
}

func mustLoad(t *testing.T, contents ...string) *Config {
	t.Helper()
	c, err := Load(writeFiles(t, contents...)...)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func problemsOf(t *testing.T, err error) Problems {
	t.Helper()
	if err == nil {
		t.Fatal("expected an error, got nil")
	}
	var ps *Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error is %T, want *Problems: %v", err, err)
	}
	return *ps
}

func TestLoadLayering(t *testing.T) {
	tests := []struct {
		name  string
		files []string
		// diff is the exact set of keys expected to differ from Default().
		diff  []string
		check func(t *testing.T, c *Config)
	}{
		{
			name: "no files gives defaults",
		},
		{
			name: "mappings merge key by key",
			files: []string{
				"cache:\n  threshold: 0.5\n  block_chars: 32\n",
				"cache:\n  threshold: 0.7\n",
			},
			diff: []string{"cache.threshold", "cache.block_chars"},
			check: func(t *testing.T, c *Config) {
				if c.Cache.Threshold != 0.7 || c.Cache.BlockChars != 32 {
					t.Errorf("cache = %+v", c.Cache)
				}
			},
		},
		{
			name: "nested mappings merge key by key",
			files: []string{
				"server:\n  tls:\n    cert_file: a.pem\n",
				"server:\n  tls:\n    key_file: a.key\n",
			},
			diff: []string{"server.tls.cert_file", "server.tls.key_file"},
		},
		{
			name: "workers list replaced wholesale",
			files: []string{
				"workers:\n  - url: http://a:1\n    max_load: 4\n  - url: http://b:1\n",
				"workers:\n  - url: http://c:1\n",
			},
			diff: []string{"workers"},
			check: func(t *testing.T, c *Config) {
				want := []Worker{{URL: "http://c:1"}}
				if !reflect.DeepEqual(c.Workers, want) {
					t.Errorf("workers = %+v, want %+v", c.Workers, want)
				}
			},
		},
		{
			name: "scalar list replaced wholesale",
			files: []string{
				"proxy:\n  retryable_statuses: [503]\n",
			},
			diff: []string{"proxy.retryable_statuses"},
			check: func(t *testing.T, c *Config) {
				if !reflect.DeepEqual(c.Proxy.RetryableStatuses, []int{503}) {
					t.Errorf("statuses = %v", c.Proxy.RetryableStatuses)
				}
			},
		},
		{
			name:  "scalar replaced",
			files: []string{"server:\n  port: 1000\n", "server:\n  port: 2000\n"},
			diff:  []string{"server.port"},
			check: func(t *testing.T, c *Config) {
				if c.Server.Port != 2000 {
					t.Errorf("port = %d", c.Server.Port)
				}
			},
		},
		{
			name:  "empty file changes nothing",
			files: []string{"server:\n  port: 1000\n", ""},
			diff:  []string{"server.port"},
		},
		{
			name:  "comment-only file changes nothing",
			files: []string{"server:\n  port: 1000\n", "# nothing here\n   # still nothing\n"},
			diff:  []string{"server.port"},
		},
		{
			name:  "empty document marker changes nothing",
			files: []string{"server:\n  port: 1000\n", "---\n"},
			diff:  []string{"server.port"},
		},
		{
			name:  "null keeps earlier scalar",
			files: []string{"server:\n  port: 1000\n", "server:\n  port: null\n"},
			diff:  []string{"server.port"},
		},
		{
			name:  "null keeps earlier list",
			files: []string{"workers:\n  - url: http://a:1\n", "workers: ~\n"},
			diff:  []string{"workers"},
		},
		{
			name:  "null mapping keeps earlier mapping",
			files: []string{"log:\n  level: debug\n", "log:\n"},
			diff:  []string{"log.level"},
		},
		{
			name:  "null keeps default",
			files: []string{"cache:\n  threshold:\n"},
		},
		{
			name:  "empty list replaces list",
			files: []string{"session:\n  keys: [user]\n", "session:\n  keys: []\n"},
			diff:  []string{"session.keys"},
			check: func(t *testing.T, c *Config) {
				if len(c.Session.Keys) != 0 {
					t.Errorf("keys = %v", c.Session.Keys)
				}
			},
		},
		{
			name:  "worker URLs normalized",
			files: []string{"workers:\n  - url: http://a:1/\n  - url: https://b/v1//\n"},
			diff:  []string{"workers"},
			check: func(t *testing.T, c *Config) {
				if c.Workers[0].URL != "http://a:1" || c.Workers[1].URL != "https://b/v1" {
					t.Errorf("workers = %+v", c.Workers)
				}
			},
		},
		{
			name: "anchors and merge keys",
			files: []string{`
workers:
  - &base {url: "http://a:1", max_load: 3}
  - <<: *base
    url: http://b:1
`},
			diff: []string{"workers"},
			check: func(t *testing.T, c *Config) {
				want := []Worker{{URL: "http://a:1", MaxLoad: 3}, {URL: "http://b:1", MaxLoad: 3}}
				if !reflect.DeepEqual(c.Workers, want) {
					t.Errorf("workers = %+v, want %+v", c.Workers, want)
				}
			},
		},
		{
			name:  "exact float into int accepted",
			files: []string{"server:\n  port: 8.0e2\n"},
			diff:  []string{"server.port"},
			check: func(t *testing.T, c *Config) {
				if c.Server.Port != 800 {
					t.Errorf("port = %d", c.Server.Port)
				}
			},
		},
		{
			name:  "integer into float accepted",
			files: []string{"health:\n  interval_secs: 30\n"},
			diff:  []string{"health.interval_secs"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, tt.files...)
			if got := DiffKeys(Default(), c); !reflect.DeepEqual(got, tt.diff) {
				t.Errorf("keys differing from default = %v, want %v", got, tt.diff)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestLoadProblems(t *testing.T) {
	type want struct {
		file   int // index into files
		line   int // -1: any line; yaml.v3 places some syntax errors loosely
		key    string
		reason string // substring
	}
	tests := []struct {
		name  string
		files []string
		want  []want
	}{
		{
			name:  "unknown top-level key",
			files: []string{"servr:\n  port: 1\n"},
			want:  []want{{0, 1, "servr", `unknown key (did you mean "server"?)`}},
		},
		{
			name:  "unknown nested key",
			files: []string{"cache:\n  threshold: 0.5\n  treshold: 0.5\n"},
			want:  []want{{0, 3, "cache.treshold", `did you mean "threshold"`}},
		},
		{
			name:  "unknown key inside a workers item",
			files: []string{"workers:\n  - url: http://a:1\n  - url: http://b:1\n    maxload: 3\n"},
			want:  []want{{0, 4, "workers[1].maxload", `did you mean "max_load"`}},
		},
		{
			name:  "a removed key says so",
			files: []string{"server:\n  port: 1\n  own_http1_loop: true\n"},
			want:  []want{{0, 3, "server.own_http1_loop", "removed: CART serves every request with Go's net/http"}},
		},
		{
			name:  "unknown key without suggestion",
			files: []string{"log:\n  colour_scheme: dark\n"},
			want:  []want{{0, 2, "log.colour_scheme", "unknown key"}},
		},
		{
			name:  "unknown key in overlay reports overlay",
			files: []string{"server:\n  port: 1\n", "# overlay\nserver:\n  prot: 2\n"},
			want:  []want{{1, 3, "server.prot", "unknown key"}},
		},
		{
			name:  "isolate_cache is a boolean",
			files: []string{"auth:\n  client_keys:\n    - name: a\n      key: k\n      isolate_cache: sometimes\n"},
			want:  []want{{0, 5, "auth.client_keys[0].isolate_cache", `expected true or false, got "sometimes"`}},
		},
		{
			name:  "string where int expected",
			files: []string{"server:\n  port: abc\n"},
			want:  []want{{0, 2, "server.port", `expected an integer, got "abc"`}},
		},
		{
			name:  "fraction where int expected",
			files: []string{"server:\n  port: 80.5\n"},
			want:  []want{{0, 2, "server.port", `expected an integer, got "80.5"`}},
		},
		{
			name:  "negative where unsigned expected",
			files: []string{"controlplane:\n  snapshot_threshold: -1\n"},
			want:  []want{{0, 2, "controlplane.snapshot_threshold", "expected a non-negative integer"}},
		},
		{
			name:  "negative float where unsigned expected",
			files: []string{"controlplane:\n  trailing_logs: -1.0\n"},
			want:  []want{{0, 2, "controlplane.trailing_logs", "expected a non-negative integer"}},
		},
		{
			name:  "word where bool expected",
			files: []string{"session:\n  enabled: maybe\n"},
			want:  []want{{0, 2, "session.enabled", `expected true or false, got "maybe"`}},
		},
		{
			name:  "string where number expected",
			files: []string{"cache:\n  threshold: high\n"},
			want:  []want{{0, 2, "cache.threshold", "expected a number"}},
		},
		{
			name:  "mapping where string expected",
			files: []string{"log:\n  level:\n    x: 1\n"},
			want:  []want{{0, 3, "log.level", "expected a string, got a mapping"}},
		},
		{
			name:  "scalar where mapping expected",
			files: []string{"server: 8080\n"},
			want:  []want{{0, 1, "server", `expected a mapping, got "8080"`}},
		},
		{
			name:  "scalar where list expected",
			files: []string{"workers: http://a:1\n"},
			want:  []want{{0, 1, "workers", "expected a list"}},
		},
		{
			name:  "wrong type inside a list",
			files: []string{"proxy:\n  retryable_statuses:\n    - 500\n    - five hundred\n"},
			want:  []want{{0, 4, "proxy.retryable_statuses[1]", "expected an integer"}},
		},
		{
			name:  "empty list item",
			files: []string{"workers:\n  -\n  - url: http://a:1\n"},
			want:  []want{{0, 2, "workers[0]", "empty list item"}},
		},
		{
			name:  "top level is not a mapping",
			files: []string{"- server\n"},
			want:  []want{{0, 1, "", "expected a mapping, got a list"}},
		},
		{
			name:  "duplicate key",
			files: []string{"server:\n  port: 1\n  port: 2\n"},
			want:  []want{{0, 3, "server.port", "duplicate key (already set on line 2)"}},
		},
		{
			name:  "syntax error",
			files: []string{"server:\n  port: [1\n"},
			want:  []want{{0, -1, "", "invalid YAML"}},
		},
		{
			name:  "tab indentation",
			files: []string{"server:\n\tport: 1\n"},
			want:  []want{{0, 2, "", "invalid YAML"}},
		},
		{
			name:  "several documents",
			files: []string{"log:\n  level: info\n---\nlog:\n  level: debug\n"},
			want:  []want{{0, 3, "", "more than one YAML document"}},
		},
		{
			name:  "non-string mapping key",
			files: []string{"server:\n  ? [a]\n  : 1\n"},
			want:  []want{{0, 2, "server", "mapping keys must be plain strings"}},
		},
		{
			name:  "merge key into itself",
			files: []string{"server: &s\n  <<: *s\n"},
			want:  []want{{0, 2, "server", "nested too deeply"}},
		},
		{
			name: "problems from several files at once",
			files: []string{
				"servr: {}\ncache:\n  threshold: x\n",
				"log:\n  levle: debug\n",
			},
			want: []want{
				{0, 1, "servr", "unknown key"},
				{0, 3, "cache.threshold", "expected a number"},
				{1, 2, "log.levle", "unknown key"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			paths := writeFiles(t, tt.files...)
			c, err := Load(paths...)
			if c == nil {
				t.Errorf("Load returned no best-effort config alongside its error (--config-check validates it)")
			}
			ps := problemsOf(t, err)
			if len(ps) != len(tt.want) {
				t.Fatalf("got %d problems, want %d:\n%v", len(ps), len(tt.want), err)
			}
			for i, w := range tt.want {
				p := ps[i]
				lineOK := p.Line == w.line || (w.line == -1 && p.Line > 0)
				if p.File != paths[w.file] || !lineOK || p.Key != w.key || !strings.Contains(p.Reason, w.reason) {
					t.Errorf("problem %d = %s\nwant %s:%d: %s: …%s…", i, p, paths[w.file], w.line, w.key, w.reason)
				}
			}
			// Every line of the message must name the file it is about.
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, filepath.Dir(paths[0])) {
					t.Errorf("message line without file: %q", line)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path)
	ps := problemsOf(t, err)
	if len(ps) != 1 || ps[0].File != path || !strings.Contains(ps[0].Reason, "cannot read config file") {
		t.Fatalf("problems = %v", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(err, fs.ErrNotExist) = false for %v", err)
	}
}

func TestLoadExcessiveAliasing(t *testing.T) {
	// Each item merges the previous one twice, so expanding item n costs
	// 2^n steps: a "billion laughs" built only from valid keys.
	var b strings.Builder
	b.WriteString("workers:\n  - &m0 {url: \"http://a:1\"}\n")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b, "  - &m%d {<<: [*m%d, *m%d]}\n", i, i-1, i-1)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Load(writeFiles(t, b.String())...)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "too large after expanding aliases") {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Load did not stop expanding aliases")
	}
}

// An explicit 0 disables the control-plane breaker; unset keeps the default.
func TestRouteBreakerZeroDisables(t *testing.T) {
	if c := mustLoad(t, "dataplane:\n  route_timeout_ms: 20\n"); c.DataPlane.RouteBreakerFailures != 5 || c.DataPlane.RouteBreakerCooloffMs != 1000 {
		t.Fatalf("defaults: %d failures, %d ms", c.DataPlane.RouteBreakerFailures, c.DataPlane.RouteBreakerCooloffMs)
	}
	c := mustLoad(t, "workers:\n  - url: http://w1:8000\ndataplane:\n  route_breaker_failures: 0\n")
	if c.DataPlane.RouteBreakerFailures != 0 {
		t.Fatalf("route_breaker_failures: 0 loaded as %d", c.DataPlane.RouteBreakerFailures)
	}
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Fatalf("0 (disabled) refused: %v", err)
	}
}

// The Route stream is on by default, can be turned off, and its in-flight
// bound is checked.
func TestRouteStreamKeys(t *testing.T) {
	c := mustLoad(t, "dataplane:\n  route_timeout_ms: 20\n")
	if !c.DataPlane.RouteStream || c.DataPlane.RouteStreamMaxInFlight != 128 {
		t.Fatalf("defaults: route_stream %v, max in flight %d", c.DataPlane.RouteStream, c.DataPlane.RouteStreamMaxInFlight)
	}
	c = mustLoad(t, "workers:\n  - url: http://w1:8000\ndataplane:\n  route_stream: false\n  route_stream_max_in_flight: 257\n")
	if c.DataPlane.RouteStream {
		t.Fatal("route_stream: false loaded as true")
	}
	if err := c.Validate(RoleAllInOne); err == nil || !strings.Contains(err.Error(), "dataplane.route_stream_max_in_flight") {
		t.Fatalf("route_stream_max_in_flight 257: %v", err)
	}
	c.DataPlane.RouteStreamMaxInFlight = 256
	if err := c.Validate(RoleAllInOne); err != nil {
		t.Fatalf("256 refused: %v", err)
	}
}

// The control plane's profiler is off unless asked for.
func TestDebugPprofKey(t *testing.T) {
	if c := mustLoad(t, "controlplane:\n  node_id: a\n"); c.ControlPlane.DebugPprof {
		t.Fatal("debug_pprof is on by default")
	}
	if c := mustLoad(t, "controlplane:\n  debug_pprof: true\n"); !c.ControlPlane.DebugPprof {
		t.Fatal("debug_pprof: true loaded as false")
	}
}
