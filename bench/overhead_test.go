package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func round(nginx, cart float64) OverheadRound {
	return round3(nginx, 0, cart)
}

func round3(nginx, caddy, cart float64) OverheadRound {
	r := OverheadRound{Nginx: OverheadTarget{Name: "nginx", ReqPerS: nginx}, Caddy: OverheadTarget{Name: "caddy", ReqPerS: caddy},
		Cart: OverheadTarget{Name: "cart", ReqPerS: cart}}
	if caddy == 0 {
		r.Caddy.Skipped = "caddy not found"
	}
	r.CartOverNginx, r.CartOverCaddy = ratio(r.Cart, r.Nginx), ratio(r.Cart, r.Caddy)
	return r
}

// The reported ratio is the median round's, whose nginx and cart figures
// are the ones reported; rounds missing a side do not count.
func TestMedianRound(t *testing.T) {
	for name, c := range map[string]struct {
		rounds []OverheadRound
		want   int
	}{
		"none":           {nil, -1},
		"no pair":        {[]OverheadRound{round(1000, 0)}, -1},
		"one":            {[]OverheadRound{round(1000, 700)}, 0},
		"odd":            {[]OverheadRound{round(1000, 800), round(1000, 500), round(1000, 700)}, 2},
		"even, lower":    {[]OverheadRound{round(1000, 800), round(1000, 500), round(1000, 700), round(1000, 900)}, 2},
		"skips the hole": {[]OverheadRound{round(1000, 0), round(1000, 900), round(1000, 600)}, 2},
	} {
		if got := medianRound(c.rounds, overNginx); got != c.want {
			t.Errorf("%s: round %d, want %d", name, got, c.want)
		}
	}
}

func TestOverheadValidate(t *testing.T) {
	if err := DefaultOverhead().Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	if DefaultOverhead().Rounds < 3 {
		t.Errorf("default rounds %d: one pair 10 s apart is what made the ratio noisy", DefaultOverhead().Rounds)
	}
	for name, mod := range map[string]func(*OverheadConfig){
		"no rounds":   func(c *OverheadConfig) { c.Rounds = 0 },
		"rounds":      func(c *OverheadConfig) { c.Rounds = maxOverheadRounds + 1 },
		"duration":    func(c *OverheadConfig) { c.Duration = 0 },
		"concurrency": func(c *OverheadConfig) { c.Concurrency = 0 },
	} {
		c := DefaultOverhead()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestFormatOverheadRounds(t *testing.T) {
	rounds := []OverheadRound{round(1000, 800), round(1000, 500), round(1000, 700)}
	rounds[0].Cart.CPUUsPerReq = 95
	rounds[1].Cart.Skipped = "x"
	rounds[1].CartOverNginx = 0
	m := medianRound(rounds, overNginx)
	r := OverheadResult{Config: OverheadConfig{Duration: time.Second}, Rounds: rounds, CartOverNginx: rounds[m].CartOverNginx,
		Targets: []OverheadTarget{{Name: "direct", ReqPerS: 2000}, rounds[m].Nginx, rounds[m].Cart}}
	out := FormatOverhead(r)
	for _, want := range []string{
		"round 1: nginx 1000 req/s, caddy skipped, cart 800 req/s at 95 CPU µs/req, cart/nginx 0.80, cart/caddy -\n",
		"round 2: nginx 1000 req/s, caddy skipped, cart skipped, cart/nginx -, cart/caddy -\n",
		"cart/nginx throughput: 0.70 (median of 3 rounds",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	res := &SuiteResults{Overhead: &r}
	md := SummaryMarkdown(res, nil)
	for _, want := range []string{"| 1 | 1000 req/s | skipped | 800 req/s at 95 CPU µs/req | 0.80 | - |", "**0.70** (median of 3 rounds"} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}
}

// CART is held against Caddy as against nginx: each round's ratio, their
// median reported on its own (it may come from another round than the
// nginx one).
func TestOverheadAgainstCaddy(t *testing.T) {
	rounds := []OverheadRound{round3(1000, 600, 800), round3(1000, 900, 700), round3(1000, 700, 600)}
	if m := medianRound(rounds, overCaddy); m != 2 {
		t.Fatalf("caddy median round %d, want 2 (ratios 1.33, 0.78, 0.86)", m)
	}
	m := medianRound(rounds, overNginx)
	r := OverheadResult{Rounds: rounds, CartOverNginx: rounds[m].CartOverNginx, CartOverCaddy: rounds[medianRound(rounds, overCaddy)].CartOverCaddy,
		Targets: []OverheadTarget{rounds[m].Nginx, rounds[m].Caddy, rounds[m].Cart}}
	out := FormatOverhead(r)
	for _, want := range []string{
		"round 1: nginx 1000 req/s, caddy 600 req/s, cart 800 req/s, cart/nginx 0.80, cart/caddy 1.33\n",
		"cart/caddy throughput: 0.86 (median of 3 rounds' own ratios)",
		"caddy        900 req/s", // the nginx median's round
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if md := SummaryMarkdown(&SuiteResults{Overhead: &r}, nil); !strings.Contains(md, "CART / Caddy throughput: **0.86**") {
		t.Errorf("summary lacks the Caddy ratio:\n%s", md)
	}
}

// The Caddyfile is one the installed Caddy accepts (Debian's 2.6 lacks
// some global options of later versions).
func TestCaddyConfig(t *testing.T) {
	c := CaddyConfig(8080, "127.0.0.1:9000")
	for _, want := range []string{"admin off", "http://127.0.0.1:8080 {", "reverse_proxy 127.0.0.1:9000"} {
		if !strings.Contains(c, want) {
			t.Errorf("Caddyfile lacks %q:\n%s", want, c)
		}
	}
	bin, err := exec.LookPath("caddy")
	if err != nil {
		t.Skip("caddy not installed")
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "adapt", "--adapter", "caddyfile", "--config", conf)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_CONFIG_HOME="+dir, "XDG_DATA_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("caddy adapt: %v\n%s", err, out)
	}
}
