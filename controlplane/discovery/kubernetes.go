package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// KubernetesOptions configure a Kubernetes source: the ready endpoints of
// one Service (its EndpointSlices), the ready pods matching a label
// selector, or the ready pods of an InferencePool (its selector, on each
// of its target ports), in one namespace.
type KubernetesOptions struct {
	// Exactly one of Service, Selector and InferencePool.
	Service       string
	Selector      string
	InferencePool string
	// RoleLabel, in selector mode, is the pod label holding a worker's
	// role (roleOf); "" = every pod serves whole requests.
	RoleLabel string
	// Namespace; "" = the namespace of the in-cluster service account, or
	// of the kubeconfig's current context, else "default".
	Namespace string
	// Port is a port name (EndpointSlice port name, or container port name
	// in selector mode) or a number (used as is for every endpoint).
	Port   string
	Scheme string
	// Kubeconfig is a kubeconfig file; "" = in-cluster config.
	Kubeconfig string
	// SyncTimeout bounds how long an answer waits for the first list.
	SyncTimeout time.Duration
	// Client replaces the one built from Kubeconfig (tests: a fake
	// clientset); Pools, the InferencePool client, likewise.
	Client KubernetesClient
	Pools  InferencePools
	Logger *slog.Logger
}

// KubernetesClient is the part of a clientset discovery uses. Taking the
// two typed clients instead of kubernetes.Interface keeps every other API
// group out of the binary (tens of megabytes).
type KubernetesClient interface {
	DiscoveryV1() discoveryv1client.DiscoveryV1Interface
	CoreV1() corev1client.CoreV1Interface
}

type typedClients struct {
	d *discoveryv1client.DiscoveryV1Client
	c *corev1client.CoreV1Client
}

func (t typedClients) DiscoveryV1() discoveryv1client.DiscoveryV1Interface { return t.d }
func (t typedClients) CoreV1() corev1client.CoreV1Interface                { return t.c }

func newClient(cfg *rest.Config) (KubernetesClient, error) {
	h, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	d, err := discoveryv1client.NewForConfigAndClient(cfg, h)
	if err != nil {
		return nil, err
	}
	c, err := corev1client.NewForConfigAndClient(cfg, h)
	if err != nil {
		return nil, err
	}
	return typedClients{d, c}, nil
}

// KubernetesSource watches the API server with a client-go informer and
// answers from the informer's cache. The informer lives as long as one
// watcher run (Start), so a control-plane node that loses leadership stops
// watching.
type KubernetesSource struct {
	o        KubernetesOptions
	selector labels.Selector // pods mode
	portNum  int             // >0 when Port is a number
	notify   chan struct{}

	mu  sync.Mutex
	run *informerRun // nil between runs
}

type informerRun struct {
	inf     cache.SharedIndexInformer
	pool    cache.SharedIndexInformer // InferencePool mode: the pool itself
	synced  chan struct{}
	mu      sync.Mutex
	lastErr error
}

const saNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// NewKubernetesSource checks o and builds the API client (nothing is
// contacted until Start).
func NewKubernetesSource(o KubernetesOptions) (*KubernetesSource, error) {
	switch modes := btoi(o.Service != "") + btoi(o.Selector != "") + btoi(o.InferencePool != ""); {
	case modes > 1:
		return nil, errors.New("kubernetes discovery: more than one of service, selector and inference_pool is set; choose one")
	case modes == 0:
		return nil, errors.New("kubernetes discovery: none of service, selector and inference_pool is set")
	}
	k := &KubernetesSource{o: o, notify: make(chan struct{}, 1)}
	if o.InferencePool != "" {
		if err := k.checkPool(); err != nil {
			return nil, err
		}
	} else if o.Service != "" {
		if errs := validation.IsDNS1035Label(o.Service); len(errs) > 0 {
			return nil, fmt.Errorf("kubernetes discovery: service %q: %s", o.Service, strings.Join(errs, "; "))
		}
	} else {
		sel, err := labels.Parse(o.Selector)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: selector %q: %w", o.Selector, err)
		}
		if sel.Empty() {
			return nil, fmt.Errorf("kubernetes discovery: selector %q selects every pod", o.Selector)
		}
		k.selector = sel
	}
	if o.InferencePool == "" {
		n, err := parsePort(o.Port)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		k.portNum = n
	}
	if k.o.Scheme == "" {
		k.o.Scheme = "http"
	}
	if k.o.SyncTimeout <= 0 {
		k.o.SyncTimeout = 10 * time.Second
	}
	if k.o.Logger == nil {
		k.o.Logger = slog.Default()
	}
	if k.o.Client == nil {
		cfg, ns, err := restConfig(o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		cfg.UserAgent = "cart-discovery"
		if k.o.Client, err = newClient(cfg); err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		if o.InferencePool != "" && k.o.Pools == nil {
			if k.o.Pools, err = newPoolClient(cfg); err != nil {
				return nil, fmt.Errorf("kubernetes discovery: %w", err)
			}
		}
		if k.o.Namespace == "" {
			k.o.Namespace = ns
		}
	}
	if k.o.Namespace == "" {
		k.o.Namespace = metav1.NamespaceDefault
	}
	if errs := validation.IsDNS1123Label(k.o.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("kubernetes discovery: namespace %q: %s", k.o.Namespace, strings.Join(errs, "; "))
	}
	return k, nil
}

