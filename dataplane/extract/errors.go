package extract

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// Error codes, named after the ones OpenAI uses so clients recognise them.
const (
	codeInvalidJSON  = "invalid_json"
	codeInvalidType  = "invalid_type"
	codeMissingParam = "missing_required_parameter"
	codeInvalidValue = "invalid_value"
)

// path names a field of the request for error messages. It is a chain of
// stack values rather than a string so that the hot path, which never
// fails, never pays for formatting.
type path struct {
	up   *path
	name string // object key; "" marks an array element
	idx  int
}

func (p *path) field(name string) path { return path{up: p, name: name} }
func (p *path) index(i int) path       { return path{up: p, idx: i} }

func (p *path) String() string {
	return string(p.appendTo(nil))
}

// appendTo is recursive rather than collecting the chain in a slice, which
// would make every path escape to the heap.
func (p *path) appendTo(b []byte) []byte {
	if p == nil {
		return b
	}
	b = p.up.appendTo(b)
	if p.name == "" {
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(p.idx), 10)
		return append(b, ']')
	}
	if len(b) > 0 {
		b = append(b, '.')
	}
	return append(b, p.name...)
}

// joinPath appends rel, a path relative to base as produced by pathAt.
func joinPath(base, rel string) string {
	switch {
	case base == "":
		return rel
	case rel == "":
		return base
	case rel[0] == '[':
		return base + rel
	}
	return base + "." + rel
}

func errMissing(p *path) error {
	s := p.String()
	return apierr.BadRequest(codeMissingParam, s, "Missing required parameter: '%s'.", s)
}

func errType(p *path, want string, raw []byte) error {
	return errTypeAt(p.String(), want, describe(firstByte(raw)))
}

func errTypeAt(param, want, got string) error {
	return apierr.BadRequest(codeInvalidType, param, "Invalid type for '%s': expected %s, but got %s instead.", param, want, got)
}

func errValue(p *path, format string, args ...any) error {
	s := p.String()
	return apierr.BadRequest(codeInvalidValue, s, "Invalid value for '%s': "+format, append([]any{s}, args...)...)
}

// decodeError turns an encoding/json error for data, the value found at
// base, into a client error. Type errors are located by byte offset rather
// than by UnmarshalTypeError.Field, because Field omits array indices and
// "messages.content" does not tell a client which of 200 messages is wrong.
func decodeError(err error, data []byte, base *path) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return apierr.BadRequest(codeInvalidJSON, "", "The request body is not valid JSON: %s (at byte %d).", se.Error(), se.Offset)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		rel, ok := pathAt(data, te.Offset, valueKind(te.Value), typeErrorAtStart)
		if !ok {
			rel = te.Field
		}
		return errTypeAt(joinPath(base.String(), rel), describeGoType(te.Type), describeValue(te.Value))
	}
	s := base.String()
	return apierr.BadRequest(codeInvalidJSON, s, "Could not parse the request body: %s.", err.Error())
}

// typeErrorAtStart records where this build's encoding/json puts a type
// error's offset: at the start of the offending value (the v2-backed
// implementation) or at the end of its first token (v1: after a scalar, or
// just after a '{' or '['). In "[[" the end of one token is the start of
// the next, so the offset alone cannot say which value is meant.
var typeErrorAtStart = func() bool {
	var v []string
	var te *json.UnmarshalTypeError
	if errors.As(json.Unmarshal([]byte(`[1]`), &v), &te) {
		return te.Offset == 1
	}
	return false
}()

// pathAt returns the path, relative to data, of the value of the given kind
// (as firstByte reports it; 0 for any) that a type error at byte offset off
// points at, as described for typeErrorAtStart. data must be valid JSON.
func pathAt(data []byte, off int64, kind byte, atStart bool) (string, bool) {
	type frame struct {
		array   bool
		idx     int
		key     string
		wantKey bool
	}
	var stack []frame
	// valueDone lets an enclosing object expect its next key.
	valueDone := func() {
		if n := len(stack); n > 0 && !stack[n-1].array {
			stack[n-1].wantKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // a number that does not fit a float64 must not stop the walk
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		end := dec.InputOffset()
		delim, isDelim := tok.(json.Delim)
		if isDelim && (delim == '}' || delim == ']') {
			if len(stack) == 0 {
				return "", false
			}
			stack = stack[:len(stack)-1]
			valueDone()
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			key, _ := tok.(string)
			stack[n-1].key = key
			stack[n-1].wantKey = false
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].array {
			stack[n-1].idx++
		}
		// start is where the previous token ended; the value itself starts
		// after the separators.
		for start < end && isSeparator(data[start]) {
			start++
		}
		at := end
		if atStart {
			at = start
		}
		if at == off && (kind == 0 || kind == tokenKind(tok)) {
			var sb strings.Builder
			for _, f := range stack {
				if f.array {
					sb.WriteByte('[')
					sb.WriteString(strconv.Itoa(f.idx))
					sb.WriteByte(']')
					continue
				}
				if sb.Len() > 0 {
					sb.WriteByte('.')
				}
				sb.WriteString(f.key)
			}
			return sb.String(), true
		}
		switch {
		case isDelim && delim == '{':
			stack = append(stack, frame{wantKey: true})
		case isDelim && delim == '[':
			stack = append(stack, frame{array: true, idx: -1})
		default:
			valueDone()
		}
	}
}

func isSeparator(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', ',', ':':
		return true
	}
	return false
}

// valueKind maps an UnmarshalTypeError.Value to the kind of JSON value it
// names, in the terms of firstByte, or 0 if it is not recognised.
func valueKind(v string) byte {
	kind, _, _ := strings.Cut(v, " ")
	switch kind {
	case "string":
		return '"'
	case "number":
		return '0'
	case "bool", "boolean":
		return 't'
	case "array":
		return '['
	case "object":
		return '{'
	case "null":
		return 'n'
	}
	return 0
}

// tokenKind is valueKind for a json.Decoder token that starts a value.
func tokenKind(tok json.Token) byte {
	switch v := tok.(type) {
	case json.Delim:
		return byte(v)
	case string:
		return '"'
	case json.Number:
		return '0'
	case bool:
		return 't'
	case nil:
		return 'n'
	}
	return 0
}

// firstByte returns the first byte of a JSON value, skipping whitespace, or
// 0 for an empty one; it is enough to tell the value's kind.
func firstByte(raw []byte) byte {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		}
		return c
	}
	return 0
}

// isNull reports whether a field was absent or null; the APIs treat both
// the same way.
func isNull(raw []byte) bool {
	c := firstByte(raw)
	return c == 0 || c == 'n'
}

// describe names the kind of the JSON value starting with c.
func describe(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case 0:
		return "nothing"
	}
	return "a number"
}

// describeValue names the JSON kind in an UnmarshalTypeError.Value.
func describeValue(v string) string {
	if k := valueKind(v); k != 0 {
		return describe(k)
	}
	return "a value of the wrong type"
}

// describeGoType names the JSON kind a Go destination type expects.
func describeGoType(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "a different type"
}
