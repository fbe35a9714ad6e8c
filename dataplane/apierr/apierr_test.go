package apierr

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestAnthropicType(t *testing.T) {
	for status, want := range map[int]string{
		400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
		404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
		500: "api_error", 502: "api_error", 504: "api_error", 503: "overloaded_error", 529: "overloaded_error",
		408: "invalid_request_error",
	} {
		if got := AnthropicType(status); got != want {
			t.Errorf("AnthropicType(%d) = %q, want %q", status, got, want)
		}
	}
}

func TestWriteForPicksShapeByPath(t *testing.T) {
	e := New(http.StatusTooManyRequests, TypeInvalidRequest, "slow_down", "slow down")
	for path, anthropic := range map[string]bool{"/v1/messages": true, "/v1/messages/count_tokens": true, "/v1/messagesx": false, "/v1/chat/completions": false} {
		rec := httptest.NewRecorder()
		WriteFor(rec, httptest.NewRequest("POST", path, nil), e)
		var got map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 429 {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
		inner, _ := got["error"].(map[string]any)
		if anthropic {
			if got["type"] != "error" || inner["type"] != "rate_limit_error" || inner["message"] != "slow down" {
				t.Errorf("%s: %s", path, rec.Body)
			}
		} else if got["type"] != nil || inner["type"] != TypeInvalidRequest || inner["code"] != "slow_down" {
			t.Errorf("%s: %s", path, rec.Body)
		}
	}
}