// parsePort checks a port given as a name (IANA service name, as Service
// and container ports use) or a number, returning the number or 0 for a
// name.
func parsePort(p string) (int, error) {
	if p == "" {
		return 0, errors.New("port is empty: give the port name (e.g. http) or number")
	}
	if p[0] >= '0' && p[0] <= '9' {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return 0, fmt.Errorf("port %q: a number must be 1..65535", p)
		}
		return n, nil
	}
	if errs := validation.IsValidPortName(p); len(errs) > 0 {
		return 0, fmt.Errorf("port %q: %s", p, strings.Join(errs, "; "))
	}
	return 0, nil
}

// restConfig loads a kubeconfig file, or the in-cluster config, and the
// namespace it implies ("" when it implies none).
func restConfig(kubeconfig string) (*rest.Config, string, error) {
	if kubeconfig != "" {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			ns = ""
		}
		return cfg, ns, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("in-cluster config (set discovery.kubernetes.kubeconfig when running outside a cluster): %w", err)
	}
	ns := ""
	if b, err := os.ReadFile(saNamespaceFile); err == nil {
		ns = strings.TrimSpace(string(b))
	}
	return cfg, ns, nil
}

// Namespace is the namespace watched.
func (k *KubernetesSource) Namespace() string { return k.o.Namespace }

// Describe names what is watched, for logs.
func (k *KubernetesSource) Describe() string {
	if k.o.InferencePool != "" {
		return "pods of InferencePool " + k.o.Namespace + "/" + k.o.InferencePool
	}
	if k.o.Service != "" {
		return "endpointslices of service " + k.o.Namespace + "/" + k.o.Service
	}
	return "pods " + k.o.Selector + " in namespace " + k.o.Namespace
}

// Notify implements Notifier: a value arrives after the watched objects
// changed.
func (k *KubernetesSource) Notify() <-chan struct{} { return k.notify }

func (k *KubernetesSource) poke() {
	select {
	case k.notify <- struct{}{}:
	default:
	}
}

// selectedListWatch lists and watches the objects that the label selector
// sel picks.
func selectedListWatch[L runtime.Object](sel string, list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			lo.LabelSelector = sel
			return list(ctx, lo)
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			lo.LabelSelector = sel
			return watchFn(ctx, lo)
		},
	}
}

// Start implements Starter: it starts a fresh informer (a stopped one
// cannot be restarted) and returns the function that stops it and waits
// for its goroutines.
func (k *KubernetesSource) Start(ctx context.Context) (stop func()) {
	var lw *cache.ListWatch
	var example runtime.Object
	ns := k.o.Namespace
	if k.o.InferencePool != "" {
		// Every pod of the namespace: the pool's selector may change, and
		// filtering here needs no new watch when it does.
		pods := k.o.Client.CoreV1().Pods(ns)
		example = &corev1.Pod{}
		lw = selectedListWatch("", pods.List, pods.Watch)
	} else if k.o.Service != "" {
		// The label the EndpointSlice controller puts on a Service's slices.
		sel := labels.Set{discoveryv1.LabelServiceName: k.o.Service}.String()
		eps := k.o.Client.DiscoveryV1().EndpointSlices(ns)
		example = &discoveryv1.EndpointSlice{}
		lw = selectedListWatch(sel, eps.List, eps.Watch)
	} else {
		pods := k.o.Client.CoreV1().Pods(ns)
		example = &corev1.Pod{}
		lw = selectedListWatch(k.selector.String(), pods.List, pods.Watch)
	}
	// The wrapper lets a fake clientset say it cannot stream lists, as
	// client-go's generated informers do.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, k.o.Client), example, 0, cache.Indexers{})
	r := &informerRun{inf: inf, synced: make(chan struct{})}
	infs := []cache.SharedIndexInformer{inf}
	if k.o.InferencePool != "" {
		_ = inf.SetTransform(slimPod)
		r.pool = k.poolInformer()
		infs = append(infs, r.pool)
	}
	for _, inf := range infs {
		// Before Run, as client-go requires. The reflector retries with
		// back-off on its own; the error is kept to explain an answer
		// that waits for a first list (RBAC denied, API server
		// unreachable).
		_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			r.mu.Lock()
			r.lastErr = err
			r.mu.Unlock()
			k.o.Logger.Warn("discovery: kubernetes list/watch failed; client-go retries, the last listed set is kept",
				"source", "kubernetes", "watch", k.Describe(), "error", err.Error())
		})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { k.poke() },
			UpdateFunc: func(any, any) { k.poke() },
			DeleteFunc: func(any) { k.poke() },
		})
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	synced := make([]cache.InformerSynced, len(infs))
	for i, inf := range infs {
		synced[i] = inf.HasSynced
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if cache.WaitForCacheSync(ctx.Done(), synced...) {
			close(r.synced)
			k.poke()
		}
	}()
	k.mu.Lock()
	k.run = r
	k.mu.Unlock()
	return func() {
		cancel()
		wg.Wait()
		k.mu.Lock()
		if k.run == r {
			k.run = nil
		}
		k.mu.Unlock()
	}
}

