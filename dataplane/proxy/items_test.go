package proxy

import (
	"encoding/json"
	"strings"
	"testing"
)

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
		_ = countItems([]byte(s), 1<<20)
		if json.Valid([]byte(s)) && !strings.Contains(s, `"prompt"`) {
			// Without the prompt exemption every array element counts:
			// check against encoding/json's tokenizer.
			if got, want := countItems([]byte(s), 1<<20), countTokens(t, s); got != want {
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
