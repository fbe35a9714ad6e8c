package discovery

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/prometheus/client_golang/prometheus"
)

const ns = "inference"

// ep is one endpoint of a slice: ready "y", "n", or "" (unset).
type ep struct{ ip, ready string }

func endpointSlice(name, svc string, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for n, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &n, Port: &p})
	}
	for _, e := range eps {
		var c discoveryv1.EndpointConditions
		if e.ready != "" {
			r := e.ready == "y"
			c.Ready = &r
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: c})
	}
	return s
}

func pod(name, ip string, ready bool, lbl map[string]string, ports map[string]int32) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbl},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	c := corev1.Container{Name: "engine"}
	for n, port := range ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: n, ContainerPort: port})
	}
	p.Spec.Containers = []corev1.Container{c}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func k8sSource(t *testing.T, o KubernetesOptions) *KubernetesSource {
	t.Helper()
	o.Namespace = ns
	o.SyncTimeout = 10 * time.Second
	k, err := NewKubernetesSource(o)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// resolveOnce starts the informer, answers once and stops it.
func resolveOnce(t *testing.T, k *KubernetesSource) Answer {
	t.Helper()
	stop := k.Start(context.Background())
	defer stop()
	return k.Resolve(context.Background())
}

func TestKubernetesSliceAnswer(t *testing.T) {
	web := map[string]int32{"http": 8000, "metrics": 9000}
	objs := []runtime.Object{
		endpointSlice("vllm-a", "vllm", web, ep{"10.0.0.1", "y"}, ep{"10.0.0.2", ""}, ep{"10.0.0.3", "n"}),
		endpointSlice("vllm-b", "vllm", web, ep{"10.0.0.4", "y"}),
		endpointSlice("other-a", "other", web, ep{"10.9.9.9", "y"}),
	}
	fqdn := endpointSlice("vllm-c", "vllm", web, ep{"vllm.example", "y"})
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	objs = append(objs, fqdn)

	a := resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(objs...), Service: "vllm", Port: "http"}))
	want := []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.4:8000"}
	if a.Err != nil || !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("by port name: %+v, want %v (not-ready, other service and FQDN left out; unset ready counts as ready)", a, want)
	}
	a = resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(objs...), Service: "vllm", Port: "7000", Scheme: "https"}))
	want = []string{"https://10.0.0.1:7000", "https://10.0.0.2:7000", "https://10.0.0.4:7000"}
	if a.Err != nil || !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("by port number: %+v, want %v", a, want)
	}
	a = resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(objs...), Service: "vllm", Port: "grpc"}))
	if a.Err == nil || !strings.Contains(a.Err.Error(), `port named "grpc"`) || !strings.Contains(a.Err.Error(), "http, metrics") {
		t.Fatalf("unknown port name: %+v, want an error naming the ports seen", a)
	}
}

func TestKubernetesPodAnswer(t *testing.T) {
	app := map[string]string{"app": "vllm", "tier": "gpu"}
	ports := map[string]int32{"http": 8000}
	terminating := pod("p-term", "10.1.0.5", true, app, ports)
	terminating.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	terminating.Finalizers = []string{"test"}
	pending := pod("p-pending", "10.1.0.6", true, app, ports)
	pending.Status.Phase = corev1.PodPending
	objs := []runtime.Object{
		pod("p-1", "10.1.0.1", true, app, ports),
		pod("p-2", "10.1.0.2", true, app, ports),
		pod("p-unready", "10.1.0.3", false, app, ports),
		pod("p-noip", "", true, app, ports),
		pod("p-other", "10.1.0.4", true, map[string]string{"app": "other"}, ports),
		terminating, pending,
	}
	a := resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(objs...), Selector: "app=vllm,tier in (gpu)", Port: "http"}))
	want := []string{"http://10.1.0.1:8000", "http://10.1.0.2:8000"}
	if a.Err != nil || !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("pods: %+v, want %v (unready, IP-less, unmatched, terminating and pending pods left out)", a, want)
	}
}

