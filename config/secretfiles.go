package config

import (
	"fmt"
	"os"
)

// SecretFile is one configured file holding a secret, with the key that
// names it.
type SecretFile struct {
	Key  string
	Path string
	// Why is how others can read it (ExposedSecretFiles only).
	Why string
}

// SecretFiles lists the configured files that hold secrets: tokens, client
// and worker keys, and TLS private keys.
func (c *Config) SecretFiles() []SecretFile {
	var out []SecretFile
	add := func(key, path string) {
		if path != "" {
			out = append(out, SecretFile{Key: key, Path: path})
		}
	}
	a := c.Auth
	add("auth.token_file", a.TokenFile)
	add("auth.admin_token_file", a.AdminTokenFile)
	add("auth.raft_token_file", a.RaftTokenFile)
	for i, k := range a.ClientKeys {
		add(fmt.Sprintf("auth.client_keys[%d].key_file", i), k.KeyFile)
	}
	add("proxy.worker_api_key_file", c.Proxy.WorkerAPIKeyFile)
	for i, w := range c.Workers {
		add(fmt.Sprintf("workers[%d].api_key_file", i), w.APIKeyFile)
	}
	add("server.tls.key_file", c.Server.TLS.KeyFile)
	add("controlplane.raft_tls.key_file", c.ControlPlane.RaftTLS.KeyFile)
	add("dataplane.tls.key_file", c.DataPlane.ClientTLS.KeyFile)
	return out
}

// ExposedSecretFiles returns the secret files others can read (see
// ExposedSecret). The server warns about them at start, or, with
// auth.refuse_insecure_secret_files, Validate refuses them.
func (c *Config) ExposedSecretFiles() []SecretFile {
	var out []SecretFile
	for _, f := range c.SecretFiles() {
		if f.Why = ExposedSecret(f.Path); f.Why != "" {
			out = append(out, f)
		}
	}
	return out
}

// ExposedSecret says how the file at path can be read by others than this
// process's user, and how to fix it; "" when it cannot, or when the file
// cannot be examined (reading it reports that). Exposed are a file anyone
// can read, a file of this user's that its group can read (the group bit
// serves nothing but others then), and a file its group can read when this
// process is not in that group. Allowed is a file of another user (root)
// whose group is this process's: that is how a secret reaches a service
// without handing it the file (root:cart 0640 on a host, a Kubernetes
// Secret mounted for the pod's fsGroup). cartctl and the server share the
// rule.
func ExposedSecret(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	mode := fi.Mode().Perm()
	owner, gid, known := fileOwner(fi)
	switch {
	case mode&0o004 != 0, mode&0o040 != 0 && (!known || owner == os.Geteuid()):
		return fmt.Sprintf("is readable by group or others (mode %04o); run chmod 600 %s", mode, path)
	case mode&0o040 != 0 && !inGroup(gid):
		return fmt.Sprintf("is readable by group %d, which this process is not in (mode %04o); run chmod 600 %s, or give it this process's group", gid, mode, path)
	}
	return ""
}
