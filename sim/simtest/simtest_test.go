package simtest

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/sim"
)

func TestURLsServeOneReplicaEach(t *testing.T) {
	urls := URLs(t, 2, func(i int) sim.Config { return sim.Config{Name: fmt.Sprint("r", i)} })
	if len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("URLs = %v, want two distinct", urls)
	}
	for i, u := range urls {
		resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got, want := resp.Header.Get("X-Sim-Replica"), fmt.Sprint("r", i); resp.StatusCode != http.StatusOK || got != want {
			t.Fatalf("%s: status %d, replica %q, want 200 from %q", u, resp.StatusCode, got, want)
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
