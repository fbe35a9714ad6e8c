package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// fakeKubeAPI is the least of a Kubernetes API server a client-go
// informer needs, for a real process to discover workers from: a list
// of each resource (the watch-list request is refused, so the reflector
// falls back to list then watch, as against an API server without the
// feature) and a watch that stays open and quiet.
type fakeKubeAPI struct {
	*httptest.Server
	lists map[string]any // path -> list object
}

func newFakeKubeAPI(t *testing.T, lists map[string]any) *fakeKubeAPI {
	t.Helper()
	f := &fakeKubeAPI{lists: lists}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeKubeAPI) serve(w http.ResponseWriter, r *http.Request) {
	list, ok := f.lists[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case q.Get("sendInitialEvents") == "true":
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"BadRequest","code":400,"message":"watch-list is not served here"}`))
	case q.Get("watch") == "true":
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		_ = json.NewEncoder(w).Encode(list)
	}
}

// kubeconfig writes a kubeconfig for the fake server and returns its path.
func (f *fakeKubeAPI) kubeconfig(t *testing.T, namespace string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: %q}}]
users: [{name: fake, user: {token: test}}]
contexts: [{name: fake, context: {cluster: fake, user: fake, namespace: %s}}]
current-context: fake
`, f.URL, namespace)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// podList and poolList are the API's list objects, as JSON maps.
func podList(pods ...map[string]any) map[string]any {
	return map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": "1"}, "items": pods}
}

func readyPod(name, ns, ip string, labels map[string]string) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": labels, "resourceVersion": "1"},
		"status": map[string]any{"phase": "Running", "podIP": ip,
			"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
	}
}

func poolList(name, ns string, selector map[string]string, ports ...int) map[string]any {
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