// Resolve implements Resolver from the informer's cache. Before the first
// list completes it waits up to SyncTimeout, then answers with an error
// (the watcher keeps the last good set).
func (k *KubernetesSource) Resolve(ctx context.Context) Answer {
	k.mu.Lock()
	r := k.run
	k.mu.Unlock()
	if r == nil {
		return Answer{Err: errors.New("kubernetes: not watching")}
	}
	t := time.NewTimer(k.o.SyncTimeout)
	defer t.Stop()
	select {
	case <-r.synced:
	case <-ctx.Done():
		return Answer{Err: ctx.Err()}
	case <-t.C:
		r.mu.Lock()
		last := r.lastErr
		r.mu.Unlock()
		msg := fmt.Sprintf("kubernetes: %s not listed within %v", k.Describe(), k.o.SyncTimeout)
		if last != nil {
			msg += ": " + last.Error()
		}
		return Answer{Err: errors.New(msg)}
	}
	var a Answer
	if k.o.InferencePool != "" {
		a = k.fromPool(r.pool.GetStore().List(), r.inf.GetStore().List())
	} else if k.o.Service != "" {
		a = k.fromSlices(r.inf.GetStore().List())
	} else {
		a = k.fromPods(r.inf.GetStore().List())
	}
	// The cache changes only through the watch, which notifies: the answer
	// does not expire, and the watcher's re-reads are a safety net at its
	// maximum interval.
	a.TTL = time.Duration(math.MaxInt64)
	return a
}

func (k *KubernetesSource) url(ip string, port int) string {
	return k.o.Scheme + "://" + net.JoinHostPort(ip, strconv.Itoa(port))
}

// finish sorts the endpoints and turns "ready endpoints exist but none has
// the port" into an error, which says more than an empty answer.
func (k *KubernetesSource) finish(eps []string, portless int, ports map[string]bool) Answer {
	if len(eps) == 0 && portless > 0 {
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range ports {
				if !yield(n) {
					return
				}
			}
		})
		return Answer{Err: fmt.Errorf("kubernetes: %d ready endpoint(s) of %s but none has a port named %q (ports seen: %s)",
			portless, k.Describe(), k.o.Port, strings.Join(names, ", "))}
	}
	slices.Sort(eps)
	return Answer{Endpoints: slices.Compact(eps)}
}

func (k *KubernetesSource) fromSlices(objs []any) Answer {
	var eps []string
	portless := 0
	ports := map[string]bool{}
	for _, o := range objs {
		s, ok := o.(*discoveryv1.EndpointSlice)
		// The watch's label selector already filters; checking again keeps
		// a stray object (or a fake server that ignores selectors) out.
		if !ok || s.Labels[discoveryv1.LabelServiceName] != k.o.Service {
			continue
		}
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices (ExternalName-like) name no pod
		}
		port := k.portNum
		if port == 0 {
			for _, p := range s.Ports {
				if p.Name != nil && p.Port != nil {
					ports[*p.Name] = true
					if *p.Name == k.o.Port {
						port = int(*p.Port)
					}
				}
			}
		}
		for _, ep := range s.Endpoints {
			// The API defines an unset ready condition as ready. A
			// terminating endpoint is reported not ready, so it drains.
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready || len(ep.Addresses) == 0 {
				continue
			}
			if port == 0 {
				portless++
				continue
			}
			// Addresses of one endpoint are fungible; the API lets
			// consumers use the first.
			eps = append(eps, k.url(ep.Addresses[0], port))
		}
	}
	return k.finish(eps, portless, ports)
}

func (k *KubernetesSource) fromPods(objs []any) Answer {
	var eps []string
	var roles map[string]string
	portless := 0
	ports := map[string]bool{}
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || !k.selector.Matches(labels.Set(p.Labels)) || !podReady(p) {
			continue
		}
		port := k.portNum
		if port == 0 {
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name != "" {
						ports[cp.Name] = true
					}
					if cp.Name == k.o.Port && port == 0 {
						port = int(cp.ContainerPort)
					}
				}
			}
		}
		if port == 0 {
			portless++
			continue
		}
		u := k.url(p.Status.PodIP, port)
		if k.o.RoleLabel != "" {
			role, ok := roleOf(p.Labels[k.o.RoleLabel])
			if !ok {
				continue // a role CART does not route to
			}
			if role != "" {
				if roles == nil {
					roles = map[string]string{}
				}
				roles[u] = role
			}
		}
		eps = append(eps, u)
	}
	a := k.finish(eps, portless, ports)
	a.Roles = roles
	return a
}

// podReady: running, Ready, with an IP, and not being deleted (a
// terminating pod may still report Ready for a moment; it must drain).
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
