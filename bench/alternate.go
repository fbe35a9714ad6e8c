package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Alternating runs compare builds (or settings) of CART on a shared
// machine: one run of each in turn, several rounds, so that a neighbour's
// load falls on all of them alike, and the medians compared. Every
// comparison in bench/results ran this way; AlternateConfig is that loop.

// AlternateVariant is one side of a comparison: a directory holding the
// binaries (cart, cart-sim, and cart-bench when the load generator itself
// changed: the cp benchmark runs the data planes inside it) and arguments
// added to the subcommand for this side only.
type AlternateVariant struct {
	Name   string
	BinDir string
	Args   []string
}

// ParseVariant reads "name=bindir" or "name=bindir arg arg...".
func ParseVariant(s string) (AlternateVariant, error) {
	name, rest, ok := strings.Cut(s, "=")
	fields := strings.Fields(rest)
	switch {
	case !ok || name == "" || len(fields) == 0:
		return AlternateVariant{}, fmt.Errorf("variant %q: want name=bindir [args...]", s)
	case strings.ContainsAny(name, "/ \t") || strings.HasPrefix(name, "."):
		return AlternateVariant{}, fmt.Errorf("variant %q: the name names files, so no slashes, spaces or leading dot", s)
	}
	return AlternateVariant{Name: name, BinDir: fields[0], Args: fields[1:]}, nil
}

// alternateCommands are the subcommands that take --bin and -o.
var alternateCommands = []string{"overhead", "cp", "failover"}

// AlternateConfig runs Command (a cart-bench subcommand and its arguments)
// for every variant in turn, Runs rounds, into Out: <name>-<round>.json and
// .txt (the output, between the load averages at its start and end).
type AlternateConfig struct {
	Variants []AlternateVariant
	Runs     int
	Out      string
	// Nice is the runs' scheduling priority (-20..19); earlier
	// comparisons ran at -15 so that other work on the box waits instead.
	Nice    int
	Command []string
}

// Validate refuses a comparison that would run nothing or clobber itself.
func (c AlternateConfig) Validate() error {
	switch {
	case len(c.Command) == 0 || !slices.Contains(alternateCommands, c.Command[0]):
		return fmt.Errorf("alternate: the command must be one of %s, with its arguments after --", strings.Join(alternateCommands, ", "))
	case len(c.Variants) == 0:
		return errors.New("alternate: no --variant")
	case c.Runs < 1 || c.Runs > 50:
		return fmt.Errorf("alternate: runs %d out of range 1..50", c.Runs)
	case c.Out == "":
		return errors.New("alternate: no --out directory")
	case c.Nice < -20 || c.Nice > 19:
		return fmt.Errorf("alternate: nice %d out of range -20..19", c.Nice)
	}
	seen := map[string]bool{}
	for _, v := range c.Variants {
		if seen[v.Name] {
			return fmt.Errorf("alternate: variant %q twice", v.Name)
		}
		seen[v.Name] = true
	}
	for _, a := range c.Command[1:] {
		if a == "--bin" || a == "-o" || a == "--out" || strings.HasPrefix(a, "--bin=") || strings.HasPrefix(a, "--out=") {
			return fmt.Errorf("alternate: %s is set per variant and run; leave it out of the command", a)
		}
	}
	return nil
}

// RunAlternate runs the comparison. self is the cart-bench to run for a
// variant whose directory has none. Progress goes to logw.
func RunAlternate(ctx context.Context, c AlternateConfig, self string, logw io.Writer) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		return err
	}
	for i := 1; i <= c.Runs; i++ {
		for _, v := range c.Variants {
			if err := ctx.Err(); err != nil {
				return err
			}
			base := filepath.Join(c.Out, fmt.Sprintf("%s-%d", v.Name, i))
			fmt.Fprintf(logw, "== %s run %d, load %s\n", v.Name, i, LoadAvg())
			if err := runOne(ctx, c, v, self, base); err != nil {
				return fmt.Errorf("%s run %d: %w (output in %s.txt)", v.Name, i, err, base)
			}
		}
	}
	return nil
}

func runOne(ctx context.Context, c AlternateConfig, v AlternateVariant, self, base string) error {
	bin := filepath.Join(v.BinDir, "cart-bench")
	if _, err := os.Stat(bin); err != nil {
		bin = self
	}
	args := append(slices.Clone(c.Command), v.Args...)
	args = append(args, "--bin", v.BinDir, "-o", base+".json")
	f, err := os.Create(base + ".txt")
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "# %s %s %s\n# load average at start: %s\n", time.Now().UTC().Format(time.RFC3339), bin, strings.Join(args, " "), LoadAvg())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	if c.Nice != 0 {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, c.Nice); err != nil {
			fmt.Fprintf(f, "# nice %d not applied: %v\n", c.Nice, err)
		}
	}
	err = cmd.Wait()
	fmt.Fprintf(f, "# %s load average at end: %s\n", time.Now().UTC().Format(time.RFC3339), LoadAvg())
	return err
}

// alternateRun is what the summary reads from either result shape (their
// configs differ, so neither is read).
type alternateRun struct {
	Targets       []OverheadTarget `json:"targets"`
	Rounds        []OverheadRound  `json:"rounds"`
	CartOverNginx float64          `json:"cart_over_nginx"`
	CartOverCaddy float64          `json:"cart_over_caddy"`
	Runs          []CPRun          `json:"runs"`
}

