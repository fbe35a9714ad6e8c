package bench

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// OverheadConfig drives the proxy-overhead benchmark: a closed loop of
// Concurrency clients sending tiny non-streaming requests for Duration to
// each target in front of one replica that never sleeps.
type OverheadConfig struct {
	Duration    time.Duration `json:"duration_ns"`
	Warmup      time.Duration `json:"warmup_ns"`
	Concurrency int           `json:"concurrency"`
	// MaxRequests bounds each target's loop in count as Duration bounds it
	// in time.
	MaxRequests int `json:"max_requests"`
	// PromptChars is the length of the fixed prompt.
	PromptChars int `json:"prompt_chars"`
	// UseWrk drives the load with wrk instead, when installed.
	UseWrk bool `json:"use_wrk"`
	// Rounds alternates nginx, Caddy and CART this many times, all kept
	// running: on a shared machine one pair measured 10 s apart can see
	// different neighbours, so the ratio reported is the median of the
	// rounds' ratios (1: one pair).
	Rounds int `json:"rounds"`
}

// DefaultOverhead returns 10 s per target at concurrency 32, three rounds.
func DefaultOverhead() OverheadConfig {
	return OverheadConfig{Duration: 10 * time.Second, Warmup: time.Second, Concurrency: 32, MaxRequests: 2_000_000, PromptChars: 512, Rounds: 3}
}

// maxOverheadRounds bounds --rounds: each takes twice the duration.
const maxOverheadRounds = 50

// Validate refuses settings that would measure nothing or never end.
func (c OverheadConfig) Validate() error {
	switch {
	case c.Duration <= 0 || c.Duration > time.Hour:
		return fmt.Errorf("overhead benchmark: duration %s out of range (0, 1h]", c.Duration)
	case c.Concurrency < 1 || c.Concurrency > 10_000:
		return fmt.Errorf("overhead benchmark: concurrency %d out of range 1..10000", c.Concurrency)
	case c.Rounds < 1 || c.Rounds > maxOverheadRounds:
		return fmt.Errorf("overhead benchmark: rounds %d out of range 1..%d", c.Rounds, maxOverheadRounds)
	}
	return nil
}

// OverheadTarget is one target's figures.
type OverheadTarget struct {
	Name     string  `json:"name"`
	URL      string  `json:"url,omitempty"`
	Tool     string  `json:"tool,omitempty"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	ReqPerS  float64 `json:"req_per_s"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	// CPUUsPerReq is the CPU time (user+system) the target's process(es)
	// used per request during the measured loop: for direct, the replica's.
	CPUUsPerReq float64 `json:"cpu_us_per_req,omitempty"`
	Skipped     string  `json:"skipped,omitempty"`
}

// OverheadResult compares the targets.
type OverheadResult struct {
	Config  OverheadConfig   `json:"config"`
	Targets []OverheadTarget `json:"targets"`
	// CartOverNginx is CART's throughput divided by nginx's: the median
	// of the rounds' ratios. Targets holds direct, and nginx, Caddy and
	// CART from the round with that median.
	CartOverNginx float64 `json:"cart_over_nginx"`
	// CartOverCaddy is the median of the rounds' CART/Caddy ratios (0
	// when Caddy is not installed): Caddy is the Go reverse proxy on
	// net/http that CART's requests/s are held against.
	CartOverCaddy float64 `json:"cart_over_caddy,omitempty"`
	// Rounds are the alternating nginx/Caddy/CART runs, in order.
	Rounds []OverheadRound `json:"rounds,omitempty"`
}

// OverheadRound is one nginx run, one Caddy run and one CART run.
type OverheadRound struct {
	Nginx         OverheadTarget `json:"nginx"`
	Caddy         OverheadTarget `json:"caddy"`
	Cart          OverheadTarget `json:"cart"`
	CartOverNginx float64        `json:"cart_over_nginx"`
	CartOverCaddy float64        `json:"cart_over_caddy,omitempty"`
}

