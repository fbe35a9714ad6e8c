package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
)

// eventLog records prefill start/end events across concurrent requests.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// runTwoPrefills sends A, holds it inside its prefill until B has either
// started prefilling or is queued, then lets A finish, and returns the order
// of prefill events.
func runTwoPrefills(t *testing.T, maxConcurrency int) []string {
	t.Helper()
	s := New(Config{MaxConcurrency: maxConcurrency})
	var log eventLog
	aStarted, releaseA := make(chan struct{}), make(chan struct{})
	s.hooks.prefillStart = func(j *job) {
		log.add("start " + j.requestID)
		if j.requestID == "A" {
			close(aStarted)
			<-releaseA
		}
	}
	s.hooks.prefillEnd = func(j *job) { log.add("end " + j.requestID) }
	ts := startServer(t, s)

	var wg sync.WaitGroup
	send := func(id string) {
		wg.Go(func() {
			if _, err := tryComplete(ts, pathChat, chatBody("request "+id), "X-Request-Id", id); err != nil {
				t.Error(err)
			}
		})
	}
	send("A")
	<-aStarted
	send("B")
	testkit.WaitFor(t, 10*time.Second, "B to be queued or prefilling", func() bool {
		st := s.Stats()
		return st.Queued == 1 || slices.Contains(log.snapshot(), "start B")
	})
	close(releaseA)
	wg.Wait()
	return log.snapshot()
}

func TestSerialQueueSerializesPrefills(t *testing.T) {
	got := runTwoPrefills(t, 1)
	want := []string{"start A", "end A", "start B", "end B"}
	if !slices.Equal(got, want) {
		t.Fatalf("prefill events = %v, want %v", got, want)
	}
}

func TestConcurrentSlotsOverlapPrefills(t *testing.T) {
	got := runTwoPrefills(t, 2)
	// B must have started while A was still held inside its prefill.
	if len(got) != 4 || got[0] != "start A" || got[1] != "start B" {
		t.Fatalf("prefill events = %v, want B to start before A ends", got)
	}
}

func TestSerialQueueDelaysLaterRequestByEarlierPrefill(t *testing.T) {
	// Real (scaled) time: A's prefill is long, B's prompt is tiny. With one
	// slot, B cannot finish before A's prefill has ended, whatever the
	// machine's speed. (Which answer reaches its client first is a race:
	// A's slot is free as soon as its prefill ends, before A answers.)
	const prefill = 200 * time.Millisecond
	s, ts := startReplica(t, Config{MaxConcurrency: 1, PrefillUsPerToken: 1000, TimeScale: 1})
	long := tokenPrompt(seq(0, 200)) // 200 ms of prefill
	short := tokenPrompt([]int{1})

	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		if _, err := tryComplete(ts, pathCompletions, long); err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, 10*time.Second, "the long request to be admitted", func() bool { return s.Stats().Running == 1 })
	var shortDone time.Duration
	wg.Go(func() {
		if _, err := tryComplete(ts, pathCompletions, short); err != nil {
			t.Error(err)
		}
		shortDone = time.Since(start)
	})
	wg.Wait()
	if shortDone < prefill {
		t.Fatalf("the short request finished %v after the long one started, inside its %v prefill: it did not queue behind it", shortDone, prefill)
	}
}

func TestCancellationReleasesSlotAndRunning(t *testing.T) {
	// 100 ms per uncached token: the 10,000-token prompts would prefill for
	// about 17 minutes, so only cancellation can end them.
	s, ts := startReplica(t, Config{MaxConcurrency: 1, PrefillUsPerToken: 100_000, TimeScale: 1})
	huge := tokenPrompt(seq(0, 10_000))

	start := func(id string) (context.CancelFunc, <-chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			resp, err := post(t, ctx, ts, pathCompletions, huge, "X-Request-Id", id)
			if err == nil {
				resp.Body.Close()
				err = errors.New(id + " completed unexpectedly: " + resp.Status)
			}
			errc <- err
		}()
		return cancel, errc
	}

	cancelA, errA := start("A")
	testkit.WaitFor(t, 10*time.Second, "A to hold the prefill slot", func() bool { return s.Stats().Running == 1 })
	cancelB, errB := start("B")
	testkit.WaitFor(t, 10*time.Second, "B to queue", func() bool { return s.Stats().Queued == 1 })

	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}
	testkit.WaitFor(t, 10*time.Second, "B to leave the queue", func() bool { return s.Stats().Queued == 0 })
	if got := s.Stats().Running; got != 1 {
		t.Fatalf("running = %d after cancelling the queued request, want 1", got)
	}

	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v, want context.Canceled", err)
	}
	testkit.WaitFor(t, 10*time.Second, "A to release the slot", func() bool { return s.Stats().Running == 0 })

	// The slot is free again: a one-token prompt prefills in 100 ms.
	if r := complete(t, ts, pathCompletions, tokenPrompt([]int{7})); r.Usage.PromptTokens != 1 {
		t.Fatalf("prompt tokens = %d, want 1", r.Usage.PromptTokens)
	}
	testkit.WaitFor(t, 10*time.Second, "cancelled requests to be counted", func() bool {
		_, body, err := get(t, ts, "/metrics")
		return err == nil && strings.Contains(string(body), `sim_requests_total{endpoint="/v1/completions",status="499"} 2`)
	})
	// Cancelled prefills never completed, so their tokens are not counted.
	if st := s.Stats(); st.PromptTokens != 1 || st.CacheBlocks != 0 {
		t.Fatalf("stats after cancellations = %+v", st)
	}
}

