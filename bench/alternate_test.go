package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeEnv makes the test binary act as a cart-bench (see TestMain): it
// writes an overhead result whose CART figure is the number after
// --fake-rps, and logs its arguments.
const fakeEnv = "CART_BENCH_FAKE_ALTERNATE"

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeCartBench(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeCartBench(args []string) int {
	var out, rps string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-o":
			out = args[i+1]
		case "--fake-rps":
			rps = args[i+1]
		}
	}
	fmt.Println("args:", strings.Join(args, " "))
	var cart float64
	if _, err := fmt.Sscan(rps, &cart); err != nil || out == "" {
		fmt.Println("bad arguments")
		return 2
	}
	rd := round3(1000, 500, cart)
	rd.Cart.CPUUsPerReq = 50
	r := OverheadResult{Rounds: []OverheadRound{rd}, CartOverNginx: rd.CartOverNginx, CartOverCaddy: rd.CartOverCaddy}
	if err := WriteJSON(out, r); err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

func TestParseVariant(t *testing.T) {
	v, err := ParseVariant("p1=/tmp/bin --node-procs 1")
	if err != nil || v.Name != "p1" || v.BinDir != "/tmp/bin" || !slices.Equal(v.Args, []string{"--node-procs", "1"}) {
		t.Fatalf("%+v, %v", v, err)
	}
	for _, bad := range []string{"", "x", "=/bin", "a=", "a/b=/bin", ".a=/bin"} {
		if _, err := ParseVariant(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestAlternateValidate(t *testing.T) {
	ok := AlternateConfig{Variants: []AlternateVariant{{Name: "a", BinDir: "/x"}}, Runs: 1, Out: "/tmp/x", Command: []string{"overhead"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*AlternateConfig){
		"no command":      func(c *AlternateConfig) { c.Command = nil },
		"other command":   func(c *AlternateConfig) { c.Command = []string{"suite"} },
		"no variant":      func(c *AlternateConfig) { c.Variants = nil },
		"same name twice": func(c *AlternateConfig) { c.Variants = append(c.Variants, c.Variants[0]) },
		"no runs":         func(c *AlternateConfig) { c.Runs = 0 },
		"no out":          func(c *AlternateConfig) { c.Out = "" },
		"nice":            func(c *AlternateConfig) { c.Nice = -21 },
		"--bin given":     func(c *AlternateConfig) { c.Command = []string{"cp", "--bin", "/y"} },
		"-o given":        func(c *AlternateConfig) { c.Command = []string{"cp", "-o", "/y"} },
	} {
		c := ok
		c.Variants = slices.Clone(ok.Variants)
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The variants run in turn, round after round, each with its own bin
// directory and arguments, and the summary gives each one's medians.
func TestRunAlternate(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeEnv, "1")
	out := t.TempDir()
	c := AlternateConfig{
		Variants: []AlternateVariant{
			{Name: "base", BinDir: t.TempDir(), Args: []string{"--fake-rps", "600"}},
			{Name: "new-loop", BinDir: t.TempDir(), Args: []string{"--fake-rps", "900"}},
		},
		Runs: 2, Out: out, Command: []string{"overhead", "--duration", "1s"},
	}
	var log strings.Builder
	if err := RunAlternate(context.Background(), c, self, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	want := []string{"== base run 1", "== new-loop run 1", "== base run 2", "== new-loop run 2"}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		got = append(got, l[:strings.Index(l, ",")])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("order %q, want %q", got, want)
	}
	txt, err := os.ReadFile(filepath.Join(out, "new-loop-2.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"load average at start", "args: overhead --duration 1s --fake-rps 900 --bin " + c.Variants[1].BinDir + " -o " + filepath.Join(out, "new-loop-2.json"), "load average at end"} {
		if !strings.Contains(string(txt), w) {
			t.Errorf("output lacks %q:\n%s", w, txt)
		}
	}
	sum, err := SummarizeAlternate(out, []string{"base", "new-loop"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"| base | 2 | **0.60** (0.60, 0.60) | **1.20** (1.20, 1.20) | **600** (600, 600) | **50** (50, 50) | - | - |",
		"| new-loop | 2 | **0.90** (0.90, 0.90) | **1.80** (1.80, 1.80) | **900** (900, 900) |",
	} {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}
	// A failing run stops the comparison and says where its output is.
	c.Variants[0].Args = []string{"--fake-rps", "x"}
	if err := RunAlternate(context.Background(), c, self, io.Discard); err == nil || !strings.Contains(err.Error(), "base-1.txt") {
		t.Fatalf("failing run: %v", err)
	}
}

// The control-plane summary lists each run name's medians per variant.
func TestSummarizeAlternateCP(t *testing.T) {
	dir := t.TempDir()
	for i, rps := range []float64{4000, 5000, 4500} {
		r := CPResult{Runs: []CPRun{
			{Name: "open 5000/s", RoutesPerS: rps, DecideP99Us: 150, CPULeaderUs: 40, CPUFollowersUs: 30, Fallbacks: i, LatencyMs: Latency{P99: 2}},
			{Name: "closed c=32", RoutesPerS: 2 * rps},
		}}
		if err := WriteJSON(filepath.Join(dir, fmt.Sprintf("p-1-%d.json", i+1)), r); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := SummarizeAlternate(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"| open 5000/s | p-1 | 3 | **4500** (4000, 5000, 4500) | **2.0** (2.0, 2.0, 2.0) | **150** (150, 150, 150) | **40** (40, 40, 40) | **30** (30, 30, 30) | **1** (0, 1, 2) |",
		"| closed c=32 | p-1 | 3 | **9000** (8000, 10000, 9000) |",
	} {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}
	if strings.Index(sum, "open 5000/s") > strings.Index(sum, "closed c=32") {
		t.Errorf("runs out of the benchmark's order:\n%s", sum)
	}
}

// Results from before the rounds (one nginx/CART pair, in targets) and the
// control plane's, whose config has another shape, summarize too.
func TestSummarizeAlternateOldOverhead(t *testing.T) {
	dir := t.TempDir()
	old := `{"config":{"duration_ns":1},"targets":[{"name":"direct","req_per_s":9000},{"name":"nginx","req_per_s":1000,"cpu_us_per_req":36},` +
		`{"name":"cart","req_per_s":650,"cpu_us_per_req":110}],"cart_over_nginx":0.65}`
	if err := os.WriteFile(filepath.Join(dir, "before-1.json"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(filepath.Join(dir, "cp-1.json"), CPResult{Config: DefaultCPConfig(), Runs: []CPRun{{Name: "closed c=32", RoutesPerS: 7000}}}); err != nil {
		t.Fatal(err)
	}
	sum, err := SummarizeAlternate(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"| before | 1 | **0.65** (0.65) | - | **650** (650) | **110** (110) | **36** (36) | - |", "| closed c=32 | cp | 1 | **7000** (7000) |"} {
		if !strings.Contains(sum, w) {
			t.Errorf("summary lacks %q:\n%s", w, sum)
		}
	}
}
