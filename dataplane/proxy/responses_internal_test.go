package proxy

import "testing"

func TestFindResponseID(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"id":"resp_abc","object":"response"}`, "resp_abc"},
		{`{"object":"response", "id" : "resp_x1"}`, "resp_x1"},
		{"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"output\":[]}}", "resp_9"},
		{`{"output":[{"id":"msg_1"}],"id":"resp_2"}`, "resp_2"},
		{`{"previous_response_id":"resp_old","id":"resp_new"}`, "resp_new"},
		{`{"text":"\"id\":\"resp_forged\"","id":"resp_real"}`, "resp_real"},
		{`{"id":"resp_incompl`, ""},
		{`{"id":"chatcmpl-1"}`, ""},
	} {
		got, ok := findResponseID([]byte(tc.in))
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("findResponseID(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
		}
	}
}
