package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// TestFlowControlLearnsAndQueues runs the real binary with every flow
// switch on in front of cart-sim engines with a batch limit: it learns
// each engine's concurrency from its metrics, queues what the engines
// cannot run (no engine queue builds up once learned), serves every
// request, sheds the sheddable ones while saturated, and keeps serving
// after idling past its maintenance and scrape cycles.
func TestFlowControlLearnsAndQueues(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	reps := simtest.URLs(t, 2, func(i int) sim.Config {
		return sim.Config{Name: fmt.Sprint("r", i), MaxRunning: 2, MaxConcurrency: 2, OutputTokens: 10, DecodeMsPerToken: 5, TimeScale: 1, PriorityScheduling: true}
	})
	port := testkit.FreePort(t)
	cfg := fmt.Sprintf(`server: {host: 127.0.0.1, port: %d, min_open_files: 0}
log: {level: info}
cache: {eviction_interval_secs: 0.2}
health: {interval_secs: 0.2, timeout_secs: 0.2}
auth:
  client_keys:
    - {name: calm, key: calm-key-0123456789, priority: 5, max_priority: 5, weight: 2}
    - {name: batch, key: batch-key-0123456789, priority: -1}
    - {name: flood, key: flood-key-0123456789}
flow:
  enabled: true
  queue_timeout_secs: 20
  tenant_header: X-Fairness-Id
  reserve_priority: 5
  reserve_slots: 1
  reserve_window_secs: 1
  return_credit: 3
  engine_priority: true
  learn_concurrency: true
  metrics_interval_secs: 0.1
workers:
  - url: %s
  - url: %s
`, port, reps[0], reps[1])
	cfgPath := filepath.Join(t.TempDir(), "cart.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := proc.Start(t, proc.Cmd{Path: bin, Args: []string{"-c", cfgPath}})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p.WaitFor(t, 15*time.Second, "serving", func() (bool, string) {
		resp, err := http.Get(base + "/health")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	post := func(key, text string, hdr ...string) (int, string) {
		body := fmt.Sprintf(`{"model":"cart-sim","messages":[{"role":"user","content":%q}]}`, text)
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// A flood of 16 at once into 2 x 2 sequences: the engines queue at
	// first, CART learns their concurrency, and then holds the rest.
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for round := range 2 {
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, _ := post("flood-key-0123456789", fmt.Sprintf("flood %d %d", round, i), "X-Fairness-Id", fmt.Sprint("user", i%3))
				mu.Lock()
				codes[c]++
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	if codes[200] != 32 {
		t.Fatalf("flood answers %v, want 32 x 200", codes)
	}
	var view struct {
		Workers []struct {
			URL              string `json:"url"`
			ConcurrencyLimit int    `json:"concurrency_limit"`
		} `json:"workers"`
		Queue struct {
			Waiting int `json:"waiting"`
		} `json:"queue"`
	}
	resp, err := http.Get(base + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&view)
	resp.Body.Close()
	if err != nil || len(view.Workers) != 2 {
		t.Fatalf("GET /workers: %v, %+v; want both workers", err, view)
	}
	for _, w := range view.Workers {
		if w.ConcurrencyLimit != 2 {
			t.Fatalf("worker %s: learned concurrency %d, want the engine's 2 (%+v)", w.URL, w.ConcurrencyLimit, view)
		}
	}
	metrics := func() string {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if v, found, err := testkit.MetricSample(nil, base+"/metrics", "cart_flow_enqueued_total"); err != nil || !found || v == 0 {
		t.Fatalf("nothing waited in CART's queue (cart_flow_enqueued_total %v, found %v, %v):\n%s", v, found, err, grepLines(metrics(), "cart_flow_"))
	}

	// Saturated again: the sheddable tenant is refused at once with 429.
	release := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			post("flood-key-0123456789", fmt.Sprint("hold ", i))
		}()
	}
	close(release)
	// The 8 take about 100 ms (two rounds of the 4 sequences): wait until
	// CART holds some of them in its queue.
	p.WaitFor(t, 10*time.Second, "the flood queued", func() (bool, string) {
		for _, l := range strings.Split(metrics(), "\n") {
			if v, ok := strings.CutPrefix(l, "cart_flow_queued "); ok {
				return v != "0", l
			}
		}
		return false, "no cart_flow_queued"
	})
	c, body := post("batch-key-0123456789", "batch while saturated")
	wg.Wait()
	if c != http.StatusTooManyRequests || !strings.Contains(body, "request_shed") {
		t.Fatalf("sheddable request on a saturated pool: %d %s, want 429 request_shed", c, body)
	}

	// Idle past maintenance passes (and the health and scrape cycles
	// within them), then serve.
	idlePastMaintenance(t, p, base+"/metrics", time.Second)
	if !p.Running() {
		t.Fatalf("cart exited while idle:\n%s", p.Log.String())
	}
	if c, body := post("calm-key-0123456789", "after idling", "X-CART-Priority", "9"); c != 200 {
		t.Fatalf("after idling: %d %s", c, body)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
