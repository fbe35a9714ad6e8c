package discovery

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/discovery/dnstest"
	"github.com/cartrouter/cart/internal/testkit"
)

func dnsRoleConfig(server string) *config.Config {
	cfg := config.Default()
	d := &cfg.Discovery.DNS
	d.Name, d.PrefillName, d.DecodeName, d.Port, d.Resolver, d.TimeoutSecs = "both.pool", "prefill.pool", "decode.pool", 8000, server, 1
	return cfg
}

// One DNS name per role: the names' answers merged, each endpoint with the
// role of its name; a failing name fails the answer (a partial one would
// drain its workers); an endpoint under names of two roles is an error.
func TestDNSRoleNames(t *testing.T) {
	s := dnstest.Start(t)
	s.Set(t, "both.pool. 5 IN A 127.0.0.1", "prefill.pool. 3 IN A 127.0.0.2", "prefill.pool. 9 IN A 127.0.0.3", "decode.pool. 7 IN A 127.0.0.4")
	r, err := DNSSourceFrom(dnsRoleConfig(s.Addr))
	if err != nil {
		t.Fatal(err)
	}
	a := r.Resolve(context.Background())
	if a.Err != nil {
		t.Fatal(a.Err)
	}
	wantEP := []string{"http://127.0.0.1:8000", "http://127.0.0.2:8000", "http://127.0.0.3:8000", "http://127.0.0.4:8000"}
	wantRoles := map[string]string{"http://127.0.0.2:8000": "prefill", "http://127.0.0.3:8000": "prefill", "http://127.0.0.4:8000": "decode"}
	if !reflect.DeepEqual(a.Endpoints, wantEP) || !reflect.DeepEqual(a.Roles, wantRoles) || a.TTL != 3*time.Second {
		t.Fatalf("answer %+v, want %v %v ttl 3s", a, wantEP, wantRoles)
	}
	s.Set(t, "both.pool. 5 IN A 127.0.0.1", "prefill.pool. 3 IN A 127.0.0.1", "decode.pool. 7 IN A 127.0.0.4")
	if a := r.Resolve(context.Background()); a.Err == nil || !strings.Contains(a.Err.Error(), "two names") {
		t.Fatalf("an endpoint under two roles: %+v", a)
	}
	// Scaling one role to zero is followed: its name answers empty.
	s.Set(t, "both.pool. 5 IN A 127.0.0.1", "prefill.pool. 3 IN A 127.0.0.2")
	if a := r.Resolve(context.Background()); a.Err != nil || len(a.Endpoints) != 2 {
		t.Fatalf("decode scaled to zero: %+v", a)
	}
	// Only name set: the plain resolver, no roles.
	cfg := dnsRoleConfig(s.Addr)
	cfg.Discovery.DNS.PrefillName, cfg.Discovery.DNS.DecodeName = "", ""
	if r, err := DNSSourceFrom(cfg); err != nil {
		t.Fatal(err)
	} else if _, plain := r.(*DNSResolver); !plain {
		t.Fatalf("one name built a %T", r)
	}
}

// The watcher adds each worker with the role its answer gave.
func TestWatcherAddsWithRoles(t *testing.T) {
	res := &scripted{}
	res.set(Answer{Endpoints: []string{"http://b:1", "http://p:1", "http://d:1"}, Roles: map[string]string{"http://p:1": "prefill", "http://d:1": "decode"}})
	sink := &fakeSink{pool: map[string]string{}, draining: map[string]bool{}, load: map[string]int{}}
	w := NewWatcher(WatchOptions{Source: "dns", Resolver: res, Sink: sink, Metrics: NewMetrics(prometheus.NewRegistry()), SettleEvery: time.Millisecond,
		Rules: Options{AddAfter: 1, RemoveAfter: 1, DrainTimeout: time.Hour, MinInterval: time.Millisecond, MaxInterval: time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, 10*time.Second, "three workers", func() bool { return len(sink.Pool()) == 3 })
	for u, want := range map[string]string{"http://b:1": "", "http://p:1": "prefill", "http://d:1": "decode"} {
		if got := sink.roleOf(u); got != want {
			t.Errorf("%s added as %q, want %q", u, got, want)
		}
	}
}

// Pods carry their role in a label (llm-d's llm-d.ai/role): prefill and
// decode pods come with their role, a pod without the label or with both
// serves whole requests, and one with another value (an encode worker) is
// left out.
func TestKubernetesRoleLabel(t *testing.T) {
	ports := map[string]int32{"serve": 8000}
	lbl := func(role string) map[string]string {
		m := map[string]string{"app": "vllm"}
		if role != "" {
			m["llm-d.ai/role"] = role
		}
		return m
	}
	client := fake.NewClientset(
		pod("p", "10.2.0.1", true, lbl("prefill"), ports),
		pod("d", "10.2.0.2", true, lbl("decode"), ports),
		pod("b", "10.2.0.3", true, lbl("both"), ports),
		pod("n", "10.2.0.4", true, lbl(""), ports),
		pod("e", "10.2.0.5", true, lbl("encode"), ports),
	)
	sink := newSink()
	runWatcher(t, k8sSource(t, KubernetesOptions{Client: client, Selector: "app=vllm", Port: "serve", RoleLabel: "llm-d.ai/role"}), sink, 1)
	waitPool(t, sink, "every pod but the encoder", map[string]string{"http://static:1": "static", "http://10.2.0.1:8000": "kubernetes",
		"http://10.2.0.2:8000": "kubernetes", "http://10.2.0.3:8000": "kubernetes", "http://10.2.0.4:8000": "kubernetes"})
	for u, want := range map[string]string{"http://10.2.0.1:8000": "prefill", "http://10.2.0.2:8000": "decode", "http://10.2.0.3:8000": "", "http://10.2.0.4:8000": ""} {
		if got := sink.roleOf(u); got != want {
			t.Errorf("%s added as %q, want %q", u, got, want)
		}
	}
}
