package remote

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
)

// BenchmarkRoute compares the unary Route call with the Route stream,
// without and with batching (stream-unbatched is a data plane that
// predates it, as the stream was before), against a real in-process
// leader over h2c on 127.0.0.1 (client, server and decision in one
// process: ns/op and allocs/op cover both ends), with 1 and 32 callers.
// Each route is settled, so completions flow as in production. On the
// streams it reports the messages each way per call they carried
// (req-msgs/call, resp-msgs/answer): 1 without batching, falling under
// concurrency with it.
//
//	go test -run XXX -bench BenchmarkRoute -benchmem ./dataplane/remote
func BenchmarkRoute(b *testing.B) {
	for _, mode := range []struct {
		name            string
		stream, noBatch bool
	}{{"unary", false, false}, {"stream-unbatched", true, true}, {"stream", true, false}} {
		for _, callers := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/c%d", mode.name, callers), func(b *testing.B) {
				cp := newOneNodeCP(b, service.AuthOptions{})
				var fellBack atomic.Int64
				var msgs msgCounter
				r := newTestRouter(b, Options{ControlPlanes: []string{cp.url}, RouteStream: mode.stream, RouteTimeout: time.Second,
					OnFallback: func(string) { fellBack.Add(1) }, Interceptors: msgs.interceptors()})
				if mode.stream {
					r.streams.noBatch = mode.noBatch
				}
				run(b, r)
				if mode.stream {
					streamLive(b, r, cp.url)
				}
				if err := r.SyncOnce(context.Background()); err != nil {
					b.Fatal(err)
				}
				var seq atomic.Uint64
				route := func(n uint64) {
					req := &router.Request{Model: "m", Hashes: []uint64{n % 64, n%64 + 1000, n}, KeyLen: 192}
					d, err := r.Decide(context.Background(), req)
					if err != nil {
						b.Error(err)
						return
					}
					r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
				}
				msgs.reset()
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						for n := seq.Add(1); n <= uint64(b.N); n = seq.Add(1) {
							route(n)
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "routes/s")
				b.ReportMetric(float64(fellBack.Load()), "fallbacks")
				if calls, m, answers, am := msgs.counts(); mode.stream && calls > 0 && answers > 0 {
					b.ReportMetric(float64(m)/float64(calls), "req-msgs/call")
					b.ReportMetric(float64(am)/float64(answers), "resp-msgs/answer")
				}
			})
		}
	}
}