// rounds returns an overhead result's rounds; a result from before the
// rounds existed is its one nginx/CART pair.
func (r alternateRun) rounds() []OverheadRound {
	if len(r.Rounds) > 0 || len(r.Runs) > 0 {
		return r.Rounds
	}
	var rd OverheadRound
	for _, t := range r.Targets {
		switch t.Name {
		case "nginx":
			rd.Nginx = t
		case "caddy":
			rd.Caddy = t
		case "cart":
			rd.Cart = t
		}
	}
	if rd.Cart.Name == "" {
		return nil
	}
	rd.CartOverNginx, rd.CartOverCaddy = ratio(rd.Cart, rd.Nginx), ratio(rd.Cart, rd.Caddy)
	return []OverheadRound{rd}
}

// SummarizeAlternate renders the medians of the runs in dir, variants in
// the order given (nil: every <name>-<round>.json found, by name).
func SummarizeAlternate(dir string, variants []string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*-*.json"))
	if err != nil {
		return "", err
	}
	byVariant := map[string][]alternateRun{}
	for _, f := range files {
		// Names may hold dashes; the round is after the last.
		stem := strings.TrimSuffix(filepath.Base(f), ".json")
		i := strings.LastIndexByte(stem, '-')
		name, round := stem[:max(i, 0)], stem[i+1:]
		if name == "" || round == "" || strings.Trim(round, "0123456789") != "" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		var r alternateRun
		if err := json.Unmarshal(b, &r); err != nil {
			return "", fmt.Errorf("%s: %w", f, err)
		}
		byVariant[name] = append(byVariant[name], r)
	}
	if variants == nil {
		for n := range byVariant {
			variants = append(variants, n)
		}
		slices.Sort(variants)
	}
	var b strings.Builder
	overheadSummary(&b, variants, byVariant)
	cpSummary(&b, variants, byVariant)
	if b.Len() == 0 {
		return "", fmt.Errorf("no overhead or cp results in %s", dir)
	}
	return b.String(), nil
}

// medianOf renders the median of xs and, in brackets, every value in run
// order; zeros (not measured) are left out.
func medianOf(xs []float64, format string) string {
	return medianAll(slices.DeleteFunc(slices.Clone(xs), func(x float64) bool { return x == 0 }), format)
}

// medianAll is medianOf for figures where zero is a measurement.
func medianAll(xs []float64, format string) string {
	if len(xs) == 0 {
		return "-"
	}
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return fmt.Sprintf("**"+format+"** (%s)", Percentile(xs, 50), strings.Join(parts, ", "))
}

func overheadSummary(b *strings.Builder, variants []string, runs map[string][]alternateRun) {
	header := false
	for _, v := range variants {
		var overNginx, overCaddy, cart, cartCPU, nginxCPU, caddyCPU []float64
		for _, r := range runs[v] {
			rounds := r.rounds()
			if len(rounds) == 0 {
				continue
			}
			if len(r.Rounds) == 0 {
				r.CartOverNginx, r.CartOverCaddy = rounds[0].CartOverNginx, rounds[0].CartOverCaddy
			}
			overNginx = append(overNginx, r.CartOverNginx)
			overCaddy = append(overCaddy, r.CartOverCaddy)
			for _, rd := range rounds {
				cart = append(cart, rd.Cart.ReqPerS)
				cartCPU = append(cartCPU, rd.Cart.CPUUsPerReq)
				nginxCPU = append(nginxCPU, rd.Nginx.CPUUsPerReq)
				caddyCPU = append(caddyCPU, rd.Caddy.CPUUsPerReq)
			}
		}
		if len(overNginx) == 0 {
			continue
		}
		if !header {
			b.WriteString("Proxy overhead: the ratios are each run's median round; requests/s and CPU µs per request are every round's.\n\n" +
				"| variant | runs | CART / nginx | CART / Caddy | CART req/s | CART CPU µs/req | nginx CPU µs/req | Caddy CPU µs/req |\n|---|---|---|---|---|---|---|---|\n")
			header = true
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", v, len(overNginx), medianOf(overNginx, "%.2f"), medianOf(overCaddy, "%.2f"),
			medianOf(cart, "%.0f"), medianOf(cartCPU, "%.0f"), medianOf(nginxCPU, "%.0f"), medianOf(caddyCPU, "%.0f"))
	}
	if header {
		b.WriteString("\n")
	}
}

func cpSummary(b *strings.Builder, variants []string, runs map[string][]alternateRun) {
	// The runs' names in the order the benchmark ran them.
	var names []string
	order := map[string]int{}
	for _, v := range variants {
		for _, r := range runs[v] {
			for i, cr := range r.Runs {
				if _, ok := order[cr.Name]; !ok {
					order[cr.Name] = i
					names = append(names, cr.Name)
				}
			}
		}
	}
	if len(names) == 0 {
		return
	}
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(order[a], order[b]) })
	b.WriteString("Control plane: medians, then every run's figure in run order.\n\n" +
		"| run | variant | n | routes/s | p99 ms | decide p99 µs | leader µs/route | followers µs/route | fallbacks |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, name := range names {
		for _, v := range variants {
			var rps, p99, decide, leader, followers, fallbacks []float64
			for _, r := range runs[v] {
				for _, cr := range r.Runs {
					if cr.Name != name {
						continue
					}
					rps = append(rps, cr.RoutesPerS)
					p99 = append(p99, cr.LatencyMs.P99)
					decide = append(decide, cr.DecideP99Us)
					leader = append(leader, cr.CPULeaderUs)
					followers = append(followers, cr.CPUFollowersUs)
					fallbacks = append(fallbacks, float64(cr.Fallbacks))
				}
			}
			if len(rps) == 0 {
				continue
			}
			fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", name, v, len(rps), medianOf(rps, "%.0f"), medianOf(p99, "%.1f"),
				medianOf(decide, "%.0f"), medianOf(leader, "%.0f"), medianOf(followers, "%.0f"), medianAll(fallbacks, "%.0f"))
		}
	}
	b.WriteString("\n")
}
