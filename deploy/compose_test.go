package deploy

import (
	"fmt"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cartrouter/cart/config"
)

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image       string         `yaml:"image"`
	Command     []string       `yaml:"command"`
	Volumes     []string       `yaml:"volumes"`
	Ports       []string       `yaml:"ports"`
	Profiles    []string       `yaml:"profiles"`
	ReadOnly    bool           `yaml:"read_only"`
	CapDrop     []string       `yaml:"cap_drop"`
	Ulimits     map[string]any `yaml:"ulimits"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	Secrets []struct {
		Source string `yaml:"source"`
		Target string `yaml:"target"`
	} `yaml:"secrets"`
	Hostname    string            `yaml:"hostname"`
	Environment map[string]string `yaml:"environment"`
	Deploy      struct {
		Replicas int `yaml:"replicas"`
	} `yaml:"deploy"`
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
			if !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") {
				t.Errorf("%s: want read_only: true and cap_drop: [ALL]", name)
			}
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
		// Each role mounts exactly the secrets it uses: a data plane never
		// holds the admin token, a control plane never the client key.
		want := []string{"cart_token", "cart_admin_token"}
		if s.Command[1] == "dataplane" {
			want = []string{"cart_token", "cart_client_key"}
		}
		var got []string
		for _, x := range s.Secrets {
			if x.Source != x.Target {
				t.Errorf("%s mounts secret %s as %s", name, x.Source, x.Target)
			}
			got = append(got, x.Source)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s mounts secrets %v, want %v", name, got, want)
		}
	}
	for secret, want := range map[string]string{
		"cart_token":       "${CART_TOKEN_FILE:-./cart-token.example}",
		"cart_admin_token": "${CART_ADMIN_TOKEN_FILE:-./cart-admin-token.example}",
		"cart_client_key":  "${CART_CLIENT_KEY_FILE:-./cart-client-key.example}",
	} {
		if f := c.Secrets[secret].File; f != want {
			t.Errorf("secret %s file %q: want %s", secret, f, want)
		}
	}
}

// composeSecretFile maps a /run/secrets/NAME path to the host file compose
// would mount there by default.
func composeSecretFile(t *testing.T, c composeFile, p string) string {
	t.Helper()
	name, ok := strings.CutPrefix(p, "/run/secrets/")
	if !ok {
		t.Errorf("secret path %q is not a compose secret", p)
		return p
	}
	f := c.Secrets[name].File
	if _, def, ok := strings.Cut(f, ":-"); ok {
		f = strings.TrimSuffix(def, "}")
	}
	return filepath.Join(path(t, composeDir), f)
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
		if a.TokenFile != "/run/secrets/cart_token" {
			t.Errorf("%s: auth.token_file %q, want the compose secret /run/secrets/cart_token", name, a.TokenFile)
		}
		switch role {
		case config.RoleControlPlane:
			if a.AdminTokenFile != "/run/secrets/cart_admin_token" || len(a.ClientKeys) != 0 {
				t.Errorf("%s: admin_token_file %q, client_keys %v; want the admin secret and no client keys", name, a.AdminTokenFile, a.ClientKeys)
			}
		case config.RoleDataPlane:
			if a.AdminTokenFile != "" || len(a.ClientKeys) != 1 || a.ClientKeys[0].KeyFile != "/run/secrets/cart_client_key" {
				t.Errorf("%s: admin_token_file %q, client_keys %v; want only the client key secret", name, a.AdminTokenFile, a.ClientKeys)
			}
		}
		// The secrets are mounted at run time; validate against the files
		// compose would mount.
		withSecretFiles(cfg, func(p string) string { return composeSecretFile(t, c, p) })
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
