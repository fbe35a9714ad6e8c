package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/cartrouter/cart/config"
)

// Setting keys. Each is a config file key; its flag is the key with dashes
// and its environment variable is CARTCTL_ plus the key in upper case, so
// one name means the same thing everywhere.
const (
	keyServer        = "server"
	keyToken         = "token"
	keyTokenFile     = "token_file"
	keyTLSCA         = "tls_ca"
	keyTLSCert       = "tls_cert"
	keyTLSKey        = "tls_key"
	keyTLSServerName = "tls_server_name"
	keyTimeout       = "timeout"
	keyOutput        = "output"
	keyInsecure      = "insecure"
)

var settingKeys = []string{keyServer, keyToken, keyTokenFile, keyTLSCA, keyTLSCert, keyTLSKey, keyTLSServerName, keyTimeout, keyOutput, keyInsecure}

const (
	defaultServer  = "http://127.0.0.1:6701"
	defaultTimeout = 10 * time.Second
	envConfig      = "CARTCTL_CONFIG"
	envPrefix      = "CARTCTL_"
)

const (
	outputTable = "table"
	outputJSON  = "json"
)

// globalFlags are the root's persistent flags. Their values matter only
// when the user set them (pflag's Changed): an unset flag must let the
// environment and config file show through, so the defaults given to
// pflag are for the help text alone.
type globalFlags struct {
	config        string
	server        string
	token         string
	tokenFile     string
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	timeout       time.Duration
	output        string
	insecure      bool
}

func (g *globalFlags) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&g.config, "config", "", "config file (default $HOME/.config/cartctl/config.yaml if it exists; \"\" for none)")
	f.StringVar(&g.server, "server", defaultServer, "control-plane API URL, or a comma-separated list tried in order")
	f.StringVar(&g.token, "token", "", "bearer token for the control-plane API")
	f.StringVar(&g.tokenFile, "token-file", "", "read the bearer token from this file")
	f.StringVar(&g.tlsCA, "tls-ca", "", "CA certificate (PEM) to verify the control plane with")
	f.StringVar(&g.tlsCert, "tls-cert", "", "client certificate (PEM) for mutual TLS")
	f.StringVar(&g.tlsKey, "tls-key", "", "client private key (PEM) for mutual TLS")
	f.StringVar(&g.tlsServerName, "tls-server-name", "", "server name to verify the control plane's certificate against")
	f.DurationVar(&g.timeout, "timeout", defaultTimeout, "deadline for the whole command, across all servers tried")
	f.StringVarP(&g.output, "output", "o", outputTable, "output format: table or json")
	f.BoolVar(&g.insecure, "insecure", false, "allow sending the token over plain http:// to a host other than loopback, where anyone on the path can read it")
}

// settings are the resolved, validated global settings.
type settings struct {
	servers []string
	token   string
	tls     config.ClientTLS
	timeout time.Duration
	output  string
	// insecure allows a token over plain http:// to a non-loopback host.
	insecure bool
	// warnings are printed to stderr by commands that use the settings.
	warnings []string
}

// source is one layer of settings. A key absent from values is not set by
// this source, so lower layers show through; a key present with an empty
// value is set to empty (e.g. `--token ""` to drop a token from the config
// file).
type source struct {
	name     string
	values   map[string]string
	warnings []string
}

// settings resolves the global settings from a command's parsed flags
// (which include the root's persistent ones): flags, then environment, then
// config file, then defaults.
func (a *app) settings(flags *pflag.FlagSet) (*settings, error) {
	file, err := a.fileSource(flags)
	if err != nil {
		return nil, err
	}
	defaults := source{name: "defaults", values: map[string]string{
		keyServer: defaultServer, keyTimeout: defaultTimeout.String(), keyOutput: outputTable,
	}}
	values, origin, err := merge(flagSource(flags), envSource(a.env), file, defaults)
	if err != nil {
		return nil, err
	}
	s, err := finalize(values, origin)
	if err != nil {
		return nil, err
	}
	s.warnings = append(file.warnings, s.warnings...)
	return s, nil
}

