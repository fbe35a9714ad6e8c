package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// foreignGroup is a group id this process is not in.
func foreignGroup(t *testing.T) int {
	t.Helper()
	groups, _ := os.Getgroups()
	for gid := 54321; gid < 54400; gid++ {
		if gid != os.Getegid() && gid != os.Getgid() && !slices.Contains(groups, gid) {
			return gid
		}
	}
	t.Skip("no free group id")
	return 0
}

// Attack #9 of issue 33: a secret file others can read. Readable by
// everyone, by the group of a file this user owns, or by a group this
// process is not in, it is exposed; readable by the owner only, or another
// user's file shared with this process's group (root:cart 0640, a
// Kubernetes Secret for the pod's fsGroup), it is not.
func TestExposedSecret(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if why := ExposedSecret(file("world", 0o644)); !strings.Contains(why, "readable by group or others (mode 0644)") || !strings.Contains(why, "chmod 600") {
		t.Errorf("0644: %q", why)
	}
	if why := ExposedSecret(file("world-only", 0o604)); why == "" {
		t.Error("0604 passed")
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if why := ExposedSecret(file("owner", mode)); why != "" {
			t.Errorf("%04o: %q", mode, why)
		}
	}
	// This user's own file, group-readable: the group bit serves only others.
	own := file("own-group", 0o640)
	if err := os.Chown(own, -1, os.Getegid()); err != nil {
		t.Fatal(err)
	}
	if why := ExposedSecret(own); !strings.Contains(why, "readable by group or others (mode 0640)") {
		t.Errorf("this user's 0640 file: %q", why)
	}
	// Another user's file shared with this process's group: how a service
	// gets a secret it does not own. The same in a group this process is
	// not in is exposed.
	other := os.Geteuid() + 4242
	granted := file("granted", 0o440)
	if err := os.Chown(granted, other, os.Getegid()); err != nil {
		t.Skipf("cannot give a file another owner (not root?): %v", err)
	}
	if why := ExposedSecret(granted); why != "" {
		t.Errorf("0440 owned by %d, group %d (ours): %q", other, os.Getegid(), why)
	}
	foreign := file("foreign-group", 0o640)
	gid := foreignGroup(t)
	if err := os.Chown(foreign, other, gid); err != nil {
		t.Fatal(err)
	}
	if why := ExposedSecret(foreign); !strings.Contains(why, "which this process is not in") {
		t.Errorf("0640 owned by %d, group %d: %q", other, gid, why)
	}
	if why := ExposedSecret(filepath.Join(dir, "missing")); why != "" {
		t.Errorf("missing file: %q", why)
	}
}

// Every secret file of a config is checked, by its key; with
// auth.refuse_insecure_secret_files an exposed one is a config error, and
// without it the config stays valid (the server warns).
func TestRefuseInsecureSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("secret-"+name), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := validBase()
	c.Auth.TokenFile = write("token", 0o644)
	c.Auth.AdminTokenFile = write("admin", 0o600)
	c.Auth.ClientKeys = []ClientKey{{Name: "a", KeyFile: write("client", 0o604)}}
	c.Proxy.WorkerAPIKeyFile = write("worker", 0o400)
	var keys []string
	for _, f := range c.SecretFiles() {
		keys = append(keys, f.Key)
	}
	if want := []string{"auth.token_file", "auth.admin_token_file", "auth.client_keys[0].key_file", "proxy.worker_api_key_file"}; !slices.Equal(keys, want) {
		t.Errorf("SecretFiles = %v, want %v", keys, want)
	}
	keys = nil
	for _, f := range c.ExposedSecretFiles() {
		keys = append(keys, f.Key)
	}
	if want := []string{"auth.token_file", "auth.client_keys[0].key_file"}; !slices.Equal(keys, want) {
		t.Errorf("ExposedSecretFiles = %v, want %v", keys, want)
	}
	if err := c.Validate(RoleDataPlane); err != nil {
		t.Fatalf("without the flag: %v", err)
	}
	c.Auth.RefuseInsecureSecretFiles = true
	err := c.Validate(RoleDataPlane)
	if err == nil {
		t.Fatal("exposed secret files accepted with auth.refuse_insecure_secret_files")
	}
	for _, want := range []string{"auth.token_file: " + c.Auth.TokenFile + " is readable by group or others", "auth.client_keys[0].key_file: "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "auth.admin_token_file") || strings.Contains(err.Error(), "proxy.worker_api_key_file") {
		t.Errorf("a private file was refused:\n%v", err)
	}
	for _, p := range []string{c.Auth.TokenFile, c.Auth.ClientKeys[0].KeyFile} {
		if err := os.Chmod(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(RoleDataPlane); err != nil {
		t.Fatalf("after chmod 600: %v", err)
	}
}
