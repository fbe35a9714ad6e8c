package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
)

// unit is a parsed systemd unit file: section -> key -> values in order
// (a key may repeat; an empty assignment is recorded as "").
type unit map[string]map[string][]string

func parseUnit(t *testing.T, src string) unit {
	t.Helper()
	u := unit{}
	section := ""
	for i, l := range strings.Split(src, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";") {
			continue
		}
		if strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]") {
			section = l[1 : len(l)-1]
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok || section == "" {
			t.Fatalf("line %d: %q is not key=value inside a section", i+1, l)
		}
		u[section][k] = append(u[section][k], v)
	}
	return u
}

func (u unit) get(section, key string) (string, bool) {
	v, ok := u[section][key]
	if !ok {
		return "", false
	}
	return v[len(v)-1], true
}

var systemdUnits = []struct {
	file, subcommand, config string
	role                     config.Role
	reload, state            bool
}{
	{"cart.service", "", "cart.yaml", config.RoleAllInOne, true, false},
	{"cart-controlplane.service", "controlplane", "controlplane.yaml", config.RoleControlPlane, false, true},
	{"cart-dataplane.service", "dataplane", "dataplane.yaml", config.RoleDataPlane, false, false},
}

func TestSystemdUnits(t *testing.T) {
	for _, tc := range systemdUnits {
		t.Run(tc.file, func(t *testing.T) {
			u := parseUnit(t, string(readFile(t, "deploy", "systemd", tc.file)))
			want := map[string]string{
				"Restart":                 "on-failure",
				"LimitNOFILE":             "65535",
				"NoNewPrivileges":         "yes",
				"ProtectSystem":           "strict",
				"ProtectHome":             "yes",
				"PrivateTmp":              "yes",
				"PrivateDevices":          "yes",
				"ProtectKernelTunables":   "yes",
				"ProtectKernelModules":    "yes",
				"ProtectKernelLogs":       "yes",
				"ProtectControlGroups":    "yes",
				"CapabilityBoundingSet":   "",
				"AmbientCapabilities":     "",
				"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
				"SystemCallFilter":        "@system-service",
				"DynamicUser":             "yes",
			}
			for k, w := range want {
				if got, ok := u.get("Service", k); !ok || got != w {
					t.Errorf("[Service] %s=%q (set: %v), want %q", k, got, ok, w)
				}
			}
			exec, _ := u.get("Service", "ExecStart")
			wantExec := strings.Join(slices.DeleteFunc([]string{"/usr/local/bin/cart", tc.subcommand, "-c", "/etc/cart/" + tc.config}, func(s string) bool { return s == "" }), " ")
			if exec != wantExec {
				t.Errorf("ExecStart=%q, want %q", exec, wantExec)
			}
			reload, hasReload := u.get("Service", "ExecReload")
			if tc.reload && reload != "/bin/kill -HUP $MAINPID" {
				t.Errorf("ExecReload=%q: the all-in-one router reloads its worker list on SIGHUP", reload)
			}
			if !tc.reload && hasReload {
				// cart controlplane / dataplane do not handle SIGHUP: a
				// "reload" would terminate them.
				t.Errorf("ExecReload=%q on a role that does not handle SIGHUP", reload)
			}
			state, hasState := u.get("Service", "StateDirectory")
			if tc.state != hasState || (tc.state && state != "cart") {
				t.Errorf("StateDirectory=%q (set: %v); want cart only for the control plane", state, hasState)
			}
			if wb, _ := u.get("Install", "WantedBy"); wb != "multi-user.target" {
				t.Errorf("[Install] WantedBy=%q", wb)
			}

			// The example config this unit starts with is valid for its role
			// and agrees with the unit.
			cfg, err := config.Load(path(t, "deploy", "systemd", tc.config))
			if err != nil {
				t.Fatalf("%s: %v", tc.config, err)
			}
			// Each role loads the credentials it uses, and nothing else.
			creds := map[config.Role][]string{
				config.RoleAllInOne:     {"client-key"},
				config.RoleControlPlane: {"token", "admin-token", "raft-token"},
				config.RoleDataPlane:    {"token", "client-key"},
			}[tc.role]
			var wantLoad []string
			for _, c := range creds {
				wantLoad = append(wantLoad, c+":/etc/cart/"+c)
			}
			if got := u["Service"]["LoadCredential"]; !slices.Equal(got, wantLoad) {
				t.Errorf("LoadCredential=%v, want %v", got, wantLoad)
			}
			cred := func(name string) string {
				if !slices.Contains(creds, name) {
					return ""
				}
				return "/run/credentials/" + tc.file + "/" + name
			}
			var keyFile string
			if len(cfg.Auth.ClientKeys) > 0 {
				keyFile = cfg.Auth.ClientKeys[0].KeyFile
			}
			if cfg.Auth.TokenFile != cred("token") || cfg.Auth.AdminTokenFile != cred("admin-token") || cfg.Auth.RaftTokenFile != cred("raft-token") ||
				keyFile != cred("client-key") || len(cfg.Auth.ClientKeys) > 1 {
				t.Errorf("%s auth %+v, want the credential paths of %v", tc.config, cfg.Auth, creds)
			}
			withSecretFiles(cfg, fakeSecrets(t))
			if err := cfg.Validate(tc.role); err != nil {
				t.Fatalf("%s: %v", tc.config, err)
			}
			if cfg.Server.MinOpenFiles > 65535 {
				t.Errorf("%s min_open_files %d exceeds LimitNOFILE", tc.config, cfg.Server.MinOpenFiles)
			}
			if tc.state && cfg.ControlPlane.DataDir != "/var/lib/"+state {
				t.Errorf("%s data_dir %q, want the StateDirectory /var/lib/%s (the only writable path)", tc.config, cfg.ControlPlane.DataDir, state)
			}
		})
	}
}

// TestSystemdAnalyzeVerify runs systemd's own checker. ExecStart's binary
// must exist for it, so the units are verified from a copy that starts
// /bin/true instead of /usr/local/bin/cart; everything else is verbatim.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa := tool(t, "apt-get install systemd", "systemd-analyze")
	dir := t.TempDir()
	var files []string
	for _, tc := range systemdUnits {
		src := strings.ReplaceAll(string(readFile(t, "deploy", "systemd", tc.file)), "/usr/local/bin/cart ", "/bin/true ")
		f := filepath.Join(dir, tc.file)
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	out, err := runErr(dir, []string{"SYSTEMD_LOG_COLOR=0"}, sa, append([]string{"verify"}, files...)...)
	var problems []string
	for _, l := range strings.Split(out, "\n") {
		for _, tc := range systemdUnits {
			if strings.Contains(l, tc.file) {
				problems = append(problems, l)
				break
			}
		}
	}
	if len(problems) > 0 {
		t.Fatalf("systemd-analyze verify:\n%s", strings.Join(problems, "\n"))
	}
	if err != nil {
		// A failure that names none of the units is the environment (no
		// systemd as PID 1, no D-Bus in a container), not the units.
		t.Skipf("systemd-analyze verify failed for environmental reasons (%v); the unit-file assertions above still ran:\n%s", err, out)
	}
}
