package extract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// topLevel decodes a body's top-level members as Python's json.loads does
// with a repeated name: the last one wins.
func topLevel(t testing.TB, body []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, body)
	}
	return m
}

func TestSetCacheSalt(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"added", `{"model":"m","messages":[]}`, `{"model":"m","messages":[],"cache_salt":"S"}`},
		{"replaced in place of the client's", `{"cache_salt":"mine","model":"m"}`, `{"model":"m","cache_salt":"S"}`},
		{"escaped name", `{"model":"m","cache\u005fsalt":"mine"}`, `{"model":"m","cache_salt":"S"}`},
		{"null", `{"cache_salt":null}`, `{"cache_salt":"S"}`},
		{"empty object", ` { } `, `{"cache_salt":"S"}`},
		{"whitespace and nesting kept", "{\n \"a\" : {\"cache_salt\":\"inner\"} ,\t\"b\":[1, 2]\n}\n", `{"a" : {"cache_salt":"inner"},"b":[1, 2],"cache_salt":"S"}`},
		{"case variant is another name", `{"Cache_Salt":"x"}`, `{"Cache_Salt":"x","cache_salt":"S"}`},
	} {
		got, err := SetCacheSalt([]byte(tc.in), "S")
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s, %v; want %s", tc.name, got, err, tc.want)
		}
	}
	for _, in := range []string{``, `[]`, `"x"`, `{"a":1`, `{"a":1}{}`, `{"a":1} x`, `{"a":}`, `{a:1}`} {
		if got, err := SetCacheSalt([]byte(in), "S"); err == nil {
			t.Errorf("%q accepted: %s", in, got)
		}
	}
}

// FuzzSetCacheSalt: whatever object comes in, what goes out is one JSON
// object whose cache_salt is the salt, as Python reads it (last of
// duplicates), and whose other members are exactly the input's.
func FuzzSetCacheSalt(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"cache_salt":"c"}`,
		`{"cache_salt":"a","cache_salt":"b"}`,
		`{"cache\u005fsalt":1,"x":{"cache_salt":2}}`,
		"{\"a\":\"\\\",\\\"cache_salt\\\":\\\"x\"}",
		` {} `, `{"a":[1,{"b":null}],"c":true}`, `[1]`, `{"a":1,}`,
	} {
		f.Add([]byte(s), "salt")
	}
	f.Fuzz(func(t *testing.T, body []byte, salt string) {
		out, err := SetCacheSalt(body, salt)
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil || in == nil {
			if err == nil {
				t.Fatalf("not an object, yet rewritten: %q -> %q", body, out)
			}
			return
		}
		if err != nil {
			t.Fatalf("object refused: %q: %v", body, err)
		}
		if !json.Valid(out) {
			t.Fatalf("invalid JSON out: %q -> %q", body, out)
		}
		got := topLevel(t, out)
		var s, want string
		q, _ := json.Marshal(salt) // CART's salts are base64: this is for the fuzzer's
		_ = json.Unmarshal(q, &want)
		if json.Unmarshal(got[CacheSaltField], &s) != nil || s != want {
			t.Fatalf("cache_salt %s, want %q", got[CacheSaltField], salt)
		}
		if n := bytes.Count(out, []byte(`"cache_salt":`)); n < 1 {
			t.Fatalf("no cache_salt member in %q", out)
		}
		delete(in, CacheSaltField)
		delete(got, CacheSaltField)
		if len(in) != len(got) {
			t.Fatalf("members %d -> %d: %q -> %q", len(in), len(got), body, out)
		}
		for k, v := range in {
			if !bytes.Equal(bytes.TrimSpace(got[k]), bytes.TrimSpace(v)) {
				t.Fatalf("member %q: %s -> %s", k, v, got[k])
			}
		}
	})
}

// longChatBody is a 105 KB chat completions body: 100 turns.
func longChatBody() []byte {
	msgs := make([]map[string]string, 0, 100)
	for i := range 100 {
		msgs = append(msgs, map[string]string{"role": "user", "content": strings.Repeat(fmt.Sprintf("turn %d of a long conversation. ", i), 32)})
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "cache_salt": "client"})
	return body
}

// BenchmarkSetCacheSalt rewrites a 105 KB chat body, the cost an isolated
// tenant's request pays on top of extraction.
func BenchmarkSetCacheSalt(b *testing.B) {
	body := longChatBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SetCacheSalt(body, "0123456789abcdef0123456789abcdef0123456789a"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtractChat100K is extraction of the body BenchmarkSetCacheSalt
// rewrites, for comparison: what every routed request pays already.
func BenchmarkExtractChat100K(b *testing.B) {
	body := longChatBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Extract(ChatCompletions, body); err != nil {
			b.Fatal(err)
		}
	}
}