// medianRound returns the index of the round whose ratio (by) is the
// median (the lower middle one for an even count), or -1 when no round has
// one.
func medianRound(rounds []OverheadRound, by func(OverheadRound) float64) int {
	var idx []int
	for i, r := range rounds {
		if by(r) > 0 {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return -1
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(by(rounds[a]), by(rounds[b])) })
	return idx[(len(idx)-1)/2]
}

func overNginx(r OverheadRound) float64 { return r.CartOverNginx }
func overCaddy(r OverheadRound) float64 { return r.CartOverCaddy }

// ratio is a/b's requests per second, 0 when either is missing.
func ratio(a, b OverheadTarget) float64 {
	if a.Skipped != "" || b.Skipped != "" || a.ReqPerS <= 0 || b.ReqPerS <= 0 {
		return 0
	}
	return a.ReqPerS / b.ReqPerS
}

func overheadBody(promptChars int) []byte {
	prompt := TextTokens(9, 1, max(promptChars/BytesPerToken, 1))
	return []byte(fmt.Sprintf(`{"model":"cart-sim","max_tokens":1,"messages":[{"role":"user","content":%q}]}`, prompt))
}

// LoadClosedLoop sends POST body to url from conc workers until d passes or
// maxReqs requests are done, and measures throughput and latency.
func LoadClosedLoop(ctx context.Context, url string, body []byte, conc int, d time.Duration, maxReqs int) OverheadTarget {
	hc := NewHTTPClient(conc)
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lat []float64
	var errs, n int
	var wg sync.WaitGroup
	start := time.Now()
	for range max(conc, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]float64, 0, 1024)
			localErrs := 0
			defer func() {
				mu.Lock()
				lat = append(lat, local...)
				errs += localErrs
				mu.Unlock()
			}()
			for ctx.Err() == nil {
				mu.Lock()
				if n >= maxReqs {
					mu.Unlock()
					return
				}
				n++
				mu.Unlock()
				t0 := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						localErrs++
					}
					continue
				}
				_, err = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					if ctx.Err() == nil {
						localErrs++
					}
					continue
				}
				local = append(local, ms(time.Since(t0)))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	t := OverheadTarget{URL: url, Tool: "go", Requests: len(lat), Errors: errs}
	if el > 0 {
		t.ReqPerS = float64(len(lat)) / el
	}
	if len(lat) > 0 {
		l := latencyOf(lat)
		t.P50Ms, t.P99Ms = l.P50, l.P99
	}
	return t
}