func TestNewKubernetesSourceRejectsBadOptions(t *testing.T) {
	c := fake.NewClientset()
	for _, tc := range []struct {
		o    KubernetesOptions
		want string
	}{
		{KubernetesOptions{Service: "a", Selector: "app=a", Port: "http"}, "more than one"},
		{KubernetesOptions{Selector: "app=a", InferencePool: "pool"}, "more than one"},
		{KubernetesOptions{Port: "http"}, "none of service, selector and inference_pool"},
		{KubernetesOptions{InferencePool: "pool", Port: "http"}, "targetPorts are the ports"},
		{KubernetesOptions{InferencePool: "Pool_1"}, "inference_pool"},
		{KubernetesOptions{Service: "A_b", Port: "http"}, "service"},
		{KubernetesOptions{Selector: "app in (", Port: "http"}, "selector"},
		{KubernetesOptions{Service: "a"}, "port is empty"},
		{KubernetesOptions{Service: "a", Port: "70000"}, "1..65535"},
		{KubernetesOptions{Service: "a", Port: "Not_A_Name"}, "port"},
		{KubernetesOptions{Service: "a", Port: "http", Namespace: "Bad/NS"}, "namespace"},
	} {
		tc.o.Client = c
		_, err := NewKubernetesSource(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", tc.o, err, tc.want)
		}
	}
	k, err := NewKubernetesSource(KubernetesOptions{Client: c, Service: "a", Port: "http"})
	if err != nil || k.Namespace() != "default" {
		t.Fatalf("no namespace: %v, namespace %q, want default", err, k.Namespace())
	}
}

// runWatcher runs a watcher over a Kubernetes source until the test ends.
// Its maximum interval is an hour, so everything after the first answer
// must come from the watch.
func runWatcher(t *testing.T, k *KubernetesSource, sink *fakeSink, removeAfter int) *Metrics {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	w := NewWatcher(WatchOptions{Source: "kubernetes", Resolver: k, Sink: sink, Metrics: m, SettleEvery: 5 * time.Millisecond,
		Rules: Options{AddAfter: 1, RemoveAfter: removeAfter, DrainTimeout: time.Hour, MinInterval: 10 * time.Millisecond, MaxInterval: time.Hour}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		// The informer stopped with the watcher (a leader stepping down).
		if a := k.Resolve(context.Background()); a.Err == nil || !strings.Contains(a.Err.Error(), "not watching") {
			t.Errorf("after the watcher stopped: %+v, want not watching", a)
		}
	})
	return m
}

func newSink() *fakeSink {
	return &fakeSink{pool: map[string]string{"http://static:1": "static"}, draining: map[string]bool{}, load: map[string]int{}, source: "kubernetes"}
}

func (f *fakeSink) sources() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.pool)
}

func waitPool(t *testing.T, sink *fakeSink, what string, want map[string]string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what+": pool "+fmt.Sprint(want), func() bool { return sink.sources() == fmt.Sprint(want) })
}

