package discovery

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inffake "sigs.k8s.io/gateway-api-inference-extension/client-go/clientset/versioned/fake"
)

func inferencePool(name string, sel map[string]string, ports ...int32) *infv1.InferencePool {
	p := &infv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	p.Spec.Selector.MatchLabels = map[infv1.LabelKey]infv1.LabelValue{}
	for k, v := range sel {
		p.Spec.Selector.MatchLabels[infv1.LabelKey(k)] = infv1.LabelValue(v)
	}
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, infv1.Port{Number: infv1.PortNumber(n)})
	}
	return p
}

// The pool's selector picks the pods and each of its target ports makes a
// worker of every ready one (a data-parallel engine serving on two ports
// is two endpoints); another pool of the namespace is not read.
func TestInferencePoolAnswer(t *testing.T) {
	app := map[string]string{"app": "vllm"}
	pods := []runtime.Object{
		pod("p-1", "10.2.0.1", true, app, nil),
		pod("p-2", "10.2.0.2", true, map[string]string{"app": "vllm", "extra": "x"}, nil),
		pod("p-unready", "10.2.0.3", false, app, nil),
		pod("p-other", "10.2.0.4", true, map[string]string{"app": "sglang"}, nil),
	}
	pools := inffake.NewClientset(inferencePool("chat", app, 8000, 8001), inferencePool("other", map[string]string{"app": "sglang"}, 9000))
	a := resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(pods...), Pools: pools, InferencePool: "chat"}))
	want := []string{"http://10.2.0.1:8000", "http://10.2.0.1:8001", "http://10.2.0.2:8000", "http://10.2.0.2:8001"}
	if a.Err != nil || !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("pool answer %+v, want %v", a, want)
	}
	for name, c := range map[string]struct {
		pool *infv1.InferencePool
		want string
	}{
		"missing pool":    {inferencePool("elsewhere", app, 8000), "not found"},
		"empty selector":  {inferencePool("chat", nil, 8000), "selects no pods"},
		"no target ports": {inferencePool("chat", app), "no targetPorts"},
	} {
		a := resolveOnce(t, k8sSource(t, KubernetesOptions{Client: fake.NewClientset(pods...), Pools: inffake.NewClientset(c.pool), InferencePool: "chat"}))
		if a.Err == nil || !strings.Contains(a.Err.Error(), c.want) {
			t.Errorf("%s: %+v, want an error mentioning %q", name, a, c.want)
		}
	}
}

// Changes come from the watches alone: a pod turning ready joins, a pool
// whose selector moves to other pods swaps the workers.
func TestInferencePoolWatch(t *testing.T) {
	ctx := context.Background()
	app := map[string]string{"app": "vllm"}
	kc := fake.NewClientset(pod("p-1", "10.2.0.1", true, app, nil), pod("p-2", "10.2.0.2", false, app, nil),
		pod("q-1", "10.3.0.1", true, map[string]string{"app": "vllm-next"}, nil))
	// The simple clientset: the field-managed one cannot apply updates to
	// a type whose schema it was not given.
	pc := inffake.NewSimpleClientset(inferencePool("chat", app, 8000))
	k := k8sSource(t, KubernetesOptions{Client: kc, Pools: pc, InferencePool: "chat"})
	sink := newSink()
	runWatcher(t, k, sink, 1)
	waitPool(t, sink, "first list", map[string]string{"http://static:1": "static", "http://10.2.0.1:8000": "kubernetes"})

	ready := pod("p-2", "10.2.0.2", true, app, nil)
	if _, err := kc.CoreV1().Pods(ns).Update(ctx, ready, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sink, "a pod turned ready", map[string]string{"http://static:1": "static", "http://10.2.0.1:8000": "kubernetes", "http://10.2.0.2:8000": "kubernetes"})

	moved := inferencePool("chat", map[string]string{"app": "vllm-next"}, 8000)
	if _, err := pc.InferenceV1().InferencePools(ns).Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, sink, "the selector moved", map[string]string{"http://static:1": "static", "http://10.3.0.1:8000": "kubernetes"})
}

// The pods the pool mode caches keep only what readiness needs.
func TestSlimPod(t *testing.T) {
	p := pod("p-1", "10.2.0.1", true, map[string]string{"app": "vllm"}, map[string]int32{"http": 8000})
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: strings.Repeat("x", 1<<16)}}
	p.Annotations = map[string]string{"big": strings.Repeat("y", 1<<16)}
	out, err := slimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	s := out.(*corev1.Pod)
	if len(s.Spec.Containers) != 0 || s.Annotations != nil || !podReady(s) || s.Labels["app"] != "vllm" || s.Status.PodIP != "10.2.0.1" {
		t.Fatalf("slimmed pod %+v: want labels, IP and readiness only", s)
	}
}
