package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeCart is a `cart` that logs its role and GOMAXPROCS and exits, so a
// start fails at once and leaves in its log what the process was given.
func fakeCart(t *testing.T) (dir, bin string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "cart")
	script := "#!/bin/sh\necho \"role=$1 GOMAXPROCS=${GOMAXPROCS-unset}\"\nexit 3\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	// The nodes inherit the bench's environment: without this a
	// GOMAXPROCS of the shell running the tests would pass for ours.
	t.Setenv("GOMAXPROCS", "")
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

func newTestEnv(t *testing.T, binDir string) *Env {
	t.Helper()
	env, err := NewEnv(SuiteConfig{BinDir: binDir, StartTimeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return env
}

func logLine(t *testing.T, env *Env, name string) string {
	t.Helper()
	b, err := os.ReadFile(env.Path(name + ".log"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// --node-procs reaches the processes the cp and failover sections start;
// 0 gives them an empty GOMAXPROCS, which Go ignores.
func TestNodeProcsReachTheClusterNodes(t *testing.T) {
	dir, bin := fakeCart(t)
	ctx := context.Background()
	// The second round sets a GOMAXPROCS in the bench's own environment:
	// it reaches no node, since the intros say what the nodes ran with
	// from --node-procs alone.
	for _, benchEnv := range []string{"", "5"} {
		if benchEnv != "" {
			t.Setenv("GOMAXPROCS", benchEnv)
		}
		for _, tc := range []struct {
			procs int
			want  string
		}{{3, "role=controlplane GOMAXPROCS=3"}, {0, "role=controlplane GOMAXPROCS="}} {
			env := newTestEnv(t, dir)
			if _, err := startCPCluster(ctx, env, bin, cpClusterSpec{Nodes: 1, Workers: 1, Model: "m", Procs: tc.procs, StartTimeout: 10 * time.Second}); err == nil {
				t.Fatal("a cluster of a cart that exits started")
			}
			if got := logLine(t, env, "cp1"); got != tc.want {
				t.Errorf("bench GOMAXPROCS %q, procs %d: node saw %q, want %q", benchEnv, tc.procs, got, tc.want)
			}
		}
	}

	env := newTestEnv(t, dir)
	cfg := DefaultFailoverConfig()
	cfg.NodeProcs = 2
	if run, err := failoverOnce(ctx, env, cfg, 1); err == nil || run != nil {
		t.Fatalf("failover with a cart that exits: run %v, err %v", run, err)
	}
	if got := logLine(t, env, "cp1"); got != "role=controlplane GOMAXPROCS=2" {
		t.Errorf("failover node saw %q", got)
	}
}

// The suite's distributed scenarios give the control-plane nodes the cp
// section's GOMAXPROCS; an all-in-one router keeps Go's default.
func TestNodeProcsControlPlaneOnlyInTheSuite(t *testing.T) {
	dir, bin := fakeCart(t)
	ctx := context.Background()
	env := newTestEnv(t, dir)
	cfg := env.Cfg
	cfg.CP.NodeProcs = 2
	s := &suite{env: env, cfg: cfg, cartBin: bin, haproxy: "/bin/false"}
	if err := s.startDistributed(ctx, env.Dir, "dist", 1, &deployment{}); err == nil {
		t.Fatal("a distributed scenario of a cart that exits started")
	}
	if got := logLine(t, env, "dist-cp1"); got != "role=controlplane GOMAXPROCS=2" {
		t.Errorf("control-plane node saw %q", got)
	}
	port, err := env.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.startCart(ctx, env.Dir, "aio", port, ""); err == nil {
		t.Fatal("an all-in-one cart that exits started")
	}
	if got := logLine(t, env, "aio"); got != "role=-c GOMAXPROCS=unset" {
		t.Errorf("all-in-one router saw %q, want Go's default", got)
	}
}