func flagSource(flags *pflag.FlagSet) source {
	s := source{name: "flags", values: map[string]string{}}
	for _, k := range settingKeys {
		name := strings.ReplaceAll(k, "_", "-")
		if f := flags.Lookup(name); f != nil && f.Changed {
			s.values[k] = f.Value.String()
		}
	}
	return s
}

// envSource reads CARTCTL_* variables. An empty variable counts as unset:
// the env function cannot tell the two apart, and treating "" as unset is
// what shells users expect (`CARTCTL_TOKEN= cartctl ...`).
func envSource(env func(string) string) source {
	s := source{name: "environment", values: map[string]string{}}
	for _, k := range settingKeys {
		if v := env(envPrefix + strings.ToUpper(k)); v != "" {
			s.values[k] = v
		}
	}
	return s
}

// fileSettings is the config file schema. Pointers tell a key that is
// absent from one set to "".
type fileSettings struct {
	Server        *string `yaml:"server"`
	Token         *string `yaml:"token"`
	TokenFile     *string `yaml:"token_file"`
	TLSCA         *string `yaml:"tls_ca"`
	TLSCert       *string `yaml:"tls_cert"`
	TLSKey        *string `yaml:"tls_key"`
	TLSServerName *string `yaml:"tls_server_name"`
	Timeout       *string `yaml:"timeout"`
	Output        *string `yaml:"output"`
	Insecure      *string `yaml:"insecure"`
}

// fileSource loads the config file: --config, else $CARTCTL_CONFIG, else
// the default path if it exists. An explicitly named file must exist; an
// explicitly empty name means no file.
func (a *app) fileSource(flags *pflag.FlagSet) (source, error) {
	path, explicit := "", true
	if f := flags.Lookup("config"); f != nil && f.Changed {
		path = f.Value.String()
	} else if p := a.env(envConfig); p != "" {
		path = p
	} else {
		path, explicit = defaultConfigPath(a.env), false
	}
	s := source{name: "config file " + path, values: map[string]string{}}
	if path == "" {
		return s, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			return s, nil
		}
		return s, usagef("config file: %v", err)
	}
	var fc fileSettings
	dec := yaml.NewDecoder(bytes.NewReader(data))
	// A misspelt key would otherwise be ignored silently, and the
	// command would run against the default server or without a token.
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return s, usagef("config file %s: %v", path, err)
	}
	if fc.Token != nil && *fc.Token != "" {
		if w := exposedSecret(path, "config file "+path+" holds a token"); w != "" {
			s.warnings = append(s.warnings, w)
		}
	}
	for k, v := range map[string]*string{
		keyServer: fc.Server, keyToken: fc.Token, keyTokenFile: fc.TokenFile,
		keyTLSCA: fc.TLSCA, keyTLSCert: fc.TLSCert, keyTLSKey: fc.TLSKey, keyTLSServerName: fc.TLSServerName,
		keyTimeout: fc.Timeout, keyOutput: fc.Output, keyInsecure: fc.Insecure,
	} {
		if v != nil {
			s.values[k] = *v
		}
	}
	return s, nil
}