func TestCancelledStreamStopsDecoding(t *testing.T) {
	s, ts := startReplica(t, Config{DecodeMsPerToken: 60_000, OutputTokens: 5, TimeScale: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(t, ctx, ts, pathChat, chatBody("hello", "stream", true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The role chunk arrives right after prefill; the first token would
	// take a minute.
	if _, err := newSSEReader(resp.Body).next(); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Running; got != 1 {
		t.Fatalf("running = %d while decoding, want 1", got)
	}
	cancel()
	_, _ = io.Copy(io.Discard, resp.Body)
	// eventually gives up long before the minute-long token could finish,
	// so passing means the sleep itself was interrupted.
	testkit.WaitFor(t, 10*time.Second, "the decode to stop", func() bool { return s.Stats().Running == 0 })
}

// smallBufferListener shrinks each accepted connection's send buffer so that
// a client that stops reading blocks the server's writes quickly.
type smallBufferListener struct{ net.Listener }

func (l smallBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(1024)
	}
	return c, err
}

func TestCloseUnblocksWritesToStalledClient(t *testing.T) {
	s := New(Config{}) // TimeScale 0: only the socket can hold the stream up
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.Listener = smallBufferListener{ts.Listener}
	ts.Start()
	defer ts.Close()

	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(1024) // and never read
	body := `{"stream":true,"max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}`
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: sim\r\nContent-Length: %d\r\n\r\n%s", pathChat, len(body), body); err != nil {
		t.Fatal(err)
	}
	// ~800 KB of events cannot fit in a few KB of socket buffers, so the
	// handler ends up blocked in a write.
	testkit.WaitFor(t, 10*time.Second, "the stream to start", func() bool { return s.Stats().CompletionTokens > 0 })

	_ = s.Close()
	testkit.WaitFor(t, 10*time.Second, "the blocked handler to give up", func() bool { return s.Stats().Running == 0 })
	if got := s.Stats().CompletionTokens; got >= 4096 {
		t.Fatalf("all %d tokens were written; the client never blocked the stream", got)
	}
}

// The batch limit holds at most MaxRunning requests from admission to
// their last token; the rest wait, and /metrics reports both with vLLM's
// names.
func TestMaxRunningQueuesAndReports(t *testing.T) {
	s := New(Config{MaxRunning: 2, MaxConcurrency: 8, OutputTokens: 50, DecodeMsPerToken: 2, TimeScale: 1})
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	defer s.Close()
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":"p%d"}`, i)))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	var text string
	for time.Now().Before(deadline) {
		resp, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(b)
		if strings.Contains(text, `vllm:num_requests_running{model_name="cart-sim"} 2`) && strings.Contains(text, `vllm:num_requests_waiting{model_name="cart-sim"} 3`) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !strings.Contains(text, `vllm:num_requests_running{model_name="cart-sim"} 2`) || !strings.Contains(text, `vllm:num_requests_waiting{model_name="cart-sim"} 3`) {
		t.Fatalf("never saw 2 running and 3 waiting:\n%s", text)
	}
	wg.Wait()
	if r, w := s.seqs.counts(); r != 0 || w != 0 {
		t.Fatalf("after all finished: %d running, %d waiting", r, w)
	}
	// Two found a slot, three waited for one (each ~100 ms of decode).
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`vllm:request_queue_time_seconds_bucket{model_name="cart-sim",le="0.001"} 2`,
		`vllm:request_queue_time_seconds_bucket{model_name="cart-sim",le="0.05"} 2`,
		`vllm:request_queue_time_seconds_count{model_name="cart-sim"} 5`,
	} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("no %s in:\n%s", want, b)
		}
	}
}

// Under the priority policy the engine's queue runs lower "priority"
// values first; first come, first served otherwise.
func TestPrioritySchedulingOrder(t *testing.T) {
	for _, prio := range []bool{false, true} {
		q := &sequences{max: 1, priority: prio}
		if err := q.acquire(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		order := make(chan int, 3)
		var wg sync.WaitGroup
		for i, p := range []int{5, 1, 3} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := q.acquire(context.Background(), p); err != nil {
					t.Error(err)
					return
				}
				order <- p
				q.release()
			}()
			for { // queue them in this order
				if _, w := q.counts(); w == i+1 {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		q.release()
		wg.Wait()
		close(order)
		var got []int
		for p := range order {
			got = append(got, p)
		}
		want := []int{5, 1, 3}
		if prio {
			want = []int{1, 3, 5}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("priority policy %v: ran %v, want %v", prio, got, want)
		}
	}
}

// A request's sequence ends with its last token, before the answer's
// closing bytes (vLLM frees a finished request before its output reaches
// the client), streamed or not: a router that sends the next request the
// moment it sees an answer end finds the slot free.
func TestSequenceEndsBeforeTheAnswerCloses(t *testing.T) {
	for _, stream := range []bool{false, true} {
		s := New(Config{MaxRunning: 1, MaxConcurrency: 4, OutputTokens: 3, DecodeMsPerToken: 1, TimeScale: 1})
		running := make(chan int, 1)
		s.hooks.answerEnd = func(*job) { r, _ := s.seqs.counts(); running <- r }
		ts := httptest.NewServer(s.Handler())
		resp, err := http.Post(ts.URL+"/v1/completions", "application/json", strings.NewReader(fmt.Sprintf(`{"prompt":"p","stream":%t}`, stream)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if r := testkit.Recv(t, running, 5*time.Second, "the answer's end"); r != 0 {
			t.Fatalf("stream %v: %d running when the answer's closing bytes were written, want 0", stream, r)
		}
		ts.Close()
		s.Close()
	}
}
