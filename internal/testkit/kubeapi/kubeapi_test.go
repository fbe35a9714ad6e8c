package kubeapi_test

import (
	"context"
	"reflect"
	"testing"

	"go.uber.org/goleak"

	"github.com/cartrouter/cart/controlplane/discovery"
	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/internal/testkit/kubeapi"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.IdleHTTPConns()...) }

// CART's own Kubernetes source, through client-go's real HTTP transport
// and a kubeconfig, lists the fake's slice: only its ready endpoints of
// the watched Service, in the kubeconfig's namespace.
func TestDiscoveryReadsTheFakeOverHTTP(t *testing.T) {
	s := kubeapi.Start(t, "inference", "vllm", "http", kubeapi.Endpoint{IP: "127.0.0.1", Port: 8001}, kubeapi.Endpoint{IP: "127.0.0.2", Port: 8002})
	k, err := discovery.NewKubernetesSource(discovery.KubernetesOptions{Kubeconfig: s.Kubeconfig(t, t.TempDir()), Service: "vllm", Port: "http"})
	if err != nil {
		t.Fatal(err)
	}
	if k.Namespace() != "inference" {
		t.Errorf("namespace %q, want the kubeconfig's", k.Namespace())
	}
	stop := k.Start(context.Background())
	a := k.Resolve(context.Background())
	stop()
	want := []string{"http://127.0.0.1:8001", "http://127.0.0.2:8002"}
	if a.Err != nil || !reflect.DeepEqual(a.Endpoints, want) {
		t.Fatalf("answer %+v, want %v", a, want)
	}
	if s.Lists() == 0 {
		t.Fatal("the answer did not come from a list request")
	}
}
