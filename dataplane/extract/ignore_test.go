package extract

import (
	"strings"
	"testing"
)

func keyWith(t *testing.T, e Endpoint, o Options, body string) string {
	t.Helper()
	r, err := ExtractOptions(e, []byte(body), o)
	if err != nil {
		t.Fatalf("ExtractOptions(%s, %s): %v", e, body, err)
	}
	return string(r.Key)
}

// Claude Code's first system block carries a per-request hash; vLLM drops
// it before templating, so by default it is not part of the key either.
func TestBillingHeaderLeftOutOfKey(t *testing.T) {
	const sys = `{"type":"text","text":"You are Claude Code."},{"type":"text","text":"Long instructions."}`
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	billing := func(h string) string {
		return `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.3; cch=` + h + `;"}`
	}
	want := "system" + US + "You are Claude Code." + US + "Long instructions." + RS + "user" + US + "hi" + RS
	for name, body := range map[string]string{
		"without":        `{"system":[` + sys + `],` + msgs + `}`,
		"first block":    `{"system":[` + billing("a1b2c") + `,` + sys + `],` + msgs + `}`,
		"other hash":     `{"system":[` + billing("ffff0") + `,` + sys + `],` + msgs + `}`,
		"escaped prefix": `{"system":[{"type":"text","text":"x-anthropic-billing\u002dheader: cch=1;"},` + sys + `],` + msgs + `}`,
	} {
		if got := key(t, Messages, body); got != want {
			t.Errorf("%s: key %q, want %q", name, got, want)
		}
	}
	// A system prompt that is nothing but the header is no system prompt.
	none := key(t, Messages, `{`+msgs+`}`)
	for _, body := range []string{
		`{"system":[` + billing("a") + `],` + msgs + `}`,
		`{"system":"x-anthropic-billing-header: cch=a;",` + msgs + `}`,
	} {
		if got := key(t, Messages, body); got != none {
			t.Errorf("%s: key %q, want %q", body, got, none)
		}
	}
	// Only system text is ignored, and only at its start.
	for _, body := range []string{
		`{"system":"note: x-anthropic-billing-header",` + msgs + `}`,
		`{"messages":[{"role":"user","content":"x-anthropic-billing-header: cch=1;"}]}`,
	} {
		if got := key(t, Messages, body); !strings.Contains(got, "x-anthropic-billing-header") {
			t.Errorf("%s: key %q lost non-system text", body, got)
		}
	}
	// With no prefixes configured the block is kept.
	if got := keyWith(t, Messages, Options{}, `{"system":[`+billing("a")+`,`+sys+`],`+msgs+`}`); !strings.Contains(got, "cch=a") {
		t.Errorf("no prefixes configured, key %q lost the block", got)
	}
}

// Chat system and developer messages (string content, text parts, bare
// string parts) follow the same rule; a message left empty leaves no record.
func TestIgnoredSystemMessagesInChat(t *testing.T) {
	const user = `{"role":"user","content":"hi"}`
	want := key(t, ChatCompletions, `{"messages":[{"role":"system","content":"Be brief."},`+user+`]}`)
	for _, body := range []string{
		`{"messages":[{"role":"system","content":"x-anthropic-billing-header: cch=1;"},{"role":"system","content":"Be brief."},` + user + `]}`,
		`{"messages":[{"role":"developer","content":"x-anthropic-billing-header: cch=2;"},{"role":"system","content":"Be brief."},` + user + `]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: cch=3;"},{"type":"text","text":"Be brief."}]},` + user + `]}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: cch=4;"}]},{"role":"system","content":"Be brief."},` + user + `]}`,
	} {
		if got := key(t, ChatCompletions, body); got != want {
			t.Errorf("%s:\nkey  %q\nwant %q", body, got, want)
		}
	}
	loose := key(t, ChatCompletions, `{"messages":[{"role":"system","content":["x-anthropic-billing-header: cch=5;","Be brief."]},`+user+`]}`)
	if loose != want {
		t.Errorf("bare string parts: key %q, want %q", loose, want)
	}
	// A user turn is never dropped.
	if got := key(t, ChatCompletions, `{"messages":[{"role":"user","content":"x-anthropic-billing-header: cch=1;"}]}`); !strings.Contains(got, "cch=1") {
		t.Errorf("user message dropped: %q", got)
	}
}

