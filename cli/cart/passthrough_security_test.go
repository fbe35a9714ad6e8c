package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/testkit"
)

func postJSON(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, b, _ := testkit.PostJSON(t, url, body)
	return resp.StatusCode, b
}

func simState(t *testing.T, replica, what string) map[string]any {
	t.Helper()
	resp, err := http.Get(replica + "/sim/" + what)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Found by attack: POST /sim/fault through CART put every replica into
// failure mode, and remote media URLs reached the replicas with the policy
// on. Against the real server and real simulated replicas, with the
// shipped defaults plus the policy.
func TestAdminAndRemoteMediaNeverReachReplicas(t *testing.T) {
	base, reps := startAllInOne(t, 2, func(c *config.Config) { c.Proxy.RemoteMediaURLPolicy = 403 })
	for range 3 {
		if code, body := postJSON(t, base+"/sim/fault", `{"mode":"down"}`); code != http.StatusNotFound || !strings.Contains(body, `"error"`) {
			t.Fatalf("POST /sim/fault through CART: %d %s, want an OpenAI-shaped 404", code, body)
		}
	}
	for _, rep := range reps {
		if mode := simState(t, rep.URL, "fault")["mode"]; mode != "none" {
			t.Fatalf("replica %s switched to fault mode %v through CART", rep.URL, mode)
		}
	}
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"part of unknown type with uuid", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":[{"type":"x","uuid":"u","image_url":"http://169.254.169.254/x"}]}]}`, 403},
		{"url and URL", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x","URL":"data:image/png;base64,AA"}}]}]}`, 400},
		{"Messages after messages", "/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":"hi"}],"Messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/x"}}]}]}`, 400},
		{"anthropic source Type", "/v1/messages", `{"model":"sim","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"http://169.254.169.254/x","Type":"base64","media_type":"image/png","data":"AA"}}]}]}`, 400},
		{"responses input_image", "/v1/responses", `{"model":"sim","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://169.254.169.254/x"}]}]}`, 403},
		{"sglang image_data", "/generate", `{"text":"t","image_data":["http://169.254.169.254/x"]}`, 403},
	} {
		if code, body := postJSON(t, base+tc.path, tc.body); code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, body, tc.want)
		}
	}
	for _, rep := range reps {
		if n := simState(t, rep.URL, "stats")["requests"]; n != float64(0) {
			t.Fatalf("replica %s received %v inference requests", rep.URL, n)
		}
	}
	// The pool still serves.
	if code, body := postJSON(t, base+"/v1/chat/completions", `{"model":"sim","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"hi"}]}]}`); code != http.StatusOK {
		t.Fatalf("inline image refused: %d %s", code, body)
	}
}
