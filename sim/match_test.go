package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestMatchReportsCachedPrefixWithoutSideEffects(t *testing.T) {
	s, ts := startReplica(t, Config{})
	body := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("shared system prompt ", 40) + `"},{"role":"user","content":"q"}]}`
	match := func() MatchReport {
		t.Helper()
		resp, err := http.Post(ts.URL+"/sim/match", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m MatchReport
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := match(); m.CachedTokens != 0 || m.PromptTokens == 0 {
		t.Fatalf("cold replica: %+v", m)
	}
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	before := s.Stats()
	m := match()
	if m.CachedTokens == 0 || m.CachedTokens > m.PromptTokens {
		t.Fatalf("after serving the prompt: %+v", m)
	}
	if after := s.Stats(); after.Requests != before.Requests || after.CachedTokens != before.CachedTokens {
		t.Fatalf("match changed the replica's counters: %+v -> %+v", before, after)
	}
}
