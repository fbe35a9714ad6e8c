package service

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// RouterService answers go out uncompressed even above CompressMinBytes
// and to a client that accepts gzip: its large answers are placement-feed
// frames of random hashes, which gzip cannot shrink. AdminService answers
// still compress (the control that shows the client would get gzip).
func TestRouterServiceAnswersNotCompressed(t *testing.T) {
	var workers []string
	for i := range 120 {
		workers = append(workers, fmt.Sprintf("http://worker-%03d.inference-pool.example.svc.cluster.local:8000", i))
	}
	cp, _ := leaderWith(t, workers...)
	post := func(procedure, body string) (encoding string, n int) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, cp.url+procedure, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := cp.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %v %.200s", procedure, resp.StatusCode, err, b)
		}
		return resp.Header.Get("Content-Encoding"), len(b)
	}
	if enc, n := post("/cart.v1.AdminService/ListWorkers", `{}`); enc != "gzip" {
		t.Fatalf("ListWorkers answer of %d bytes sent with encoding %q; the control expects gzip", n, enc)
	}
	enc, n := post("/cart.v1.RouterService/Sync", `{"dataplaneId":"t"}`)
	if enc != "" {
		t.Fatalf("Sync answer compressed (%q, %d bytes)", enc, n)
	}
	if n <= CompressMinBytes {
		t.Fatalf("Sync answer of %d bytes: too small to test", n)
	}
}
