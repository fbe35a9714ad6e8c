package simtest

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/cartrouter/cart/internal/testkit"
	"github.com/cartrouter/cart/sim"
)

func TestURLsServeOneReplicaEach(t *testing.T) {
	urls := URLs(t, 2, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("r", i)} })
	if len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("URLs = %v, want two distinct", urls)
	}
	for i, u := range urls {
		resp, _, err := testkit.PostJSON(t, u+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
		if got, want := resp.Header.Get("X-Sim-Replica"), fmt.Sprint("r", i); err != nil || resp.StatusCode != http.StatusOK || got != want {
			t.Fatalf("%s: status %d, replica %q (%v), want 200 from %q", u, resp.StatusCode, got, err, want)
		}
	}
}

func TestServeClosesTheReplicaWithTheTest(t *testing.T) {
	var r *Replica
	t.Run("inner", func(t *testing.T) { r = Start(t, sim.Config{Name: "x"}) })
	if _, err := http.Get(r.URL + "/v1/models"); err == nil {
		t.Fatal("the replica still answers after its test ended")
	}
}
