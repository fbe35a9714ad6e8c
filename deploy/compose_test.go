package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cartrouter/cart/config"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
	// Secrets must stay empty: compose secrets are host files, which the
	// example would have to ship (anyone could read them).
	Secrets map[string]any `yaml:"secrets"`
}

type composeService struct {
	Image       string         `yaml:"image"`
	Command     []string       `yaml:"command"`
	Volumes     []string       `yaml:"volumes"`
	Ports       []string       `yaml:"ports"`
	Profiles    []string       `yaml:"profiles"`
	ReadOnly    bool           `yaml:"read_only"`
	CapDrop     []string       `yaml:"cap_drop"`
	CapAdd      []string       `yaml:"cap_add"`
	NetworkMode string         `yaml:"network_mode"`
	DependsOn   dependsOn      `yaml:"depends_on"`
	Ulimits     map[string]any `yaml:"ulimits"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Hostname    string            `yaml:"hostname"`
	Environment map[string]string `yaml:"environment"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
}

// dependsOn reads both forms compose accepts: a list of service names, or
// a map of name to {condition}. Values are the conditions ("" in a list).
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	if n.Kind == yaml.SequenceNode {
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, x := range names {
			(*d)[x] = ""
		}
		return nil
	}
	var m map[string]struct {
		Condition string `yaml:"condition"`
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		(*d)[k] = v.Condition
	}
	return nil
}

