package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// cachedTokensOf reads the cached prompt tokens from an answer of any of
// the generation APIs.
func cachedTokensOf(t *testing.T, body []byte) int {
	t.Helper()
	var v struct {
		Usage struct {
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
			CacheReadInputTokens *int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	switch u := v.Usage; {
	case u.PromptTokensDetails != nil:
		return u.PromptTokensDetails.CachedTokens
	case u.InputTokensDetails != nil:
		return u.InputTokensDetails.CachedTokens
	case u.CacheReadInputTokens != nil:
		return *u.CacheReadInputTokens
	}
	t.Fatalf("no cached tokens in %s", body)
	return 0
}

// cache_salt isolates the cache as vLLM's does, on the endpoints whose
// requests declare it (chat completions, completions, responses): the same
// prompt with another salt, or without one, shares no block. vLLM's
// Messages request has no such field, so there the salt changes nothing.
// An empty salt is refused, as vLLM's validation refuses it.
func TestCacheSaltIsolatesCache(t *testing.T) {
	prompt := strings.Repeat("A long prompt that two tenants both send. ", 20)
	bodies := map[string]func(salt any) map[string]any{
		pathChat: func(salt any) map[string]any {
			return map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": prompt}}, "cache_salt": salt}
		},
		pathCompletions: func(salt any) map[string]any {
			return map[string]any{"model": "m", "prompt": prompt, "cache_salt": salt}
		},
		pathResponses: func(salt any) map[string]any {
			return map[string]any{"model": "m", "input": prompt, "cache_salt": salt}
		},
		pathMessages: func(salt any) map[string]any {
			return map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": prompt}}, "cache_salt": salt}
		},
	}
	for path, body := range bodies {
		t.Run(strings.TrimPrefix(path, "/v1/"), func(t *testing.T) {
			_, ts := startReplica(t, Config{})
			send := func(salt any) int {
				t.Helper()
				resp, b := mustPost(t, ts, path, body(salt))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("salt %v: %d %s", salt, resp.StatusCode, b)
				}
				return cachedTokensOf(t, b)
			}
			send("tenant-a")
			if n := send("tenant-a"); n == 0 {
				t.Fatal("the same salt again cached nothing")
			}
			other, none := send("tenant-b"), send(nil)
			if path == pathMessages {
				if other == 0 || none == 0 {
					t.Fatalf("/v1/messages: other salt cached %d, no salt %d; want both cached (vLLM ignores the field there)", other, none)
				}
				return
			}
			if other != 0 || none != 0 {
				t.Fatalf("other salt cached %d, no salt %d; want 0 and 0", other, none)
			}
			if resp, b := mustPost(t, ts, path, body("")); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "cache_salt") {
				t.Fatalf("empty salt: %d %s, want 400 about cache_salt", resp.StatusCode, b)
			}
		})
	}
}