// RunOverhead measures direct, nginx, Caddy and CART all-in-one in front
// of one cart-sim with --time-scale 0.
func RunOverhead(ctx context.Context, env *Env, c OverheadConfig) OverheadResult {
	res := OverheadResult{Config: c}
	s := &suite{env: env, cfg: env.Cfg, cartBin: filepath.Join(env.Cfg.BinDir, "cart"), simBin: filepath.Join(env.Cfg.BinDir, "cart-sim")}
	s.nginx, _ = exec.LookPath("nginx")
	s.caddy, _ = exec.LookPath("caddy")
	skipAll := func(reason string) OverheadResult {
		for _, n := range []string{"direct", "nginx", "caddy", "cart"} {
			res.Targets = append(res.Targets, OverheadTarget{Name: n, Skipped: reason})
		}
		return res
	}
	port, err := env.FreePort()
	if err != nil {
		return skipAll(err.Error())
	}
	rep := &replica{name: "fast", port: port}
	p, err := env.Start("overhead-sim", s.simBin, "--listen", hostPort(port), "--name", "fast",
		"--time-scale", "0", "--max-concurrency", "1024", "--cache-tokens", "0")
	if err == nil {
		err = env.WaitReady(ctx, p, env.Cfg.StartTimeout, env.httpOK(baseURL(port)+"/health"))
	}
	if p != nil {
		defer env.StopAll([]*Proc{p})
	}
	if err != nil {
		return skipAll("replica: " + err.Error())
	}
	s.replicas = []*replica{rep}
	dir := env.Path("overhead")
	_ = os.MkdirAll(dir, 0o755)
	body := overheadBody(c.PromptChars)

	measure := func(name, base string, procs ...*Proc) OverheadTarget {
		url := base + "/v1/chat/completions"
		cpu := func() time.Duration {
			var d time.Duration
			for _, p := range procs {
				d += p.CPUTime()
			}
			return d
		}
		if c.UseWrk {
			if t, err := runWrk(ctx, dir, url, body, c); err == nil {
				t.Name = name
				return t
			} else {
				env.Logf("   wrk: %v; using the Go load generator", err)
			}
		}
		if c.Warmup > 0 {
			LoadClosedLoop(ctx, url, body, c.Concurrency, c.Warmup, c.MaxRequests)
		}
		cpu0 := cpu()
		t := LoadClosedLoop(ctx, url, body, c.Concurrency, c.Duration, c.MaxRequests)
		if t.Requests > 0 {
			t.CPUUsPerReq = float64((cpu() - cpu0).Microseconds()) / float64(t.Requests)
		}
		t.Name = name
		return t
	}

	res.Targets = append(res.Targets, measure("direct", baseURL(port), p))

	// The proxies run for the whole section (idle while another is
	// measured), so that the rounds can alternate.
	nginxURL, nginxProcs, nginxErr := s.startNginx(ctx, dir, "overhead-nginx", []string{hostPort(port)}, false)
	defer env.StopAll(nginxProcs)
	caddyURL, caddyProcs, caddyErr := s.startCaddy(ctx, dir, "overhead-caddy", hostPort(port))
	defer env.StopAll(caddyProcs)
	cartURL, cartProcs, cartErr := "", []*Proc(nil), error(nil)
	if cport, err := env.FreePort(); err != nil {
		cartErr = err
	} else {
		cartURL = baseURL(cport)
		cartProcs, cartErr = s.startCart(ctx, dir, "overhead-cart", cport, "")
	}
	defer env.StopAll(cartProcs)
	for range max(c.Rounds, 1) {
		if ctx.Err() != nil {
			break
		}
		run := func(name, url string, procs []*Proc, err error) OverheadTarget {
			if err != nil {
				return OverheadTarget{Name: name, Skipped: err.Error()}
			}
			return measure(name, url, procs...)
		}
		r := OverheadRound{
			Nginx: run("nginx", nginxURL, nginxProcs, nginxErr),
			Caddy: run("caddy", caddyURL, caddyProcs, caddyErr),
			Cart:  run("cart", cartURL, cartProcs, cartErr),
		}
		r.CartOverNginx, r.CartOverCaddy = ratio(r.Cart, r.Nginx), ratio(r.Cart, r.Caddy)
		res.Rounds = append(res.Rounds, r)
	}
	pick := 0
	if m := medianRound(res.Rounds, overNginx); m >= 0 {
		pick = m
		res.CartOverNginx = res.Rounds[m].CartOverNginx
	}
	if m := medianRound(res.Rounds, overCaddy); m >= 0 {
		res.CartOverCaddy = res.Rounds[m].CartOverCaddy
	}
	if len(res.Rounds) > 0 {
		rd := res.Rounds[pick]
		res.Targets = append(res.Targets, rd.Nginx, rd.Caddy, rd.Cart)
	}
	return res
}

var (
	wrkRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct = regexp.MustCompile(`(?m)^\s+(50|99)(?:\.0+)?%\s+([0-9.]+)(us|ms|s)\b`)
	wrkReq = regexp.MustCompile(`(\d+) requests in`)
	wrkErr = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// runWrk drives url with wrk (POSTing body) and parses its report.
func runWrk(ctx context.Context, dir, url string, body []byte, c OverheadConfig) (OverheadTarget, error) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		return OverheadTarget{}, fmt.Errorf("wrk not installed (apt-get install -y wrk)")
	}
	script := filepath.Join(dir, "post.lua")
	lua := fmt.Sprintf("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = %q\n", string(body))
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return OverheadTarget{}, err
	}
	secs := max(int(c.Duration.Seconds()), 1)
	cctx, cancel := context.WithTimeout(ctx, c.Duration+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, bin, "-t", "2", "-c", strconv.Itoa(c.Concurrency), "-d", strconv.Itoa(secs)+"s",
		"--latency", "-s", script, url).CombinedOutput()
	if err != nil {
		return OverheadTarget{}, fmt.Errorf("wrk: %v: %s", err, lastLine(string(out)))
	}
	return parseWrk(string(out), url)
}

