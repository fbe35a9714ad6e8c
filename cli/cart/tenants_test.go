package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/internal/testkit"
)

// Attack #4 against the all-in-one router and real cart-sim replicas: a
// response tenant team-a made is team-a's. team-b asking for it, or
// continuing it, gets exactly what the replica answers for an id nobody
// made; team-a is served.
func TestResponsesBelongToTheirTenant(t *testing.T) {
	base, _ := startAllInOne(t, 3, func(c *config.Config) {
		c.Auth.ClientKeys = []config.ClientKey{{Name: "team-a", Key: "cli-key-team-a-0001"}, {Name: "team-b", Key: "cli-key-team-b-0002"}}
	})
	a, b := []string{"Authorization", "Bearer cli-key-team-a-0001"}, []string{"Authorization", "Bearer cli-key-team-b-0002"}
	do := func(method, path, body string, key []string) (int, string) {
		t.Helper()
		resp, got, err := testkit.Do(t, method, base+path, body, key...)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, got
	}
	code, body := do(http.MethodPost, "/v1/responses", `{"model":"sim","input":"team-a's question"}`, a)
	var made struct{ ID string }
	if code != http.StatusOK || json.Unmarshal([]byte(body), &made) != nil || made.ID == "" {
		t.Fatalf("team-a creates a response: %d %s", code, body)
	}
	const unknownID = "resp_nobodymadethis0"
	code, unknown := do(http.MethodGet, "/v1/responses/"+unknownID, "", a)
	if code != http.StatusNotFound {
		t.Fatalf("unknown id: %d %s", code, unknown)
	}
	var want any
	_ = json.Unmarshal([]byte(strings.ReplaceAll(unknown, unknownID, made.ID)), &want)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/responses/" + made.ID, ""},
		{http.MethodPost, "/v1/responses", `{"model":"sim","input":"more","previous_response_id":"` + made.ID + `"}`},
		{http.MethodPost, "/v1/responses", `{"model":"sim","input":"more","stream":true,"previous_response_id":"` + made.ID + `"}`},
	} {
		code, body := do(c.method, c.path, c.body, b)
		var got any
		_ = json.Unmarshal([]byte(body), &got)
		if g, w := mustJSON(got), mustJSON(want); code != http.StatusNotFound || g != w {
			t.Errorf("team-b %s %s: %d %s, want 404 %s", c.method, c.path, code, g, w)
		}
	}
	if code, body := do(http.MethodGet, "/v1/responses/"+made.ID, "", a); code != http.StatusOK || !strings.Contains(body, made.ID) {
		t.Fatalf("team-a reads its response: %d %s", code, body)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
