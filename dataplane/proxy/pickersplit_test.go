package proxy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/proxy"
)

// In a split pool a picker names one endpoint, so it routes whole: a
// split decision would take load on a prefill worker that no leg ever
// reaches, and never give it back.
func TestPickerRoutesWholeInASplitPool(t *testing.T) {
	p, d, b := newBackend(t, "p"), newBackend(t, "d"), newBackend(t, "b")
	r := splitRig(t, map[*backend]engine.Role{p: engine.RolePrefill, d: engine.RoleDecode, b: engine.RoleBoth}, []*backend{p, d, b})
	picked := make(chan *proxy.Pick, 1)
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+longText("q", 400)+`"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req = req.WithContext(proxy.WithPicker(context.Background(), proxy.PickOptions{Picked: func(pk *proxy.Pick) { picked <- pk }}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.proxy.ServeHTTP(httptest.NewRecorder(), req)
	}()
	var pk *proxy.Pick
	select {
	case pk = <-picked:
	case <-done:
		t.Fatal("the handler returned without picking")
	case <-time.After(10 * time.Second):
		t.Fatal("no pick within 10 s")
	}
	if pk.Worker != b.URL {
		t.Fatalf("picked %s, want the whole worker %s", pk.Worker, b.URL)
	}
	if got := r.loads(); got[p.URL] != 0 || got[b.URL] != 1 {
		t.Fatalf("loads while picked: %v; want only the picked worker's", got)
	}
	pk.Finish(false)
	<-done
	r.waitLoadZero()
}
