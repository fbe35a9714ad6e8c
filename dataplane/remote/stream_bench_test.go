package remote

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/service"
	"github.com/cartrouter/cart/dataplane/router"
)

// BenchmarkRoute compares the unary Route call with the Route stream
// against a real in-process leader over h2c on 127.0.0.1 (client, server
// and decision in one process: ns/op and allocs/op cover both ends).
// Each route is settled, so completions flow as in production.
//
//	go test -run XXX -bench BenchmarkRoute -benchmem ./dataplane/remote
func BenchmarkRoute(b *testing.B) {
	for _, mode := range []struct {
		name   string
		stream bool
	}{{"unary", false}, {"stream", true}} {
		for _, par := range []bool{false, true} {
			name := mode.name + "/sequential"
			if par {
				name = mode.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				cp := newOneNodeCP(b, service.AuthOptions{})
				var fellBack atomic.Int64
				r := newTestRouter(b, Options{ControlPlanes: []string{cp.url}, RouteStream: mode.stream, RouteTimeout: time.Second,
					OnFallback: func(string) { fellBack.Add(1) }})
				run(b, r)
				if mode.stream {
					streamLive(b, r, cp.url)
				}
				if err := r.SyncOnce(context.Background()); err != nil {
					b.Fatal(err)
				}
				var seq atomic.Uint64
				route := func() {
					n := seq.Add(1)
					req := &router.Request{Model: "m", Hashes: []uint64{n % 64, n%64 + 1000, n}, KeyLen: 192}
					d, err := r.Route(context.Background(), req)
					if err != nil {
						b.Error(err)
						return
					}
					r.Done(d, router.Outcome{Delivered: true, PromptTokens: -1, CachedTokens: -1})
				}
				b.ReportAllocs()
				b.ResetTimer()
				if par {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							route()
						}
					})
				} else {
					for range b.N {
						route()
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(fellBack.Load()), "fallbacks")
			})
		}
	}
}
