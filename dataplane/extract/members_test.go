package extract

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestRewriteMembers(t *testing.T) {
	set := []Member{{Name: "stream", Value: []byte("false")}, {Name: "max_completion_tokens", Value: []byte("1"), IfPresent: true}, {Name: "kv_transfer_params", Value: []byte(`{"do_remote_decode":true}`)}}
	for _, c := range []struct{ in, want string }{
		{`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`},
		// Every spelling of a name goes; members keep their bytes.
		{`{ "kv\u005ftransfer_params" : {"remote_host":"evil"} , "a" : [1, 2] ,"max_completion_tokens":50, "stream_options": null}`,
			`{"a" : [1, 2],"stream":false,"max_completion_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`},
		// Case differs: another member for the engine, kept.
		{`{"Stream":true}`, `{"Stream":true,"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`},
		{`{}`, `{"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`},
	} {
		got, err := RewriteMembers([]byte(c.in), set, "stream_options")
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if string(got) != c.want {
			t.Errorf("RewriteMembers(%s)\n got %s\nwant %s", c.in, got, c.want)
		}
		if !json.Valid(got) {
			t.Errorf("%s: invalid JSON out", got)
		}
	}
	for _, bad := range []string{`[1]`, `{"a":`, `nope`, ``} {
		if _, err := RewriteMembers([]byte(bad), set); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzRewriteMembers: whatever the body, the result is valid JSON whose
// top-level members are the input's, less the dropped ones, plus the set
// ones with their values (as Python's json.loads reads them: last
// duplicate wins).
func FuzzRewriteMembers(f *testing.F) {
	for _, s := range []string{`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":9}`, `{"kv\u005ftransfer_params":1,"max_tokens":2,"max_tokens":3}`, `{}`, `{"a":"\"}"}`, `[]`} {
		f.Add([]byte(s))
	}
	set := []Member{{Name: "stream", Value: []byte("false")}, {Name: "max_tokens", Value: []byte("1")}, {Name: "max_completion_tokens", Value: []byte("1"), IfPresent: true}}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := RewriteMembers(body, set, "stream_options")
		var in map[string]any
		if json.Unmarshal(body, &in) != nil {
			if err == nil && !json.Valid(body) {
				t.Fatalf("invalid body accepted: %q", body)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%q -> invalid %q: %v", body, out, err)
		}
		want := map[string]any{}
		for k, v := range in {
			want[k] = v
		}
		_, hadMCT := in["max_completion_tokens"]
		delete(want, "stream_options")
		want["stream"], want["max_tokens"] = false, float64(1)
		if hadMCT {
			want["max_completion_tokens"] = float64(1)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q -> %q: members %v, want %v", body, out, got, want)
		}
	})
}
