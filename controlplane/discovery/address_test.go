package discovery

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/testkit"
)

func mustNets(t testing.TB, s ...string) []netip.Prefix {
	t.Helper()
	n, err := config.ParseNetworks(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Attack #3 of issue 33: DNS records and EndpointSlices are not the
// operator's word. By default loopback, link-local (the cloud metadata
// service at 169.254.169.254), unspecified and multicast addresses are
// refused, and so are this process's own listeners; an allowed-networks
// list admits only what it contains, and loopback or link-local only
// through a network inside that range.
func TestAddressPolicy(t *testing.T) {
	own := OwnListeners("0.0.0.0:6701", "10.0.0.5:6702", "[::]:9090", "cp-1.internal:6703", "bad")
	if len(own) != 3 {
		t.Fatalf("own listeners %v: want the three with an IP or wildcard host", own)
	}
	local := []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")}
	def := &AddressPolicy{Own: own, Local: local}
	tests := []struct {
		policy   *AddressPolicy
		endpoint string
		want     string
	}{
		{def, "http://10.1.2.3:8000", ""},
		{def, "https://[2001:db8::1]:8443", ""},
		{def, "http://192.168.1.10", ""},
		{def, "http://127.0.0.1:8000", RefusedLoopback},
		{def, "http://127.9.9.9:8000", RefusedLoopback},
		{def, "http://[::1]:8000", RefusedLoopback},
		{def, "http://[::ffff:127.0.0.1]:8000", RefusedLoopback},
		{def, "http://169.254.169.254", RefusedLinkLocal},
		{def, "http://169.254.169.254:80/latest", RefusedLinkLocal},
		{def, "http://[fe80::1]:8000", RefusedLinkLocal},
		{def, "http://[fe80::1%25eth0]:8000", RefusedLinkLocal},
		{def, "http://0.0.0.0:8000", RefusedUnspecified},
		{def, "http://[::]:8000", RefusedUnspecified},
		{def, "http://224.0.0.1:8000", RefusedMulticast},
		{def, "http://[ff02::1]:8000", RefusedMulticast},
		{def, "http://255.255.255.255:8000", RefusedMulticast},
		{def, "http://10.0.0.5:6701", RefusedOwn}, // wildcard listener, this host's address
		{def, "http://10.0.0.5:6702", RefusedOwn},
		{def, "http://10.0.0.6:6702", ""}, // the Raft port of another host
		{def, "http://10.0.0.5:8000", ""}, // a worker on this host, another port
		{def, "http://[fd00::5]:9090", RefusedOwn},
		{def, "http://worker.internal:8000", RefusedInvalid},
		{def, "http://10.1.2.3:0", RefusedInvalid},
		{def, "ftp://10.1.2.3", RefusedInvalid},
		{def, "::not a url", RefusedInvalid},

		{&AddressPolicy{Allowed: mustNets(t, "10.0.0.0/8")}, "http://10.9.9.9:8000", ""},
		{&AddressPolicy{Allowed: mustNets(t, "10.0.0.0/8")}, "http://192.168.0.1:8000", RefusedNotAllowed},
		{&AddressPolicy{Allowed: mustNets(t, "10.0.0.0/8")}, "http://127.0.0.1:8000", RefusedLoopback},
		{&AddressPolicy{Allowed: mustNets(t, "127.0.0.0/8")}, "http://127.0.0.1:8000", ""},
		{&AddressPolicy{Allowed: mustNets(t, "127.0.0.1")}, "http://127.0.0.1:8000", ""},
		{&AddressPolicy{Allowed: mustNets(t, "127.0.0.0/8")}, "http://169.254.169.254", RefusedLinkLocal},
		{&AddressPolicy{Allowed: mustNets(t, "0.0.0.0/0", "::/0")}, "http://127.0.0.1:8000", RefusedLoopback},
		{&AddressPolicy{Allowed: mustNets(t, "0.0.0.0/0")}, "http://169.254.169.254", RefusedLinkLocal},
		{&AddressPolicy{Allowed: mustNets(t, "0.0.0.0/0")}, "http://8.8.8.8", ""},
		{&AddressPolicy{Allowed: mustNets(t, "0.0.0.0/0")}, "http://224.0.0.1:80", RefusedMulticast},
		{&AddressPolicy{Allowed: mustNets(t, "169.254.10.0/24")}, "http://169.254.10.7:8000", ""},
		{&AddressPolicy{Allowed: mustNets(t, "169.254.10.0/24")}, "http://169.254.169.254", RefusedLinkLocal},
		{&AddressPolicy{Allowed: mustNets(t, "127.0.0.0/8"), Own: OwnListeners("127.0.0.1:6701")}, "http://127.0.0.1:6701", RefusedOwn},
		{&AddressPolicy{Allowed: mustNets(t, "127.0.0.0/8"), Own: OwnListeners(":6701")}, "http://127.0.0.1:6701", RefusedOwn},
	}
	for _, tc := range tests {
		if got := tc.policy.Check(tc.endpoint); got != tc.want {
			t.Errorf("allowed %v: Check(%s) = %q, want %q", tc.policy.Allowed, tc.endpoint, got, tc.want)
		}
	}
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

// The watcher screens every answer: a refused endpoint never reaches the
// sink, is counted on every answer and logged once; a usable endpoint in
// the same answer is added; an answer with nothing usable keeps the last
// good set (stale) instead of draining it.
func TestWatcherRefusesEndpoints(t *testing.T) {
	res := &scripted{}
	res.set(Answer{Endpoints: []string{"http://10.0.0.7:8000", "http://127.0.0.1:8000", "http://169.254.169.254:80"}})
	sink := &fakeSink{pool: map[string]string{}, draining: map[string]bool{}, load: map[string]int{}}
	logBuf := &testkit.SyncBuffer{}
	m := NewMetrics(prometheus.NewRegistry())
	w := NewWatcher(WatchOptions{Source: "dns", Resolver: res, Sink: sink, Metrics: m, SettleEvery: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logBuf, nil)), Policy: &AddressPolicy{},
		Rules: Options{AddAfter: 1, RemoveAfter: 1, DrainTimeout: time.Hour, MinInterval: time.Millisecond, MaxInterval: time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	testkit.WaitFor(t, 10*time.Second, "the usable endpoint added", func() bool { _, ok, _ := sink.get("http://10.0.0.7:8000"); return ok })
	testkit.WaitFor(t, 10*time.Second, "refusals counted over several answers", func() bool {
		return counter(m.Refused.WithLabelValues("dns", RefusedLoopback)) >= 3 && counter(m.Refused.WithLabelValues("dns", RefusedLinkLocal)) >= 3
	})
	for _, u := range []string{"http://127.0.0.1:8000", "http://169.254.169.254:80"} {
		if _, ok, _ := sink.get(u); ok {
			t.Errorf("%s added", u)
		}
		if n := strings.Count(logBuf.String(), "endpoint="+u); n != 1 {
			t.Errorf("%s logged %d times, want once:\n%s", u, n, logBuf.String())
		}
	}
	if !strings.Contains(logBuf.String(), "reason=link_local") || !strings.Contains(logBuf.String(), "discovery.allowed_networks") {
		t.Errorf("log lines lack the reason or the hint:\n%s", logBuf.String())
	}
	// Now only refused endpoints: the worker stays, the source is stale.
	res.set(Answer{Endpoints: []string{"http://127.0.0.1:8000"}})
	testkit.WaitFor(t, 10*time.Second, "stale", func() bool { return gauge(m.Stale.WithLabelValues("dns")) == 1 })
	n := res.count()
	testkit.WaitFor(t, 10*time.Second, "more answers", func() bool { return res.count() > n+3 })
	if _, ok, d := sink.get("http://10.0.0.7:8000"); !ok || d {
		t.Errorf("an answer of refused endpoints drained or removed the last good worker (present %v, draining %v)", ok, d)
	}
	if !strings.Contains(logBuf.String(), "all 1 endpoints refused") {
		t.Errorf("the stale answer does not say why:\n%s", logBuf.String())
	}
}

// FuzzAddressPolicy: any endpoint a resolver could hand over gets a verdict
// without panicking; a verdict is one of the reasons, and an endpoint the
// default policy admits names a unicast address outside loopback and
// link-local.
func FuzzAddressPolicy(f *testing.F) {
	for _, s := range []string{"http://10.1.2.3:8000", "http://127.0.0.1:1", "http://169.254.169.254", "http://[fe80::1%25eth0]:80",
		"http://[::ffff:127.0.0.1]:8000", "https://[2001:db8::1]", "http://0.0.0.0:6701", "::", "http://%zz", "http://[::1", ""} {
		f.Add(s)
	}
	reasons := []string{"", RefusedInvalid, RefusedUnspecified, RefusedMulticast, RefusedLoopback, RefusedLinkLocal, RefusedOwn, RefusedNotAllowed}
	def := &AddressPolicy{Own: OwnListeners("0.0.0.0:6701")}
	narrow := &AddressPolicy{Allowed: mustNets(f, "10.0.0.0/8", "127.0.0.0/8")}
	f.Fuzz(func(t *testing.T, endpoint string) {
		for _, p := range []*AddressPolicy{def, narrow} {
			got := p.Check(endpoint)
			if !slices.Contains(reasons, got) {
				t.Fatalf("Check(%q) = %q", endpoint, got)
			}
			if got != "" {
				continue
			}
			addr, _, ok := endpointAddr(endpoint)
			if !ok || addr.IsUnspecified() || addr.IsMulticast() {
				t.Fatalf("Check(%q) admitted %v (ok %v)", endpoint, addr, ok)
			}
			if p == def && (addr.IsLoopback() || addr.IsLinkLocalUnicast()) {
				t.Fatalf("default policy admitted %q", endpoint)
			}
			if p == narrow && !p.Allowed[0].Contains(addr) && !p.Allowed[1].Contains(addr) {
				t.Fatalf("allowed networks admitted %q", endpoint)
			}
		}
	})
}
