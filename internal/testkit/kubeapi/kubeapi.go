// Package kubeapi serves the slice of the Kubernetes API that CART's
// Kubernetes discovery reads (EndpointSlices of one namespace, or any fixed
// lists such as an InferencePool and its pods: list and watch) over real
// HTTP, so that a test can run the cart binary against it with an ordinary
// kubeconfig. It answers a streaming list
// (sendInitialEvents) the way an API server without that feature does, so
// client-go falls back to list-then-watch; a watch stays open, silent,
// until the client leaves.
package kubeapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Server is a fake API server holding a fixed set of EndpointSlices, or
// fixed list objects by path.
type Server struct {
	URL       string
	Namespace string
	slices    []discoveryv1.EndpointSlice
	fixed     map[string]any // path -> list object (StartLists)
	lists     atomic.Int64
}

// Endpoint is one ready address of a Service's EndpointSlice.
type Endpoint struct {
	IP   string
	Port int32
}

// Start serves, until the test ends, one EndpointSlice of service in
// namespace with the given ready endpoints, under the port name portName.
func Start(t testing.TB, namespace, service, portName string, eps ...Endpoint) *Server {
	t.Helper()
	s := &Server{Namespace: namespace}
	for i, e := range eps {
		name, port := portName, e.Port
		ready := true
		s.slices = append(s.slices, discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", service, i), Namespace: namespace, ResourceVersion: "1",
				Labels: map[string]string{discoveryv1.LabelServiceName: service}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{e.IP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
		})
	}
	s.start(t)
	return s
}

// StartLists serves, until the test ends, each list object at its path
// (e.g. /api/v1/namespaces/NS/pods: PodList(...)), whatever the selector:
// the client filters what it is given.
func StartLists(t testing.TB, namespace string, lists map[string]any) *Server {
	t.Helper()
	s := &Server{Namespace: namespace, fixed: lists}
	s.start(t)
	return s
}

func (s *Server) start(t testing.TB) {
	ts := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(ts.Close)
	s.URL = ts.URL
}

// PodList is a v1 PodList of pods (ReadyPod's), as JSON.
func PodList(pods ...map[string]any) map[string]any {
	return map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": "1"}, "items": pods}
}

// ReadyPod is a running, ready pod at ip with labels, as JSON.
func ReadyPod(name, ns, ip string, labels map[string]string) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": labels, "resourceVersion": "1"},
		"status": map[string]any{"phase": "Running", "podIP": ip,
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
	}
}

// PoolList is an InferencePoolList (inference.networking.k8s.io/v1) of one
// pool selecting pods by selector on ports, as JSON.
func PoolList(name, ns string, selector map[string]string, ports ...int) map[string]any {
	var tps []any
	for _, p := range ports {
		tps = append(tps, map[string]any{"number": p})
	}
	return map[string]any{"kind": "InferencePoolList", "apiVersion": "inference.networking.k8s.io/v1", "metadata": map[string]any{"resourceVersion": "1"},
		"items": []any{map[string]any{
			"metadata": map[string]any{"name": name, "namespace": ns, "resourceVersion": "1"},
			"spec":     map[string]any{"selector": map[string]any{"matchLabels": selector}, "targetPorts": tps},
		}}}
}

// Lists counts the list requests answered: a client that listed has the
// slices.
func (s *Server) Lists() int64 { return s.lists.Load() }

// Kubeconfig writes a kubeconfig for this server (token auth, its
// namespace as the context's) under dir and returns its path.
func (s *Server) Kubeconfig(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: cart, user: {token: fake-token}}]
contexts: [{name: fake, context: {cluster: fake, user: cart, namespace: %s}}]
current-context: fake
`, s.URL, s.Namespace)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	fixed, isFixed := s.fixed[r.URL.Path]
	if r.Method != http.MethodGet || !isFixed && r.URL.Path != "/apis/discovery.k8s.io/v1/namespaces/"+s.Namespace+"/endpointslices" {
		status(w, http.StatusNotFound, "NotFound", "the fake does not serve "+r.Method+" "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		if q.Get("sendInitialEvents") == "true" {
			status(w, http.StatusBadRequest, "BadRequest", "sendInitialEvents is not supported")
			return
		}
		// Nothing changes: hold the watch open until the client leaves.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		<-r.Context().Done()
		return
	}
	if isFixed {
		s.lists.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(fixed)
		return
	}
	var out []discoveryv1.EndpointSlice
	for _, sl := range s.slices {
		if selects(q.Get("labelSelector"), sl.Labels) {
			out = append(out, sl)
		}
	}
	s.lists.Add(1)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(discoveryv1.EndpointSliceList{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items:    out,
	})
}

// selects evaluates an equality-only selector (k=v,k2=v2), which is what
// the service mode sends.
func selects(sel string, labels map[string]string) bool {
	if sel == "" {
		return true
	}
	for _, term := range strings.Split(sel, ",") {
		k, v, ok := strings.Cut(term, "=")
		if !ok || labels[k] != v {
			return false
		}
	}
	return true
}

func status(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Message: msg, Reason: metav1.StatusReason(reason), Code: int32(code)})
}
