package discovery

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	infclient "sigs.k8s.io/gateway-api-inference-extension/client-go/clientset/versioned/typed/api/v1"
)

// The InferencePool mode reads the pool (inference.networking.k8s.io/v1,
// the Gateway API Inference Extension's GA API) with the extension's own
// generated client and types: its selector picks the pods, each of its
// target ports makes one worker per ready pod ("podIP:port" is an
// endpoint, as the extension defines it). The pool is watched by name,
// the namespace's pods all (slimmed to what readiness needs): a pool
// whose selector changes needs no new watch.

// InferencePools is the part of the extension's clientset discovery uses.
// As with KubernetesClient, taking the typed client keeps the extension's
// other API groups out; a fake clientset fits too (and tells the reflector
// it cannot stream lists).
type InferencePools interface {
	InferenceV1() infclient.InferenceV1Interface
}

type poolClient struct{ c *infclient.InferenceV1Client }

func (p poolClient) InferenceV1() infclient.InferenceV1Interface { return p.c }

func newPoolClient(cfg *rest.Config) (InferencePools, error) {
	h, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c, err := infclient.NewForConfigAndClient(cfg, h)
	if err != nil {
		return nil, err
	}
	return poolClient{c}, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkPool checks the pool mode's options: a pool name, and no port
// (the pool's target ports are the ports).
func (k *KubernetesSource) checkPool() error {
	if errs := validation.IsDNS1123Subdomain(k.o.InferencePool); len(errs) > 0 {
		return fmt.Errorf("kubernetes discovery: inference_pool %q: %s", k.o.InferencePool, strings.Join(errs, "; "))
	}
	if k.o.Port != "" {
		return fmt.Errorf("kubernetes discovery: port %q is set, but the InferencePool's targetPorts are the ports: leave port empty", k.o.Port)
	}
	return nil
}

// poolInformer watches the one pool.
func (k *KubernetesSource) poolInformer() cache.SharedIndexInformer {
	pools := k.o.Pools.InferenceV1().InferencePools(k.o.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", k.o.InferencePool).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			lo.FieldSelector = byName
			return pools.List(ctx, lo)
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			lo.FieldSelector = byName
			return pools.Watch(ctx, lo)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, k.o.Pools), &infv1.InferencePool{}, 0, cache.Indexers{})
}

// slimPod keeps of a pod what the pool mode reads: its name and labels,
// whether it is being deleted, its phase, IP and Ready condition. The
// namespace's other pods then cost little in the informer's cache.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a deletion tombstone
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp}}
	out.Status.Phase, out.Status.PodIP = p.Status.Phase, p.Status.PodIP
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out, nil
}

// fromPool answers the pool's ready pods on each of its target ports.
func (k *KubernetesSource) fromPool(pools, pods []any) Answer {
	var pool *infv1.InferencePool
	for _, o := range pools {
		if p, ok := o.(*infv1.InferencePool); ok && p.Name == k.o.InferencePool {
			pool = p
		}
	}
	if pool == nil {
		return Answer{Err: fmt.Errorf("kubernetes: InferencePool %s/%s not found", k.o.Namespace, k.o.InferencePool)}
	}
	set := labels.Set{}
	for key, v := range pool.Spec.Selector.MatchLabels {
		set[string(key)] = string(v)
	}
	if len(set) == 0 {
		return Answer{Err: fmt.Errorf("kubernetes: InferencePool %s/%s selects no pods (its selector.matchLabels is empty)", k.o.Namespace, k.o.InferencePool)}
	}
	if len(pool.Spec.TargetPorts) == 0 {
		return Answer{Err: fmt.Errorf("kubernetes: InferencePool %s/%s has no targetPorts", k.o.Namespace, k.o.InferencePool)}
	}
	sel := labels.SelectorFromValidatedSet(set)
	var eps []string
	for _, o := range pods {
		p, ok := o.(*corev1.Pod)
		if !ok || !sel.Matches(labels.Set(p.Labels)) || !podReady(p) {
			continue
		}
		for _, tp := range pool.Spec.TargetPorts {
			if n := int(tp.Number); n >= 1 && n <= 65535 {
				eps = append(eps, k.url(p.Status.PodIP, n))
			}
		}
	}
	slices.Sort(eps)
	return Answer{Endpoints: slices.Compact(eps)}
}
