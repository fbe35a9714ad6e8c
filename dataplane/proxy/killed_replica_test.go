package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cartrouter/cart/dataplane/proxy"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// outcome of one client request in the steady-load test.
type outcome struct {
	client      int
	begun       time.Time // client sent the request
	peer        string    // X-Routed-Peer: the replica whose headers the client got
	status      int
	preHeaders  error // failed before any response header reached the client
	midStream   error // failed after the stream had started
	sawDone     bool
	headersSeen time.Time
	finished    time.Time
}

func streamBody(client, n int) string {
	b, _ := json.Marshal(map[string]any{
		"model":          "cart-sim",
		"stream":         true,
		"max_tokens":     12,
		"stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{
			{"role": "system", "content": longText(fmt.Sprintf("client %d system prompt", client), 1500)},
			{"role": "user", "content": fmt.Sprintf("question %d from client %d", n, client)},
		},
	})
	return string(b)
}

// Steady streaming load over three sim replicas, one of which is killed
// mid-run. Only requests whose stream had already started on the killed
// replica may fail; every request that had not started must succeed, via
// retry where its attempt hit the dead replica.
func TestSteadyLoadWithOneOfThreeReplicasKilled(t *testing.T) {
	const (
		clients  = 12
		killAt   = 700 * time.Millisecond
		runFor   = 1800 * time.Millisecond
		tokenDur = 10 // ms per output token: a 12-token stream lasts ~120ms
	)
	var sims []*sim.Server
	var urls []string
	for i := range 3 {
		r := simtest.Start(t, sim.Config{
			Name:              fmt.Sprint("r", i),
			TimeScale:         1,
			DecodeMsPerToken:  tokenDur,
			PrefillUsPerToken: 20,
			MaxConcurrency:    2,
		})
		sims = append(sims, r.Server)
		urls = append(urls, r.URL)
	}
	r := newRig(t, urls, withOptions(func(o *proxy.Options) {
		o.AddRoutedPeerHeader = true
		// The retry budget is not under test here (TestRetryBudgetCapsStorm
		// is): a kill is a burst of simultaneous retries, and the budget
		// must not turn them into client errors.
		o.RetryBudgetMin = clients
	}))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	// Kill the replica that the most clients are pinned to, so the kill
	// hits streams in flight.
	victim := 0
	start := time.Now()
	var killStart, killedAt time.Time
	var inFlightAtKill int
	killed := make(chan struct{})
	go func() {
		time.Sleep(killAt)
		best := -1
		for i, w := range r.router.Workers() {
			if w.Load > best {
				victim, best = i, w.Load
			}
		}
		killStart = time.Now()
		_ = sims[victim].SetFault(sim.Fault{Mode: sim.FaultDown})
		killedAt = time.Now()
		// The router's count just before and just after the kill: a request
		// dispatched in between is in the second.
		inFlightAtKill = max(best, r.router.Workers()[victim].Load)
		close(killed)
	}()

	var mu sync.Mutex
	var results []outcome
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Since(start) < runFor; n++ {
				o := outcome{client: c, begun: time.Now()}
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.front.URL+"/v1/chat/completions", strings.NewReader(streamBody(c, n)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					o.preHeaders = err
				} else {
					o.headersSeen = time.Now()
					o.status, o.peer = resp.StatusCode, resp.Header.Get(proxy.HeaderRoutedPeer)
					if resp.StatusCode != http.StatusOK {
						b, _ := io.ReadAll(resp.Body)
						o.preHeaders = fmt.Errorf("status %d: %s", resp.StatusCode, b)
					} else {
						br := bufio.NewReader(resp.Body)
						for {
							line, err := br.ReadString('\n')
							if strings.Contains(line, "[DONE]") {
								o.sawDone = true
							}
							if err != nil {
								if err != io.EOF {
									o.midStream = err
								} else if !o.sawDone {
									o.midStream = fmt.Errorf("stream ended without [DONE]")
								}
								break
							}
						}
					}
					resp.Body.Close()
				}
				o.finished = time.Now()
				mu.Lock()
				results = append(results, o)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	<-killed
	victimURL := urls[victim]

	var failed, preHeaderFailed, midStream, servedByVictim, afterKillOnVictim, startedAndRunning int
	for _, o := range results {
		if o.peer == victimURL {
			servedByVictim++
			if o.begun.After(killedAt) {
				afterKillOnVictim++
			}
			if o.headersSeen.Before(killedAt) && o.finished.After(killStart) {
				startedAndRunning++
			}
		}
		switch {
		case o.preHeaders != nil:
			failed++
			preHeaderFailed++
			t.Errorf("client %d: a request that had not started failed: %v", o.client, o.preHeaders)
		case o.midStream != nil:
			failed++
			midStream++
			if o.peer != victimURL {
				t.Errorf("client %d: a stream from the surviving replica %s failed: %v", o.client, o.peer, o.midStream)
			}
			if o.headersSeen.After(killedAt.Add(time.Second)) {
				t.Errorf("client %d: a stream started well after the kill failed: %v", o.client, o.midStream)
			}
		}
	}
	retries := counterValue(t, r, "cart_retries_total", "")
	t.Logf("steady load, 3 sim replicas, %d concurrent streaming clients, replica %s killed (FaultDown) after %v:", clients, victimURL, killAt)
	t.Logf("  requests total %d, failed %d (mid-stream on the killed replica %d, before headers %d)", len(results), failed, midStream, preHeaderFailed)
	t.Logf("  in flight on the killed replica at the kill: %d by the router's count, %d streams already started (client side); upstream retries: %v; requests it served overall: %d",
		inFlightAtKill, startedAndRunning, retries, servedByVictim)
	if len(results) < clients*4 {
		t.Fatalf("only %d requests completed: the load was not steady", len(results))
	}
	if midStream > inFlightAtKill {
		t.Fatalf("%d mid-stream failures but only %d requests were in flight on the killed replica", midStream, inFlightAtKill)
	}
	if afterKillOnVictim > 0 {
		t.Fatalf("%d requests sent after the kill were answered by the dead replica", afterKillOnVictim)
	}
	if inFlightAtKill == 0 {
		t.Fatal("nothing was in flight on the killed replica: the test did not exercise a kill under load")
	}
	r.waitLoadZero()
	assertNoDoubleRelease(t, r)
}
