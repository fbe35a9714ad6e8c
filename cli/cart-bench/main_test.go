package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cartrouter/cart/bench"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// TestRunCommandAgainstReplica runs `cart-bench run` with a small gsp
// workload against an in-process cart-sim and checks the JSON it writes.
func TestRunCommandAgainstReplica(t *testing.T) {
	srv := simtest.Start(t, sim.Config{Name: "only", TimeScale: 0})
	out := filepath.Join(t.TempDir(), "run.json")
	cmd := newRootCmd()
	cmd.SetOut(new(nopWriter))
	cmd.SetErr(new(nopWriter))
	cmd.SetArgs([]string{"run", "--target", srv.URL, "--workload", "gsp", "--gsp-groups", "2", "--gsp-prompts-per-group", "3",
		"--gsp-system-tokens", "256", "--gsp-question-tokens", "16", "--max-tokens-cap", "4", "--replicas", "only", "--records", "-o", out})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res bench.RunResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	s := res.Summary
	if s.Succeeded != 6 || s.Errors != 0 || len(res.Records) != 6 || s.PerReplica["only"] != 6 {
		t.Fatalf("summary %+v", s)
	}
	// One replica with an unbounded cache is its own oracle.
	if s.HitRatio <= 0 || s.HitRatio != s.OracleHitRatio {
		t.Errorf("hit %v oracle %v", s.HitRatio, s.OracleHitRatio)
	}
}

func TestSplitList(t *testing.T) {
	got := splitList(" a, ,b ,c")
	if len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Errorf("%q", got)
	}
}

type nopWriter struct{}

func (*nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// The section subcommands and the suite refuse settings that would measure
// nothing, from the parsed flags, before starting any process.
func TestSectionFlagsValidated(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"cp", "--rates", "0", "--concurrency", "0"}, "no run"},
		{[]string{"cp", "--duration", "0s"}, "duration"},
		{[]string{"failover", "--window", "0s"}, "window"},
		{[]string{"failover", "--runs", "0"}, "runs"},
		{[]string{"suite", "--cp-dataplanes", "0", "--out", t.TempDir()}, "dataplanes"},
		{[]string{"suite", "--no-controlplane", "--failover-clients", "0", "--out", t.TempDir()}, "clients"},
		// The data-plane flags both sections share land in each section's own settings.
		{[]string{"failover", "--dataplanes", "0"}, "failover benchmark: dataplanes"},
		{[]string{"cp", "--route-timeout", "-1s"}, "control-plane benchmark: negative route timeout"},
		{[]string{"cp", "--block-chars", "-1"}, "control-plane benchmark: block chars -1"},
		{[]string{"suite", "--no-controlplane", "--failover-dataplanes", "65", "--out", t.TempDir()}, "failover benchmark: dataplanes 65"},
		// The distributed scenarios use --cp-node-procs with the section
		// skipped; --bin is empty so that a miss fails fast, not a suite run.
		{[]string{"suite", "--no-controlplane", "--cp-node-procs", "-1", "--bin", t.TempDir(), "--out", t.TempDir()}, "node procs -1"},
	} {
		cmd := newRootCmd()
		cmd.SetOut(new(nopWriter))
		cmd.SetErr(new(nopWriter))
		cmd.SetArgs(c.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one about %q", c.args, err, c.want)
		}
	}
}
