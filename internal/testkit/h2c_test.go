package testkit

import (
	"fmt"
	"io"
	"net/http"
	"testing"
)

func TestH2CServerSpeaksBothProtocols(t *testing.T) {
	srv := H2CServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, r.Proto) }))
	srv.Start()
	defer srv.Close()
	h2 := H2CClient()
	defer h2.CloseIdleConnections()
	for _, c := range []struct {
		client *http.Client
		want   string
	}{{h2, "HTTP/2.0"}, {&http.Client{Transport: &http.Transport{}}, "HTTP/1.1"}} {
		resp, err := c.client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != c.want {
			t.Fatalf("served as %q, want %q", b, c.want)
		}
	}
}