// defaultConfigPath follows the XDG base directory convention, which is
// $HOME/.config unless the user moved it.
func defaultConfigPath(env func(string) string) string {
	dir := env("XDG_CONFIG_HOME")
	if dir == "" {
		home := env("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "cartctl", "config.yaml")
}

// merge takes each key from the first source that sets it and records
// which source that was, for error messages. token and token_file are one
// setting, the credential: the first source that sets either decides, so
// a --token-file flag beats a CARTCTL_TOKEN variable.
func merge(sources ...source) (values, origin map[string]string, err error) {
	values, origin = map[string]string{}, map[string]string{}
	for _, k := range settingKeys {
		if k == keyToken || k == keyTokenFile {
			continue
		}
		for _, s := range sources {
			if v, ok := s.values[k]; ok {
				values[k], origin[k] = v, s.name
				break
			}
		}
	}
	for _, s := range sources {
		tok, hasTok := s.values[keyToken]
		file, hasFile := s.values[keyTokenFile]
		if !hasTok && !hasFile {
			continue
		}
		if tok != "" && file != "" {
			return nil, nil, usagef("%s sets both token and token_file; use one", s.name)
		}
		values[keyToken], values[keyTokenFile] = tok, file
		origin[keyToken], origin[keyTokenFile] = s.name, s.name
		break
	}
	return values, origin, nil
}

// finalize validates merged values and turns them into settings. Every
// problem is a usage error naming the source of the bad value.
func finalize(values, origin map[string]string) (*settings, error) {
	bad := func(key, format string, args ...any) error {
		return usagef("%s (%s from %s)", fmt.Sprintf(format, args...), key, origin[key])
	}
	s := &settings{output: values[keyOutput]}
	if s.output != outputTable && s.output != outputJSON {
		return nil, bad(keyOutput, "output must be table or json, not %q", s.output)
	}
	d, err := time.ParseDuration(values[keyTimeout])
	if err != nil || d <= 0 {
		return nil, bad(keyTimeout, "timeout must be a positive duration such as 10s, not %q", values[keyTimeout])
	}
	s.timeout = d
	if v := values[keyInsecure]; v != "" {
		if s.insecure, err = strconv.ParseBool(v); err != nil {
			return nil, bad(keyInsecure, "insecure must be true or false, not %q", v)
		}
	}

	s.tls = config.ClientTLS{CAFile: values[keyTLSCA], CertFile: values[keyTLSCert], KeyFile: values[keyTLSKey], ServerName: values[keyTLSServerName]}
	if (s.tls.CertFile == "") != (s.tls.KeyFile == "") {
		return nil, usagef("tls_cert and tls_key must be given together")
	}
	tlsSet := s.tls != (config.ClientTLS{})

	for raw := range strings.SplitSeq(values[keyServer], ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, bad(keyServer, "server %q must be an http:// or https:// URL", raw)
		}
		if tlsSet && u.Scheme != "https" {
			// The TLS settings would be ignored and the token sent in
			// the clear: almost certainly not what was meant.
			return nil, bad(keyServer, "TLS settings are given but server %q is not https://", raw)
		}
		s.servers = append(s.servers, strings.TrimRight(raw, "/"))
	}
	if len(s.servers) == 0 {
		return nil, bad(keyServer, "no server URL given")
	}

	s.token = values[keyToken]
	if path := values[keyTokenFile]; path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, bad(keyTokenFile, "cannot read token file: %v", err)
		}
		s.token = strings.TrimSpace(string(data))
		if s.token == "" {
			return nil, bad(keyTokenFile, "token file %s is empty", path)
		}
		if w := exposedSecret(path, "token file "+path); w != "" {
			s.warnings = append(s.warnings, w)
		}
	}
	return s, nil
}

// exposedSecret returns a warning when the file at path can be read beyond
// this user (config.ExposedSecret, the server's rule too): any local user
// could then act as the operator.
func exposedSecret(path, what string) string {
	if why := config.ExposedSecret(path); why != "" {
		return what + " " + why
	}
	return ""
}

// checkCleartext refuses to send a token over plain http:// to anything
// but loopback, where it would cross a network in the clear, unless the
// user says --insecure.
func checkCleartext(s *settings) error {
	if s.token == "" || s.insecure {
		return nil
	}
	for _, raw := range s.servers {
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "http" || loopbackHost(u.Hostname()) {
			continue
		}
		return usagef("refusing to send the token over plain http to %s: use https:// (see --tls-ca), or pass --insecure if the network path is trusted", raw)
	}
	return nil
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
