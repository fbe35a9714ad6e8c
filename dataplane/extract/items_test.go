package extract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// countItems walks body as the routed endpoints' scan does, without a
// request type's field checks, and returns the array items it counted,
// stopping once the count passes stop.
func countItems(body []byte, stop int) int {
	n, _ := walkItems(body, stop)
	return n
}

// walkItems is countItems with the walk's refusal, if any.
func walkItems(body []byte, stop int) (int, error) {
	w := newWalker(body)
	defer w.release()
	w.maxItems = stop
	w.value(nil, modeScan, 0)
	return w.items, w.err
}

func TestCountItems(t *testing.T) {
	tests := []struct {
		name string
		body string
		want int
	}{
		{"no arrays", `{"model":"m","messages":{"a":1}}`, 0},
		{"messages", `{"messages":[{"role":"user"},{},{}]}`, 3},
		{"messages and parts", `{"messages":[{"content":[{"type":"text"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, 3},
		{"literals and numbers are items", `{"messages":[null,1,true,"s",-2.5e3]}`, 5},
		{"nested tool results", `{"messages":[{"content":[{"content":[{"type":"text"}]}]}]}`, 3},
		{"brackets and quotes inside strings", `{"messages":[{"content":"[1,2,{\"a\":[3]}] \\"},"x\"]"]}`, 2},
		{"keys are not items", `{"messages":[{"[":"]","{":"}"}]}`, 1},
		{"token ids do not count", `{"prompt":[1,2,3,4,5,6]}`, 0},
		{"batches of token ids count per prompt", `{"prompt":[[1,2,3],[4,5,6]]}`, 2},
		{"strings in a prompt count", `{"prompt":["a","b"]}`, 2},
		{"numbers of a mixed prompt count", `{"prompt":["a",1,2,3]}`, 4},
		{"only the top-level prompt is exempt", `{"messages":[{"prompt":[1,2,3]}]}`, 4},
		{"a case variant is not exempt", `{"Prompt":[1,2,3]}`, 3},
		{"whitespace", " {\n \"messages\" : [ { } ,\t{ } ] } ", 2},
		{"empty arrays", `{"messages":[],"tools":[[]]}`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !json.Valid([]byte(tt.body)) {
				t.Fatalf("test body is not JSON: %s", tt.body)
			}
			if got := countItems([]byte(tt.body), 1<<30); got != tt.want {
				t.Fatalf("countItems(%s) = %d, want %d", tt.body, got, tt.want)
			}
		})
	}
}

// The count stops soon after passing the limit instead of walking a huge
// body to its end.
func TestCountItemsStopsAtLimit(t *testing.T) {
	body := `{"messages":[` + strings.Repeat(`{},`, 1<<20) + `{}]}`
	if got := countItems([]byte(body), 10); got != 11 {
		t.Fatalf("count %d, want to stop at 11", got)
	}
}

// Malformed input never panics or loops: it gets some count, and the
// decoder reports the real problem.
func FuzzCountItems(f *testing.F) {
	for _, s := range []string{`{"messages":[{}]}`, `]]]`, `"\`, `{"prompt":[1,"`, `[[[[`, `{"a":tru`, `\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := walkItems([]byte(s), 1<<20)
		// A refused key (repeated, or differing only in case) stops the
		// walk and the body with it: no count to compare.
		if err == nil && json.Valid([]byte(s)) && !strings.Contains(s, `"prompt"`) {
			// Without the prompt exemption every array element counts:
			// check against encoding/json's tokenizer.
			if want := countTokens(t, s); got != want {
				t.Fatalf("countItems(%q) = %d, tokenizer count %d", s, got, want)
			}
		}
	})
}

// countTokens counts array elements with encoding/json's tokenizer, an
// independent implementation of the same rule.
func countTokens(t *testing.T, s string) int {
	type frame struct{ array, key bool }
	var stack []frame
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	n := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return n
		}
		if len(stack) > 0 {
			f := &stack[len(stack)-1]
			switch {
			case f.array:
				if d, ok := tok.(json.Delim); !ok || d == '[' || d == '{' {
					n++
				}
			case tok != json.Delim('}'):
				f.key = !f.key
			}
		}
		switch tok {
		case json.Delim('['):
			stack = append(stack, frame{array: true})
		case json.Delim('{'):
			stack = append(stack, frame{})
		case json.Delim(']'), json.Delim('}'):
			stack = stack[:len(stack)-1]
		}
	}
}

// The count runs in the walk before decoding, for every routed endpoint,
// and its refusal comes before any other: it bounds what the rest costs.
func TestExtractRefusesTooManyItems(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"hi"},`, 11), ",")
	cases := []struct {
		name string
		e    Endpoint
		body string
		max  int
		code string // "" = accepted
	}{
		{"over the cap", ChatCompletions, `{"model":"m","messages":[` + many + `]}`, 10, "too_many_items"},
		{"at the cap", ChatCompletions, `{"model":"m","messages":[` + many + `]}`, 11, ""},
		{"no cap", ChatCompletions, `{"model":"m","messages":[` + many + `]}`, 0, ""},
		{"not an object, over the cap", ChatCompletions, `[` + many + `]`, 10, "too_many_items"},
		{"not an object, under the cap", ChatCompletions, `[` + many + `]`, 100, codeInvalidJSON},
		{"token ids are free", Completions, `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12]}`, 10, ""},
		{"mixed prompt counts its numbers", Completions, `{"model":"m","prompt":["a",1,2,3,4,5,6,7,8,9,10]}`, 10, "too_many_items"},
		{"parts count", Messages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` + strings.TrimSuffix(strings.Repeat(`{"type":"text","text":"x"},`, 11), ",") + `]}]}`, 11, "too_many_items"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ExtractOptions(tc.e, []byte(tc.body), Options{MaxItems: tc.max})
			var ae *apierr.Error
			switch {
			case tc.code == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.code == "":
			case !errors.As(err, &ae) || ae.Code != tc.code:
				t.Fatalf("error %v, want code %s", err, tc.code)
			}
		})
	}
}