func parseWrk(out, url string) (OverheadTarget, error) {
	t := OverheadTarget{URL: url, Tool: "wrk"}
	m := wrkRPS.FindStringSubmatch(out)
	if m == nil {
		return t, fmt.Errorf("wrk output has no Requests/sec")
	}
	t.ReqPerS, _ = strconv.ParseFloat(m[1], 64)
	if m := wrkReq.FindStringSubmatch(out); m != nil {
		t.Requests, _ = strconv.Atoi(m[1])
	}
	if m := wrkErr.FindStringSubmatch(out); m != nil {
		t.Errors, _ = strconv.Atoi(m[1])
	}
	for _, m := range wrkPct.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if m[1] == "50" {
			t.P50Ms = v
		} else {
			t.P99Ms = v
		}
	}
	return t, nil
}

// FormatOverhead renders the overhead result as text.
func FormatOverhead(r OverheadResult) string {
	var b strings.Builder
	for _, t := range r.Targets {
		if t.Skipped != "" {
			fmt.Fprintf(&b, "%-7s skipped: %s\n", t.Name, t.Skipped)
			continue
		}
		fmt.Fprintf(&b, "%-7s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  %d requests, %d errors (%s)",
			t.Name, t.ReqPerS, t.P50Ms, t.P99Ms, t.Requests, t.Errors, t.Tool)
		if t.CPUUsPerReq > 0 {
			fmt.Fprintf(&b, "  %.0f CPU µs/req", t.CPUUsPerReq)
		}
		b.WriteString("\n")
	}
	if len(r.Rounds) > 1 {
		for i, rd := range r.Rounds {
			fmt.Fprintf(&b, "round %d: nginx %s, caddy %s, cart %s, cart/nginx %s, cart/caddy %s\n", i+1,
				roundTarget(rd.Nginx), roundTarget(rd.Caddy), roundTarget(rd.Cart), roundRatio(rd.CartOverNginx), roundRatio(rd.CartOverCaddy))
		}
	}
	if r.CartOverNginx > 0 {
		fmt.Fprintf(&b, "cart/nginx throughput: %.2f%s\n", r.CartOverNginx, r.medianNote("lines"))
	}
	if r.CartOverCaddy > 0 {
		fmt.Fprintf(&b, "cart/caddy throughput: %.2f%s\n", r.CartOverCaddy, r.caddyMedianNote())
	}
	return b.String()
}

// caddyMedianNote says that the CART/Caddy ratio is a median of its own.
func (r OverheadResult) caddyMedianNote() string {
	if len(r.Rounds) <= 1 {
		return ""
	}
	return fmt.Sprintf(" (median of %d rounds' own ratios)", len(r.Rounds))
}

// medianNote says, after the ratio, that it is the median round's and
// which round the target rows (or lines) show; "" for a single round.
func (r OverheadResult) medianNote(rows string) string {
	if len(r.Rounds) <= 1 {
		return ""
	}
	return fmt.Sprintf(" (median of %d rounds; the nginx and cart %s above are that round's)", len(r.Rounds), rows)
}

// roundTarget is one target's figures in a round's line.
func roundTarget(t OverheadTarget) string {
	if t.Skipped != "" {
		return "skipped"
	}
	s := fmt.Sprintf("%.0f req/s", t.ReqPerS)
	if t.CPUUsPerReq > 0 {
		s += fmt.Sprintf(" at %.0f CPU µs/req", t.CPUUsPerReq)
	}
	return s
}

func roundRatio(x float64) string {
	if x <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x)
}
