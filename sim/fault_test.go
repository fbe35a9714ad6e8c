package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

func TestFaultDownClosesConnections(t *testing.T) {
	s, ts := startReplica(t, Config{})
	if err := s.SetFault(Fault{Mode: FaultDown}); err != nil {
		t.Fatal(err)
	}

	resp, err := post(t, context.Background(), ts, pathChat, chatBody("anyone there?"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a down replica answered %s", resp.Status)
	}
	if _, _, err := get(t, ts, "/v1/models"); err == nil {
		t.Fatal("a down replica answered /v1/models")
	}
	if _, _, err := get(t, ts, "/metrics"); err == nil {
		t.Fatal("a down replica answered /metrics")
	}
	resp, body, err := get(t, ts, "/health")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("health while down: %v %v %s", resp, err, body)
	}
	// The control plane stays reachable, or the fault could not be lifted.
	resp, body, err = get(t, ts, "/sim/stats")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stats while down: %v %s", err, body)
	}
	var st Stats
	if err := json.Unmarshal(body, &st); err != nil || st.Requests != 1 {
		t.Fatalf("stats %s (%v): want the aborted request counted", body, err)
	}

	if resp, body := mustPost(t, ts, "/sim/fault", `{"mode":"none"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("clearing the fault: %d %s", resp.StatusCode, body)
	}
	complete(t, ts, pathChat, chatBody("back again"))
	if resp, _, err := get(t, ts, "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health after recovery: %v %v", resp, err)
	}
	_, metrics, _ := get(t, ts, "/metrics")
	if !strings.Contains(string(metrics), `sim_requests_total{endpoint="/v1/chat/completions",status="aborted"} 1`) {
		t.Fatalf("aborted request not in metrics:\n%s", metrics)
	}
}

func TestFaultDownCutsStreamsInFlight(t *testing.T) {
	s, ts := startReplica(t, Config{DecodeMsPerToken: 60_000, OutputTokens: 3, TimeScale: 1})
	resp, sr := openStream(t, context.Background(), ts, ts.URL+pathChat, chatBody("long answer", "stream", true))
	defer resp.Body.Close()
	if _, err := sr.next(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetFault(Fault{Mode: FaultDown}); err != nil {
		t.Fatal(err)
	}
	// A dead process does not finish its chunked response: the client must
	// see a broken stream, not a clean end.
	_, err := sr.readAll()
	if err == nil || err == io.EOF {
		t.Fatalf("stream ended with %v, want a transport error", err)
	}
	testkit.WaitFor(t, 10*time.Second, "the aborted request to stop running", func() bool { return s.Stats().Running == 0 })
}

func TestFaultErrorAnswersStatus(t *testing.T) {
	s, ts := startReplica(t, Config{})
	if resp, body := mustPost(t, ts, "/sim/fault", `{"mode":"error","status":429}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("setting the fault: %d %s", resp.StatusCode, body)
	}
	if f := s.Fault(); f != (Fault{Mode: FaultError, Status: 429}) {
		t.Fatalf("fault = %+v", f)
	}

	resp, body := mustPost(t, ts, pathChat, chatBody("hi"))
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	var oe struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &oe); err != nil || oe.Error.Message == "" || oe.Error.Type == "" {
		t.Fatalf("error body %s (%v)", body, err)
	}
	if resp.Header.Get("X-Sim-Replica") != DefaultName {
		t.Fatalf("X-Sim-Replica = %q on an error", resp.Header.Get("X-Sim-Replica"))
	}

	// Anthropic clients get Anthropic's error shape.
	resp, body = mustPost(t, ts, pathMessages, `{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	var ae struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &ae); err != nil || resp.StatusCode != 429 || ae.Type != "error" || ae.Error.Type != "rate_limit_error" {
		t.Fatalf("anthropic error %d %s", resp.StatusCode, body)
	}

	if resp, _, err := get(t, ts, "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health must stay 200 in error mode: %v %v", resp, err)
	}
	if err := s.SetFault(Fault{Mode: FaultError}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := mustPost(t, ts, pathChat, chatBody("hi")); resp.StatusCode != DefaultFaultStatus {
		t.Fatalf("default fault status %d, want %d", resp.StatusCode, DefaultFaultStatus)
	}
}

func TestFaultSlowDelaysFirstByte(t *testing.T) {
	// Timers never fire early, so a lower bound on elapsed time is exact.
	s, ts := startReplica(t, Config{})
	if err := s.SetFault(Fault{Mode: FaultSlow, DelayMS: 150}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	complete(t, ts, pathChat, chatBody("slowly"))
	if elapsed := time.Since(begin); elapsed < 150*time.Millisecond {
		t.Fatalf("slow replica answered after %v, want at least 150ms", elapsed)
	}
	// The delay honours a client giving up.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := s.SetFault(Fault{Mode: FaultSlow, DelayMS: 60_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := post(t, ctx, ts, pathChat, chatBody("never mind")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
}

func TestFaultValidation(t *testing.T) {
	s, ts := startReplica(t, Config{})
	for _, body := range []string{
		`{"mode":"broken"}`,
		`{"mode":"error","status":200}`,
		`{"mode":"slow","delay_ms":-1}`,
		`{"mode":"slow","delay":5}`,
		`not json`,
	} {
		if resp, b := mustPost(t, ts, "/sim/fault", body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("fault %s: status %d %s, want 400", body, resp.StatusCode, b)
		}
	}
	if f := s.Fault(); f.Mode != FaultNone {
		t.Fatalf("a rejected fault changed the state to %+v", f)
	}
	if err := s.SetFault(Fault{Mode: FaultSlow}); err != nil || s.Fault().DelayMS != DefaultSlowDelayMS {
		t.Fatalf("slow without delay: %v %+v", err, s.Fault())
	}
	resp, body, err := get(t, ts, "/sim/fault")
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"mode":"slow"`) {
		t.Fatalf("GET /sim/fault: %v %s", err, body)
	}
}