// Endpoints appearing are added and a readiness change drains, then
// removes once idle, all driven by the watch; damping (remove_after 2)
// still completes although the source only answers on changes.
func TestKubernetesWatcherFollowsReadiness(t *testing.T) {
	ctx := context.Background()
	web := map[string]int32{"http": 8000}
	client := fake.NewClientset(endpointSlice("vllm-a", "vllm", web, ep{"10.0.0.1", "y"}, ep{"10.0.0.2", "y"}))
	sink := newSink()
	runWatcher(t, k8sSource(t, KubernetesOptions{Client: client, Service: "vllm", Port: "http"}), sink, 2)
	waitPool(t, sink, "initial", map[string]string{"http://static:1": "static", "http://10.0.0.1:8000": "kubernetes", "http://10.0.0.2:8000": "kubernetes"})

	slices := client.DiscoveryV1().EndpointSlices(ns)
	if _, err := slices.Create(ctx, endpointSlice("vllm-b", "vllm", web, ep{"10.0.0.3", ""}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sink, "new slice", map[string]string{"http://static:1": "static", "http://10.0.0.1:8000": "kubernetes",
		"http://10.0.0.2:8000": "kubernetes", "http://10.0.0.3:8000": "kubernetes"})

	sink.setLoad("http://10.0.0.2:8000", 1)
	if _, err := slices.Update(ctx, endpointSlice("vllm-a", "vllm", web, ep{"10.0.0.1", "y"}, ep{"10.0.0.2", "n"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "10.0.0.2 draining", func() bool { _, _, d := sink.get("http://10.0.0.2:8000"); return d })
	if _, ok, _ := sink.get("http://10.0.0.2:8000"); !ok {
		t.Fatal("a not-ready endpoint with a request in flight was removed before draining")
	}
	sink.setLoad("http://10.0.0.2:8000", 0)
	waitPool(t, sink, "drained endpoint removed", map[string]string{"http://static:1": "static", "http://10.0.0.1:8000": "kubernetes", "http://10.0.0.3:8000": "kubernetes"})
}

func TestKubernetesWatcherPodsBySelector(t *testing.T) {
	ctx := context.Background()
	app := map[string]string{"app": "vllm"}
	ports := map[string]int32{"serve": 8001}
	client := fake.NewClientset(pod("p-1", "10.1.0.1", true, app, ports), pod("p-2", "10.1.0.2", false, app, ports))
	sink := newSink()
	runWatcher(t, k8sSource(t, KubernetesOptions{Client: client, Selector: "app=vllm", Port: "serve"}), sink, 1)
	waitPool(t, sink, "only the ready pod", map[string]string{"http://static:1": "static", "http://10.1.0.1:8001": "kubernetes"})

	pods := client.CoreV1().Pods(ns)
	if _, err := pods.UpdateStatus(ctx, pod("p-2", "10.1.0.2", true, app, ports), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sink, "pod became ready", map[string]string{"http://static:1": "static", "http://10.1.0.1:8001": "kubernetes", "http://10.1.0.2:8001": "kubernetes"})
	if err := pods.Delete(ctx, "p-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sink, "deleted pod removed", map[string]string{"http://static:1": "static", "http://10.1.0.2:8001": "kubernetes"})
}

// A watch that restarts is followed by a re-list. A re-list that comes back
// empty keeps the pool (stale, as for a broken DNS resolver); the next good
// one brings in what changed while the watch was down, and nothing is
// drained on the way.
func TestKubernetesWatchRestart(t *testing.T) {
	ctx := context.Background()
	web := map[string]int32{"http": 8000}
	client := fake.NewClientset(endpointSlice("vllm-a", "vllm", web, ep{"10.0.0.1", "y"}, ep{"10.0.0.2", "y"}))
	var mu sync.Mutex
	var watches []*watch.RaceFreeFakeWatcher
	lists := 0
	// The first two watches are the test's (they see no changes); later
	// ones are the fake API server's.
	client.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(watches) >= 2 {
			return false, nil, nil
		}
		w := watch.NewRaceFreeFake()
		watches = append(watches, w)
		return true, w, nil
	})
	client.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		lists++
		if lists == 2 {
			return true, &discoveryv1.EndpointSliceList{}, nil // transiently empty
		}
		return false, nil, nil
	})
	watchN := func(i int) *watch.RaceFreeFakeWatcher {
		var w *watch.RaceFreeFakeWatcher
		testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("watch %d", i+1), func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(watches) > i {
				w = watches[i]
			}
			return w != nil
		})
		return w
	}
	expired := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old resource version"}

	sink := newSink()
	m := runWatcher(t, k8sSource(t, KubernetesOptions{Client: client, Service: "vllm", Port: "http"}), sink, 1)
	initial := map[string]string{"http://static:1": "static", "http://10.0.0.1:8000": "kubernetes", "http://10.0.0.2:8000": "kubernetes"}
	waitPool(t, sink, "initial", initial)

	// Changed while the watch sees nothing.
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice("vllm-b", "vllm", web, ep{"10.0.0.3", "y"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	watchN(0).Error(expired)
	testkit.WaitFor(t, 10*time.Second, "stale after the empty re-list", func() bool { return gauge(m.Stale.WithLabelValues("kubernetes")) == 1 })
	if got := sink.sources(); got != fmt.Sprint(initial) {
		t.Fatalf("an empty re-list changed the pool: %s", got)
	}
	watchN(1).Error(expired)
	waitPool(t, sink, "after the second re-list", map[string]string{"http://static:1": "static", "http://10.0.0.1:8000": "kubernetes",
		"http://10.0.0.2:8000": "kubernetes", "http://10.0.0.3:8000": "kubernetes"})
	testkit.WaitFor(t, 10*time.Second, "not stale", func() bool { return gauge(m.Stale.WithLabelValues("kubernetes")) == 0 })
	if d, r := sink.counts(); d != 0 || r != 0 {
		t.Fatalf("watch restarts drained %d and removed %d workers, want none", d, r)
	}
}
