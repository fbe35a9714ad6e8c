package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/proc"
	"github.com/cartrouter/cart/kvevents"
	"github.com/cartrouter/cart/sim"
	"github.com/cartrouter/cart/sim/simtest"
)

// The real cart binary consuming KV events on its listen socket, once with
// only the listen keys and once with every kv_events key set: the 73-byte
// frame closes that peer only, a good engine's events keep arriving (and,
// capped, drop the oldest hashes), and the process idles past maintenance
// passes. Before the ZMTP guard the process died on the frame.
func TestKVEventsListenerSurvivesTheCrashingFrame(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cart binary")
	}
	bin := proc.Build(t, ".")
	for _, c := range []struct {
		name  string
		ipc   bool
		extra string
		cap   int // max_hashes_per_rank (0: the default)
	}{
		{name: "defaults"},
		{name: "every key", cap: 100, extra: "  allowed_publishers: [127.0.0.1, \"::1\"]\n  max_message_bytes: 65536\n" +
			"  max_publisher_connections: 8\n  max_hashes_per_rank: 100\n  ipc_socket_mode: \"0660\"\n"},
		{name: "ipc", ipc: true, extra: "  ipc_socket_mode: \"0660\"\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			replica := simtest.Start(t, sim.Config{Name: "engine"})
			dir := t.TempDir()
			listen := fmt.Sprintf("tcp://127.0.0.1:%d", testkit.FreePort(t))
			if c.ipc {
				listen = "ipc://" + filepath.Join(dir, "kv.sock")
			}
			port, metricsPort := testkit.FreePort(t), testkit.FreePort(t)
			cfg := fmt.Sprintf("server: {host: 127.0.0.1, port: %d, min_open_files: 0, metrics_addr: \"127.0.0.1:%d\"}\n"+
				"cache: {eviction_interval_secs: 1}\nkv_events:\n  listen: %q\n%sworkers:\n  - url: %s\n    kv_events: {topic: kv@engine@m}\n",
				port, metricsPort, listen, c.extra, replica.URL)
			cfgPath := filepath.Join(dir, "cart.yaml")
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			p := proc.Start(t, proc.Cmd{Path: bin, Args: []string{"-c", cfgPath}})
			p.WaitFor(t, 20*time.Second, "the router up", proc.HTTPOK(fmt.Sprintf("http://127.0.0.1:%d/workers", port)))
			if c.ipc {
				fi, err := os.Stat(strings.TrimPrefix(listen, "ipc://"))
				if err != nil || fi.Mode().Perm() != 0o660 {
					t.Fatalf("socket file: %v, %v", fi, err)
				}
			}
			metric := func(series string) float64 {
				v, _, _ := testkit.MetricSample(nil, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), series)
				return v
			}

			pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: listen, Connect: true, Topic: "kv@engine@m"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			p.WaitFor(t, 20*time.Second, "the engine's subscription", func() (bool, string) { return pub.Subscribed("kv@engine@m"), "" })
			publish := func(from, n uint64) {
				hs := make([]uint64, n)
				for i := range hs {
					hs[i] = from + uint64(i)
				}
				pub.Publish([]kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hs, BlockSize: 16, Medium: kvevents.MediumGPU}})
			}
			events := `cart_kv_events_total{kind="BlockStored",worker="` + replica.URL + `"}`
			publish(1, 150)
			p.WaitFor(t, 20*time.Second, "the first batch applied", func() (bool, string) {
				v := metric(events)
				return v == 1, fmt.Sprint(v)
			})
			if c.cap > 0 {
				if v := metric(`cart_kv_event_hashes_dropped_total{worker="` + replica.URL + `"}`); v != 50 {
					t.Fatalf("dropped %v hashes past a cap of 100 from 150, want 50", v)
				}
			}

			if !c.ipc {
				if !testkit.SendAndWaitClosed(t, strings.TrimPrefix(listen, "tcp://"), testkit.ZMTPCrashingFrame()) {
					t.Fatal("the attacking connection stayed open")
				}
				if v := metric(`cart_kv_event_connections_refused_total{reason="oversize"}`); v != 1 {
					t.Fatalf("oversize refusals: %v", v)
				}
			}
			// Past maintenance passes, the process lives and the
			// engine's events still arrive.
			idlePastMaintenance(t, p, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort), 0)
			if !p.Running() {
				t.Fatalf("cart exited:\n%s", p.Log.Tail(40))
			}
			publish(1000, 10)
			p.WaitFor(t, 20*time.Second, "a batch after the attack", func() (bool, string) {
				v := metric(events)
				return v == 2, fmt.Sprint(v)
			})
			if p.Log.Contains("panic") {
				t.Fatalf("a panic in the log:\n%s", p.Log.Tail(40))
			}
		})
	}
}
