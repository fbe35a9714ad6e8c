package discovery

import (
	"testing"
	"time"

	"github.com/cartrouter/cart/config"
)

// discovery.* arrives in the reconciler's rules and the resolver in their
// units.
func TestFromConfig(t *testing.T) {
	cfg := config.Default()
	d := &cfg.Discovery
	d.DrainTimeoutSecs = 2.5
	d.DNS.Name, d.DNS.RecordType, d.DNS.Port, d.DNS.Scheme = "vllm.pool.internal", "SRV", 8000, "http"
	d.DNS.Resolver, d.DNS.TimeoutSecs = "127.0.0.1:53", 0.25
	d.DNS.AddAfter, d.DNS.RemoveAfter, d.DNS.MinIntervalSecs, d.DNS.MaxIntervalSecs = 2, 3, 1, 30

	r := RulesFrom(cfg)
	want := Options{AddAfter: 2, RemoveAfter: 3, DrainTimeout: 2500 * time.Millisecond, MinInterval: time.Second, MaxInterval: 30 * time.Second}
	if r != want {
		t.Errorf("RulesFrom = %+v, want %+v", r, want)
	}
	res, err := DNSResolverFrom(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.o.Name != "vllm.pool.internal" || !res.o.SRV || res.o.Port != 8000 || res.o.Timeout != 250*time.Millisecond {
		t.Errorf("resolver options %+v", res.o)
	}
	d.DNS.Name = "a..b"
	if _, err := DNSResolverFrom(cfg); err == nil {
		t.Error("a malformed name built a resolver")
	}
}
