package proxy

import (
	"bytes"
	"net/http"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// Decoding a request materialises every array item it reaches as a Go
// value: an empty message `{},` is 3 bytes of JSON but a struct of over
// 100 bytes, plus the slice growth. A 30 MiB body of empty messages took
// half a gigabyte. countItems bounds that before anything is decoded, with
// one pass over the bytes that allocates nothing but a small stack.

// maxScanDepth matches encoding/json's nesting limit: deeper input is
// rejected by the decoder anyway, so the count stops judging there.
const maxScanDepth = 10000

// itemFrame is one open array or object.
type itemFrame struct {
	array bool
	// prompt is set inside the top-level "prompt" value, where arrays of
	// numbers are token ids: extract reads them straight from the bytes,
	// so they cost nothing and a long tokenised prompt must not count.
	prompt bool
	nums   int  // numbers in this prompt array, counted only if it is mixed
	mixed  bool // this prompt array also holds non-numbers
}

// checkItems refuses a body with more than limit array items (limit <= 0:
// no bound). Every element of every array counts, whatever its depth:
// messages, content parts, tool calls, nested tool results, prompts.
// Token ids of the completions prompt are the one exception.
func checkItems(body []byte, limit int) error {
	if limit <= 0 || countItems(body, limit) <= limit {
		return nil
	}
	return apierr.New(http.StatusBadRequest, apierr.TypeInvalidRequest, "too_many_items",
		"request has more than %d messages, content parts or other array items (proxy.max_messages)", limit)
}

// countItems counts array items in the JSON body, stopping as soon as the
// count passes stop. It never fails: input that is not valid JSON yields
// some count, and the decoder that runs next reports the real problem.
func countItems(b []byte, stop int) int {
	var stack []itemFrame
	n := 0
	expectKey := false  // the next string in an object is a key
	promptNext := false // the value being read is the top-level "prompt"
	item := func(isNum bool) {
		if len(stack) == 0 || !stack[len(stack)-1].array {
			return
		}
		f := &stack[len(stack)-1]
		switch {
		case !f.prompt:
			n++
		case isNum:
			f.nums++
		default:
			f.mixed = true
			n++
		}
	}
	for i := 0; i < len(b) && n <= stop; {
		switch c := b[i]; c {
		case ' ', '\t', '\n', '\r', ':':
			i++
		case ',':
			expectKey = len(stack) > 0 && !stack[len(stack)-1].array
			i++
		case '{', '[':
			item(false)
			if len(stack) >= maxScanDepth {
				return n
			}
			prompt := len(stack) > 0 && stack[len(stack)-1].prompt
			if len(stack) == 1 && promptNext {
				prompt = true
			}
			stack = append(stack, itemFrame{array: c == '[', prompt: prompt})
			expectKey = c == '{'
			i++
		case '}', ']':
			if len(stack) == 0 {
				return n
			}
			if f := stack[len(stack)-1]; f.mixed {
				// Not token ids: extract splits such an array into one
				// value per element, numbers included.
				n += f.nums
			}
			stack = stack[:len(stack)-1]
			expectKey = false
			i++
		case '"':
			end := stringEnd(b, i)
			if end < 0 {
				return n
			}
			if expectKey {
				if len(stack) == 1 {
					promptNext = string(b[i+1:end]) == "prompt"
				}
				expectKey = false
			} else {
				item(false)
			}
			i = end + 1
		default:
			j := i
			for j < len(b) && !isDelim(b[j]) {
				j++
			}
			item(c == '-' || (c >= '0' && c <= '9'))
			i = max(j, i+1)
		}
	}
	return n
}

// stringEnd returns the index of the quote closing the JSON string that
// starts at b[start], or -1 if it is not closed.
func stringEnd(b []byte, start int) int {
	for j := start + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		bs := 0
		for q-1-bs > start && b[q-1-bs] == '\\' {
			bs++
		}
		if bs%2 == 0 {
			return q
		}
		j = q + 1
	}
}

func isDelim(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r', ':', '"', '{', '[':
		return true
	}
	return false
}
