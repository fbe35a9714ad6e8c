package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

// envMap is an env function over a fixed set of variables.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// resolveFor parses args as global flags and resolves settings the way a
// command does.
func resolveFor(t *testing.T, args []string, env map[string]string) (*settings, error) {
	t.Helper()
	a := &app{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, env: envMap(env)}
	root := a.newRoot()
	if err := root.ParseFlags(args); err != nil {
		t.Fatalf("parse %v: %v", args, err)
	}
	return a.settings(root.Flags())
}

func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	defaultCfg := writeFile(t, home, ".config/cartctl/config.yaml",
		"server: http://cfg:6701\ntoken: cfg-token\noutput: json\ntimeout: 30s\n")
	otherCfg := writeFile(t, dir, "other.yaml", "server: http://other:6701\n")
	tokenFile := writeFile(t, dir, "token", "file-token\n")
	cfgWithTokenFile := writeFile(t, dir, "tokfile.yaml", "token_file: "+tokenFile+"\n")
	xdg := filepath.Join(dir, "xdg")
	writeFile(t, xdg, "cartctl/config.yaml", "server: http://xdg:6701\n")

	base := settings{servers: []string{defaultServer}, timeout: defaultTimeout, output: outputTable}
	with := func(f func(*settings)) settings {
		s := base
		f(&s)
		return s
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want settings
	}{
		{"defaults without a config file", nil, map[string]string{"HOME": filepath.Join(dir, "nohome")}, base},
		{"default config file", nil, map[string]string{"HOME": home},
			with(func(s *settings) {
				s.servers, s.token, s.output, s.timeout = []string{"http://cfg:6701"}, "cfg-token", outputJSON, 30*time.Second
			})},
		{"XDG_CONFIG_HOME moves the default file", nil, map[string]string{"HOME": home, "XDG_CONFIG_HOME": xdg},
			with(func(s *settings) { s.servers = []string{"http://xdg:6701"} })},
		{"env beats config file", nil, map[string]string{"HOME": home, "CARTCTL_SERVER": "http://env:6701", "CARTCTL_TOKEN": "env-token", "CARTCTL_OUTPUT": "table"},
			with(func(s *settings) {
				s.servers, s.token, s.output, s.timeout = []string{"http://env:6701"}, "env-token", outputTable, 30*time.Second
			})},
		{"flag beats env and config file", []string{"--server", "http://flag:6701", "--token", "flag-token", "-o", "json", "--timeout", "2s"},
			map[string]string{"HOME": home, "CARTCTL_SERVER": "http://env:6701", "CARTCTL_TOKEN": "env-token", "CARTCTL_TIMEOUT": "5s"},
			with(func(s *settings) {
				s.servers, s.token, s.output, s.timeout = []string{"http://flag:6701"}, "flag-token", outputJSON, 2*time.Second
			})},
		{"--token-file flag beats CARTCTL_TOKEN", []string{"--token-file", tokenFile}, map[string]string{"CARTCTL_TOKEN": "env-token"},
			with(func(s *settings) { s.token = "file-token" })},
		{"CARTCTL_TOKEN beats token_file in the config file", []string{"--config", cfgWithTokenFile}, map[string]string{"CARTCTL_TOKEN": "env-token"},
			with(func(s *settings) { s.token = "env-token" })},
		{"token_file in the config file", []string{"--config", cfgWithTokenFile}, nil,
			with(func(s *settings) { s.token = "file-token" })},
		{"explicitly empty --token drops the config file's", []string{"--token", ""}, map[string]string{"HOME": home},
			with(func(s *settings) {
				s.servers, s.output, s.timeout = []string{"http://cfg:6701"}, outputJSON, 30*time.Second
			})},
		{"--config replaces the default file", []string{"--config", otherCfg}, map[string]string{"HOME": home},
			with(func(s *settings) { s.servers = []string{"http://other:6701"} })},
		{"CARTCTL_CONFIG replaces the default file", nil, map[string]string{"HOME": home, "CARTCTL_CONFIG": otherCfg},
			with(func(s *settings) { s.servers = []string{"http://other:6701"} })},
		{"--config beats CARTCTL_CONFIG", []string{"--config", otherCfg}, map[string]string{"CARTCTL_CONFIG": defaultCfg},
			with(func(s *settings) { s.servers = []string{"http://other:6701"} })},
		{`--config "" disables the default file`, []string{"--config", ""}, map[string]string{"HOME": home}, base},
		{"server list", []string{"--server", " http://a:1/, ,http://b:2 "}, nil,
			with(func(s *settings) { s.servers = []string{"http://a:1", "http://b:2"} })},
		{"https with TLS settings", []string{"--server", "https://cp:6701", "--tls-ca", "ca.pem", "--tls-server-name", "cp.internal"}, nil,
			with(func(s *settings) {
				s.servers = []string{"https://cp:6701"}
				s.tls = config.ClientTLS{CAFile: "ca.pem", ServerName: "cp.internal"}
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveFor(t, tt.args, tt.env)
			if err != nil {
				t.Fatalf("settings: %v", err)
			}
			if !reflect.DeepEqual(*got, tt.want) {
				t.Errorf("settings:\n got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
}

func TestSettingsErrors(t *testing.T) {
	dir := t.TempDir()
	unknownKey := writeFile(t, dir, "unknown.yaml", "server: http://a:1\ntokn: x\n")
	both := writeFile(t, dir, "both.yaml", "token: a\ntoken_file: /x\n")
	badOutput := writeFile(t, dir, "out.yaml", "output: yaml\n")
	empty := writeFile(t, dir, "empty-token", "\n")

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string // substring of the error
	}{
		{"unknown config key", []string{"--config", unknownKey}, nil, "field tokn not found"},
		{"missing explicit config file", []string{"--config", filepath.Join(dir, "nope.yaml")}, nil, "no such file"},
		{"token and token_file in one source", []string{"--config", both}, nil, "sets both token and token_file"},
		{"token and token-file flags", []string{"--token", "a", "--token-file", empty}, nil, "flags sets both"},
		{"bad output names its source", []string{"--config", badOutput}, nil, `not "yaml" (output from config file`},
		{"bad env output", nil, map[string]string{"CARTCTL_OUTPUT": "xml"}, "(output from environment)"},
		{"bad timeout", nil, map[string]string{"CARTCTL_TIMEOUT": "10"}, "positive duration"},
		{"zero timeout", []string{"--timeout", "0s"}, nil, "positive duration"},
		{"server without scheme", []string{"--server", "127.0.0.1:6701"}, nil, "must be an http:// or https:// URL"},
		{"no server", []string{"--server", " , "}, nil, "no server URL"},
		{"TLS with http", []string{"--tls-ca", "ca.pem"}, nil, "is not https://"},
		{"cert without key", []string{"--server", "https://a:1", "--tls-cert", "c.pem"}, nil, "given together"},
		{"empty token file", []string{"--token-file", empty}, nil, "is empty"},
		{"missing token file", []string{"--token-file", filepath.Join(dir, "nope")}, nil, "cannot read token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := resolveFor(t, tt.args, tt.env)
			if err == nil {
				t.Fatal("settings succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			if exitCode(err) != exitUsage {
				t.Errorf("exit code %d, want %d", exitCode(err), exitUsage)
			}
		})
	}
}