const composeDir = "deploy/compose"

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	// yaml.v3 resolves the anchors and `<<` merge keys the file uses.
	if err := yaml.Unmarshal(readFile(t, composeDir, "docker-compose.yml"), &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// TestComposeConfig validates the file with docker-compose itself,
// including the optional observability profile.
func TestComposeConfig(t *testing.T) {
	dc := tool(t, "apt-get install docker-compose", "docker-compose")
	dir := path(t, composeDir)
	run(t, dir, dc, "-f", "docker-compose.yml", "config", "-q")
	run(t, dir, dc, "-f", "docker-compose.yml", "--profile", "observability", "config", "-q")
}

func servicesWith(c composeFile, prefix string) []string {
	var names []string
	for n := range c.Services {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

func TestComposeTopology(t *testing.T) {
	c := loadCompose(t)
	if got := servicesWith(c, "cp-"); !slices.Equal(got, []string{"cp-1", "cp-2", "cp-3"}) {
		t.Errorf("control-plane services %v, want cp-1..cp-3", got)
	}
	if got := servicesWith(c, "dp-"); !slices.Equal(got, []string{"dp-1", "dp-2"}) {
		t.Errorf("data-plane services %v, want dp-1, dp-2", got)
	}
	if got := servicesWith(c, "sim-"); !slices.Equal(got, []string{"sim-1", "sim-2", "sim-3"}) {
		t.Errorf("simulated replicas %v, want sim-1..sim-3", got)
	}
	for _, cp := range servicesWith(c, "cp-") {
		s := c.Services[cp]
		if len(s.Command) < 2 || s.Command[0] != "cart" || s.Command[1] != "controlplane" {
			t.Errorf("%s command %v, want cart controlplane", cp, s.Command)
		}
		vol := cp + "-data:/var/lib/cart"
		if !slices.Contains(s.Volumes, vol) {
			t.Errorf("%s does not mount its named volume (%s): %v", cp, vol, s.Volumes)
		}
		if _, ok := c.Volumes[cp+"-data"]; !ok {
			t.Errorf("named volume %s-data is not declared", cp)
		}
	}
	for _, dp := range servicesWith(c, "dp-") {
		if s := c.Services[dp]; len(s.Command) < 2 || s.Command[0] != "cart" || s.Command[1] != "dataplane" {
			t.Errorf("%s command %v, want cart dataplane", dp, s.Command)
		}
	}
	hp, ok := c.Services["haproxy"]
	if !ok {
		t.Fatal("no haproxy service")
	}
	if !slices.ContainsFunc(hp.Ports, func(p string) bool { return strings.HasSuffix(p, ":6700") }) {
		t.Errorf("haproxy does not publish 6700: %v", hp.Ports)
	}

	for name, s := range c.Services {
		cartImage := strings.Contains(s.Image, "CART_IMAGE")
		if cartImage || name == "haproxy" {
			nofile, _ := s.Ulimits["nofile"].(map[string]any)
			if nofile["soft"] != 65535 || nofile["hard"] != 65535 {
				t.Errorf("%s: ulimits.nofile = %v, want soft and hard 65535 (the entrypoint refuses less)", name, s.Ulimits["nofile"])
			}
		}
		if (cartImage || name == "haproxy" || name == "secrets") && (!s.ReadOnly || !slices.Contains(s.CapDrop, "ALL")) {
			t.Errorf("%s: want read_only: true and cap_drop: [ALL]", name)
		}
		if !cartImage {
			continue
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 {
			t.Errorf("%s has no healthcheck", name)
			continue
		}
		hc := strings.Join(s.Healthcheck.Test, " ")
		if strings.Contains(hc, "/v1/models") {
			t.Errorf("%s healthcheck probes /v1/models (served from a cache): %s", name, hc)
		}
		switch {
		case strings.HasPrefix(name, "cp-"):
			if hc != "CMD cart-probe grpc http://127.0.0.1:6701" {
				t.Errorf("%s healthcheck %q, want the gRPC health check of the API port", name, hc)
			}
			// Three nodes on one host: one P each, as the chart gives them.
			if p := s.Environment["GOMAXPROCS"]; p != "1" {
				t.Errorf("%s GOMAXPROCS %q, want 1", name, p)
			}
		default:
			if !strings.HasPrefix(hc, "CMD cart-probe http ") || !strings.HasSuffix(hc, "/health") {
				t.Errorf("%s healthcheck %q, want cart-probe http .../health", name, hc)
			}
			// Data planes and the rest keep Go's default.
			if p, ok := s.Environment["GOMAXPROCS"]; ok {
				t.Errorf("%s GOMAXPROCS %q, want Go's default", name, p)
			}
		}
		if s.Command[0] != "cart" {
			continue
		}
		// Each role mounts exactly the secrets it uses, read-only: a data
		// plane never holds the admin or Raft token, a control plane never
		// the client key. None starts before the secrets exist.
		want := []string{"cart-token", "cart-admin-token", "cart-raft-token"}
		if s.Command[1] == "dataplane" {
			want = []string{"cart-token", "cart-client-key"}
		}
		if got := secretMounts(t, name, s); !slices.Equal(got, want) {
			t.Errorf("%s mounts secrets %v, want %v", name, got, want)
		}
		if s.DependsOn["secrets"] != "service_completed_successfully" {
			t.Errorf("%s does not wait for the secrets service: depends_on %v", name, s.DependsOn)
		}
	}
	// Nothing is shipped: the secrets service generates every one, into a
	// volume each, with no network and the one capability it needs.
	if len(c.Secrets) > 0 {
		t.Errorf("compose secrets %v: host files the example would ship", c.Secrets)
	}
	if ex, _ := filepath.Glob(path(t, composeDir, "*.example")); len(ex) > 0 {
		t.Errorf("example secrets shipped: %v", ex)
	}
	gen := c.Services["secrets"]
	if want := []string{"cart-token:/secrets/cart-token", "cart-admin-token:/secrets/cart-admin-token", "cart-client-key:/secrets/cart-client-key",
		"cart-raft-token:/secrets/cart-raft-token"}; !slices.Equal(gen.Volumes, want) {
		t.Errorf("secrets service volumes %v, want %v", gen.Volumes, want)
	}
	if gen.NetworkMode != "none" || !slices.Equal(gen.CapAdd, []string{"CHOWN"}) {
		t.Errorf("secrets service: network_mode %q, cap_add %v; want none and [CHOWN]", gen.NetworkMode, gen.CapAdd)
	}
	for _, v := range []string{"cart-token", "cart-admin-token", "cart-client-key", "cart-raft-token"} {
		if _, ok := c.Volumes[v]; !ok {
			t.Errorf("volume %s is not declared", v)
		}
	}
}

// secretVolumes are the volumes the secrets service fills, one secret each.
var secretVolumes = []string{"cart-token", "cart-admin-token", "cart-client-key", "cart-raft-token"}

// secretMounts lists the secret volumes a service mounts, checking that each
// is read-only at /run/cart/<volume>.
func secretMounts(t *testing.T, name string, s composeService) []string {
	t.Helper()
	var out []string
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if !slices.Contains(secretVolumes, parts[0]) {
			continue
		}
		if len(parts) != 3 || parts[1] != "/run/cart/"+parts[0] || parts[2] != "ro" {
			t.Errorf("%s mounts secret volume %q; want %s:/run/cart/%s:ro", name, v, parts[0], parts[0])
		}
		out = append(out, parts[0])
	}
	return out
}

// TestComposeSecretsScript runs the secrets service's script on this host
// (docker cannot run here), with its volumes as directories: the first run
// writes a distinct 64-hex-digit secret into each, owned by the image's user
// with mode 0400; a second run changes nothing, and a secret put there
// beforehand (an operator's own) is kept.
func TestComposeSecretsScript(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the script chowns to uid 65532, which needs root (as in its container)")
	}
	c := loadCompose(t)
	cmd := c.Services["secrets"].Command
	if len(cmd) != 3 || cmd[0] != "sh" {
		t.Fatalf("secrets command %v, want sh -euc SCRIPT", cmd)
	}
	dir := t.TempDir()
	// Compose turns $$ into $; the volumes are /secrets/<name>.
	script := strings.ReplaceAll(strings.ReplaceAll(cmd[2], "$$", "$"), "/secrets/", dir+"/")
	for _, v := range secretVolumes {
		if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	own := filepath.Join(dir, "cart-admin-token", "value")
	if err := os.WriteFile(own, []byte("operator-chosen\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	read := func() map[string]string {
		out := map[string]string{}
		for _, v := range secretVolumes {
			f := filepath.Join(dir, v, "value")
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out[v] = string(b)
			if f == own {
				continue
			}
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm() != 0o400 || st == nil || st.Uid != 65532 || st.Gid != 65532 {
				t.Errorf("%s: mode %04o owner %v; want 0400 and 65532:65532", v, fi.Mode().Perm(), st)
			}
			if config.ExposedSecret(f) != "" {
				t.Errorf("%s: %s", v, config.ExposedSecret(f))
			}
			if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(string(b)) {
				t.Errorf("%s = %q, want 64 hex digits", v, b)
			}
		}
		return out
	}
	run(t, dir, "sh", "-euc", script)
	first := read()
	seen := map[string]bool{}
	for v, s := range first {
		if seen[s] {
			t.Errorf("%s repeats another secret", v)
		}
		seen[s] = true
	}
	if first["cart-admin-token"] != "operator-chosen\n" {
		t.Errorf("an existing secret was replaced: %q", first["cart-admin-token"])
	}
	run(t, dir, "sh", "-euc", script)
	if again := read(); !maps.Equal(first, again) {
		t.Errorf("a second start changed the secrets")
	}
}

// TestComposeCartConfigs loads every config a cart service is started
// with through the real config loader and validator, for the role the
// service runs, and checks that every address in them names a service.
func TestComposeCartConfigs(t *testing.T) {
	c := loadCompose(t)
	checked := 0
	for name, s := range c.Services {
		if len(s.Command) == 0 || s.Command[0] != "cart" {
			continue
		}
		role := config.RoleAllInOne
		switch s.Command[1] {
		case "controlplane":
			role = config.RoleControlPlane
		case "dataplane":
			role = config.RoleDataPlane
		}
		mounts := map[string]string{}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) >= 2 && strings.HasPrefix(parts[0], "./") {
				mounts[parts[1]] = filepath.Join(path(t, composeDir), parts[0])
			}
		}
		var files []string
		for i, a := range s.Command {
			if a == "-c" && i+1 < len(s.Command) {
				host, ok := mounts[s.Command[i+1]]
				if !ok {
					t.Fatalf("%s: config %s is not mounted from the compose directory", name, s.Command[i+1])
				}
				files = append(files, host)
			}
		}
		cfg, err := config.Load(files...)
		if err != nil {
			t.Errorf("%s (%v, %v): %v", name, role, files, err)
			continue
		}
		a := cfg.Auth
		if a.TokenFile != "/run/cart/cart-token/value" {
			t.Errorf("%s: auth.token_file %q, want the generated /run/cart/cart-token/value", name, a.TokenFile)
		}
		switch role {
		case config.RoleControlPlane:
			if a.AdminTokenFile != "/run/cart/cart-admin-token/value" || a.RaftTokenFile != "/run/cart/cart-raft-token/value" || len(a.ClientKeys) != 0 {
				t.Errorf("%s: admin_token_file %q, raft_token_file %q, client_keys %v; want the admin and Raft secrets and no client keys",
					name, a.AdminTokenFile, a.RaftTokenFile, a.ClientKeys)
			}
		case config.RoleDataPlane:
			if a.AdminTokenFile != "" || a.RaftTokenFile != "" || len(a.ClientKeys) != 1 || a.ClientKeys[0].KeyFile != "/run/cart/cart-client-key/value" {
				t.Errorf("%s: admin_token_file %q, raft_token_file %q, client_keys %v; want only the client key secret", name, a.AdminTokenFile, a.RaftTokenFile, a.ClientKeys)
			}
		}
		// Every secret file the config names lies in a volume the service
		// mounts; they exist at run time only, so validate against fakes.
		mounted := secretMounts(t, name, s)
		for _, f := range cfg.SecretFiles() {
			vol := strings.TrimSuffix(strings.TrimPrefix(f.Path, "/run/cart/"), "/value")
			if !slices.Contains(mounted, vol) {
				t.Errorf("%s: %s %s is not in a secret volume it mounts (%v)", name, f.Key, f.Path, mounted)
			}
		}
		withSecretFiles(cfg, fakeSecrets(t))
		if err := cfg.Validate(role); err != nil {
			t.Errorf("%s (%v, %v): %v", name, role, files, err)
			continue
		}
		checked++
		if cfg.Server.MinOpenFiles != 65535 {
			t.Errorf("%s: server.min_open_files %d; compose sets ulimits to 65535, keep the production check", name, cfg.Server.MinOpenFiles)
		}
		hostIs := func(what, raw, prefix string) {
			u, err := url.Parse("//" + strings.TrimPrefix(strings.TrimPrefix(raw, "http://"), "https://"))
			if err != nil {
				t.Errorf("%s: %s %q: %v", name, what, raw, err)
				return
			}
			if _, ok := c.Services[u.Hostname()]; !ok || !strings.HasPrefix(u.Hostname(), prefix) {
				t.Errorf("%s: %s %q does not name a %s* service", name, what, raw, prefix)
			}
		}
		for _, w := range cfg.Workers {
			hostIs("worker", w.URL, "sim-")
		}
		if d := cfg.Discovery.DNS; d.Enabled() {
			// Discovery must name a scalable service (no fixed hostname)
			// listening on the configured port, through docker's DNS.
			pool, ok := c.Services[d.Name]
			switch {
			case !ok:
				t.Errorf("%s: discovery.dns.name %q is not a compose service", name, d.Name)
			case pool.Hostname != "" || pool.Deploy.Replicas < 1:
				t.Errorf("%s: discovery.dns.name %q should be a scalable service (no hostname, deploy.replicas set)", name, d.Name)
			case !slices.Contains(pool.Command, fmt.Sprintf("0.0.0.0:%d", d.Port)):
				t.Errorf("%s: discovery.dns.port %d is not where %s listens: %v", name, d.Port, d.Name, pool.Command)
			}
			if d.RecordType != "A" || d.Resolver != "127.0.0.11:53" {
				t.Errorf("%s: discovery.dns record_type %q resolver %q, want A records from docker's embedded DNS 127.0.0.11:53", name, d.RecordType, d.Resolver)
			}
		}
		switch role {
		case config.RoleControlPlane:
			cp := cfg.ControlPlane
			if cp.NodeID != name {
				t.Errorf("%s: node_id %q, want the service name", name, cp.NodeID)
			}
			hostIs("advertise_raft_addr", cp.AdvertiseRaftAddr, name)
			hostIs("advertise_api_url", cp.AdvertiseAPIURL, name)
			for _, j := range cp.Join {
				hostIs("join", j, "cp-")
			}
			if cp.Bootstrap != (name == "cp-1") || (name != "cp-1" && len(cp.Join) != 2) {
				t.Errorf("%s: bootstrap=%v join=%v; want cp-1 to bootstrap and the others to join through their two peers", name, cp.Bootstrap, cp.Join)
			}
			if cp.DataDir != "/var/lib/cart" {
				t.Errorf("%s: data_dir %q is not the named volume's mount", name, cp.DataDir)
			}
		case config.RoleDataPlane:
			if len(cfg.DataPlane.ControlPlane) != 3 {
				t.Errorf("%s: dataplane.control_plane %v, want all three nodes", name, cfg.DataPlane.ControlPlane)
			}
			for _, u := range cfg.DataPlane.ControlPlane {
				hostIs("control_plane", u, "cp-")
			}
			if cfg.Server.Port != 6700 {
				t.Errorf("%s: server.port %d, HAProxy dials 6700", name, cfg.Server.Port)
			}
		}
	}
	if checked != 5 {
		t.Errorf("checked %d cart configs, want 5 (three control-plane nodes, two data planes)", checked)
	}
}

// TestHAProxyConfig runs `haproxy -c` and checks that the backends are the
// compose data planes, health-checked on /health.
func TestHAProxyConfig(t *testing.T) {
	// Comments may explain why /v1/models is not used; directives may not use it.
	src := regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(string(readFile(t, composeDir, "haproxy.cfg")), "")
	servers := regexp.MustCompile(`(?m)^\s*server\s+(\S+)\s+(\S+)`).FindAllStringSubmatch(src, -1)
	var got []string
	for _, s := range servers {
		got = append(got, s[2])
	}
	if want := []string{"dp-1:6700", "dp-2:6700"}; !slices.Equal(got, want) {
		t.Errorf("haproxy servers %v, want %v", got, want)
	}
	if !regexp.MustCompile(`(?m)^\s*mode tcp`).MatchString(src) {
		t.Error("haproxy.cfg is not in TCP mode")
	}
	if !strings.Contains(src, "uri /health") || strings.Contains(src, "/v1/models") {
		t.Error("haproxy must health-check GET /health and never /v1/models")
	}
	if !regexp.MustCompile(`(?m)^\s*bind :6700\b`).MatchString(src) {
		t.Error("haproxy does not listen on 6700")
	}
	hp := tool(t, "apt-get install haproxy", "haproxy")
	// -c parses and checks the whole file; the data-plane names do not
	// resolve here, which init-addr none tolerates (warnings only).
	out := run(t, path(t, composeDir), hp, "-c", "-f", "haproxy.cfg")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "[WARNING]") && !strings.Contains(l, "could not resolve address") {
			t.Errorf("haproxy warning: %s", l)
		}
		if strings.Contains(l, "[ALERT]") {
			t.Errorf("haproxy alert: %s", l)
		}
	}
}

func TestComposeGrafanaProvisioning(t *testing.T) {
	c := loadCompose(t)
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("no grafana service")
	}
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal(readFile(t, composeDir, "grafana", "dashboards.yml"), &prov); err != nil || len(prov.Providers) != 1 {
		t.Fatalf("grafana/dashboards.yml: %v (%d providers)", err, len(prov.Providers))
	}
	want := fmt.Sprintf("../grafana/cart-dashboard.json:%s/cart-dashboard.json:ro", prov.Providers[0].Options.Path)
	if !slices.Contains(g.Volumes, want) {
		t.Errorf("grafana volumes %v lack %s: the provisioned path must hold the dashboard", g.Volumes, want)
	}
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	if err := yaml.Unmarshal(readFile(t, composeDir, "grafana", "datasource.yml"), &ds); err != nil || len(ds.Datasources) != 1 || ds.Datasources[0].URL != "http://prometheus:9090" {
		t.Errorf("grafana/datasource.yml: %v %+v", err, ds)
	}
}
