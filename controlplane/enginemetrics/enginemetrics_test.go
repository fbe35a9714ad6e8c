package enginemetrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/internal/testkit"
)

// Shapes of the engines' real expositions (names, labels, TYPE lines).
const vllmText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.93
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 12.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{model_name="m"} 12.0
`

const sglangText = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 8.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 5.0
`

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		text string
		want engine.EngineLoad
		err  bool
	}{
		{"vllm, two data-parallel engines summed", vllmText, engine.EngineLoad{Running: 7, Waiting: 2}, false},
		{"sglang", sglangText, engine.EngineLoad{Running: 8, Waiting: 5}, false},
		{"untyped lines", "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n", engine.EngineLoad{Running: 1}, false},
		{"nan and negative count as 0", "vllm:num_requests_running NaN\nvllm:num_requests_waiting -3\n", engine.EngineLoad{}, false},
		{"other engine", "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n", engine.EngineLoad{}, true},
		{"only running", "vllm:num_requests_running 1\n", engine.EngineLoad{}, true},
		{"garbage", "vllm:num_requests_running{ 1\n", engine.EngineLoad{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Parse(strings.NewReader(c.text))
			if (err != nil) != c.err || got != c.want {
				t.Fatalf("Parse = %+v, %v; want %+v, error %v", got, err, c.want, c.err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(vllmText)
	f.Add(sglangText)
	f.Add("vllm:num_requests_running 1e300\nvllm:num_requests_waiting 1\n")
	f.Fuzz(func(t *testing.T, text string) {
		l, err := Parse(strings.NewReader(text))
		if err == nil && (l.Running < 0 || l.Waiting < 0) {
			t.Fatalf("negative load %+v", l)
		}
	})
}

// The scraper reads every worker with its key and hands the loads over.
func TestScraperRound(t *testing.T) {
	var gotAuth sync.Map
	srv := func(text string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotAuth.Store(r.Host, r.Header.Get("Authorization"))
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(text))
		}))
	}
	a, b := srv(vllmText), srv("nothing useful 1\n")
	defer a.Close()
	defer b.Close()
	var mu sync.Mutex
	var logs testkit.SyncBuffer
	seen := map[string]engine.EngineLoad{}
	s := &Scraper{Client: http.DefaultClient, Path: "/metrics", Interval: time.Hour, Timeout: 2 * time.Second,
		Workers: func() []string { return []string{a.URL, b.URL} },
		Key:     func(w string) string { return "k-" + strings.TrimPrefix(w, "http://") },
		Observe: func(w string, l engine.EngineLoad) (before, after int) {
			mu.Lock()
			defer mu.Unlock()
			seen[w] = l
			return 0, 7 // as a first queueing read sets the limit
		},
		Log: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	s.Round(context.Background())
	if line := logs.String(); !strings.Contains(line, `msg="learned engine concurrency changed" worker=`+a.URL+" limit=7 engine_running=7 engine_waiting=2") {
		t.Fatalf("a changed limit is not logged as such: %q", line)
	}
	if len(seen) != 1 || seen[a.URL] != (engine.EngineLoad{Running: 7, Waiting: 2}) {
		t.Fatalf("observed %v", seen)
	}
	if v, _ := gotAuth.Load(strings.TrimPrefix(a.URL, "http://")); v != "Bearer k-"+strings.TrimPrefix(a.URL, "http://") {
		t.Fatalf("worker key not sent: %v", v)
	}
}

// A read that raised the limit (a probe) is followed within the same round
// by a second read, which sees whether the engine had room; a read that
// changed nothing, or lowered the limit, is not.
func TestProbeIsCheckedAgainSoon(t *testing.T) {
	var reads atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		waiting := 0
		if reads.Add(1) > 1 {
			waiting = 1 // the request the raise let through waits
		}
		fmt.Fprintf(w, "vllm:num_requests_running 4\nvllm:num_requests_waiting %d\n", waiting)
	}))
	defer srv.Close()
	var seen []engine.EngineLoad
	s := &Scraper{Client: http.DefaultClient, Path: "/metrics", Interval: 200 * time.Millisecond, Timeout: 2 * time.Second,
		Workers: func() []string { return []string{srv.URL} },
		Observe: func(w string, l engine.EngineLoad) (before, after int) {
			seen = append(seen, l) // reads of one worker never overlap
			if len(seen) == 1 {
				return 4, 5 // raised: a probe
			}
			return 5, 4 // lowered: the engine queued
		},
	}
	s.Round(context.Background())
	want := []engine.EngineLoad{{Running: 4}, {Running: 4, Waiting: 1}}
	if !slices.Equal(seen, want) {
		t.Fatalf("one round observed %v, want the probe's read and the check after it %v", seen, want)
	}
}