func TestResetClearsCacheAndCounters(t *testing.T) {
	s, ts := startReplica(t, Config{})
	ids := seq(0, 64)
	cached(t, ts, ids)
	if got := cached(t, ts, ids); got != 64 {
		t.Fatalf("cached = %d before reset", got)
	}
	if resp, body := mustPost(t, ts, "/sim/reset", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: %d %s", resp.StatusCode, body)
	}
	if st := s.Stats(); st != (Stats{}) {
		t.Fatalf("stats after reset = %+v", st)
	}
	_, metrics, _ := get(t, ts, "/metrics")
	if strings.Contains(string(metrics), "sim_requests_total{") {
		t.Fatalf("request counters survived the reset:\n%s", metrics)
	}
	if got := cached(t, ts, ids); got != 0 {
		t.Fatalf("cached = %d after reset, want 0", got)
	}
	s.Reset()
	if st := s.Stats(); st.CacheBlocks != 0 || st.Requests != 0 {
		t.Fatalf("stats after Reset() = %+v", st)
	}
}

func TestCloseAbortsAndRejects(t *testing.T) {
	s := New(Config{DecodeMsPerToken: 60_000, OutputTokens: 2, TimeScale: 1})
	ts := startServer(t, s)
	resp, sr := openStream(t, context.Background(), ts, ts.URL+pathChat, chatBody("x", "stream", true))
	defer resp.Body.Close()
	if _, err := sr.next(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sr.readAll(); err == nil || err == io.EOF {
		t.Fatalf("stream ended with %v after Close, want a transport error", err)
	}
	if resp, _ := mustPost(t, ts, pathChat, chatBody("x")); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("request after Close: %d, want 503", resp.StatusCode)
	}
	if resp, _, _ := get(t, ts, "/health"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("health after Close: %d, want 503", resp.StatusCode)
	}
	_ = s.Close() // idempotent
}