func TestCustomIgnorePrefix(t *testing.T) {
	o := Options{IgnoreSystemPrefixes: []string{"Current time:", "Ünïcode\x01"}}
	base := `"messages":[{"role":"user","content":"hi"}]`
	a := keyWith(t, Messages, o, `{"system":[{"type":"text","text":"Current time: 10:01"},{"type":"text","text":"Rules."}],`+base+`}`)
	b := keyWith(t, Messages, o, `{"system":[{"type":"text","text":"Current time: 10:02"},{"type":"text","text":"Rules."}],`+base+`}`)
	if a != b || strings.Contains(a, "Current time") {
		t.Errorf("custom prefix not ignored: %q vs %q", a, b)
	}
	// Prefixes are compared on decoded text, control bytes included.
	c := keyWith(t, ChatCompletions, o, `{"messages":[{"role":"system","content":"\u00dcn\u00efcode\u0001 v=1"},{"role":"system","content":"Rules."},`+base[len(`"messages":[`):]+`}`)
	if strings.Contains(c, "code") {
		t.Errorf("escaped custom prefix not ignored: %q", c)
	}
	// The default prefix is not ignored once the list is replaced.
	if d := keyWith(t, Messages, o, `{"system":"x-anthropic-billing-header: cch=1;",`+base+`}`); !strings.Contains(d, "cch=1") {
		t.Errorf("default prefix still ignored with a custom list: %q", d)
	}
}

// The prefix check reads only the start of a long literal, and an escape
// cut by that bound does not confuse it.
func TestIgnorePrefixLongEscapedText(t *testing.T) {
	long := strings.Repeat(`\u0041\n`, 5000)
	o := Options{IgnoreSystemPrefixes: []string{"A\nA\nA\n"}}
	if got := keyWith(t, Messages, o, `{"system":"`+long+`","messages":[{"role":"user","content":"hi"}]}`); strings.Contains(got, "system") {
		t.Errorf("not ignored: %q...", got[:min(len(got), 40)])
	}
	o = Options{IgnoreSystemPrefixes: []string{"A\nA\nA\nB"}}
	if got := keyWith(t, Messages, o, `{"system":"`+long+`","messages":[{"role":"user","content":"hi"}]}`); !strings.HasPrefix(got, "system") {
		t.Errorf("wrongly ignored: %q...", got[:min(len(got), 40)])
	}
}

func TestCacheSalt(t *testing.T) {
	for e, body := range map[Endpoint]string{
		ChatCompletions: `{"cache_salt":"s1","messages":[{"role":"user","content":"hi"}]}`,
		Completions:     `{"cache_salt":"s1","prompt":"hi"}`,
		Messages:        `{"cache_salt":"s1","messages":[{"role":"user","content":"hi"}]}`,
		Responses:       `{"cache_salt":"s1","input":"hi"}`,
	} {
		if r := mustExtract(t, e, body); r.CacheSalt != "s1" {
			t.Errorf("%s: cache salt %q", e, r.CacheSalt)
		}
		if _, err := Extract(e, []byte(strings.Replace(body, `"s1"`, `1`, 1))); err == nil {
			t.Errorf("%s: a number accepted as cache_salt", e)
		}
		if _, err := Extract(e, []byte(strings.Replace(body, `"cache_salt"`, `"Cache_Salt"`, 1))); err == nil {
			t.Errorf("%s: a case variant of cache_salt accepted", e)
		}
	}
}
