package extract

import (
	"bytes"
	"errors"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

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

// decodeError turns a decode error for data, the value found at base,
// into a client error. A type error names the field by the JSON Pointer
// the decoder reports, with array indices, since "messages.content" does
// not tell a client which of 200 messages is wrong.
func decodeError(err error, data []byte, base *path) error {
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		return apierr.BadRequest(codeInvalidJSON, "", "The request body is not valid JSON: %s (at byte %d).", se.Err, se.ByteOffset)
	}
	var te *json.SemanticError
	if errors.As(err, &te) && te.JSONKind != 0 {
		rel, ok := pointerPath(data, te.JSONPointer)
		if !ok {
			rel = strings.TrimPrefix(string(te.JSONPointer), "/")
		}
		return errTypeAt(joinPath(base.String(), rel), describeGoType(te.GoType), describe(byte(te.JSONKind)))
	}
	s := base.String()
	return apierr.BadRequest(codeInvalidJSON, s, "Could not parse the request body: %s.", err.Error())
}

// objectPath names the object whose '{' is at byte off of data, reading
// data up to it.
func objectPath(data []byte, off int64) (string, bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(data), decodeOpts)
	for dec.InputOffset() <= off {
		tok, err := dec.ReadToken()
		if err != nil {
			return "", false
		}
		if tok.Kind() == '{' && dec.InputOffset()-1 == off {
			return pointerPath(data, dec.StackPointer())
		}
	}
	return "", false
}

// pointerPath names the value ptr points at in data as the APIs name
// fields (messages[0].content): a pointer does not say whether "0" is an
// index or a key, so ptr is followed through data, in one pass that skips
// what is not on the way.
func pointerPath(data []byte, ptr jsontext.Pointer) (string, bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(data), decodeOpts)
	var b []byte
	for tok := range ptr.Tokens() {
		switch dec.PeekKind() {
		case '[':
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 {
				return "", false
			}
			if _, err := dec.ReadToken(); err != nil {
				return "", false
			}
			for range i {
				if dec.SkipValue() != nil {
					return "", false
				}
			}
			b = append(b, '[')
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, ']')
		case '{':
			if _, err := dec.ReadToken(); err != nil {
				return "", false
			}
			for {
				if dec.PeekKind() == '}' {
					return "", false
				}
				name, err := dec.ReadToken()
				if err != nil {
					return "", false
				}
				if name.String() == tok {
					break
				}
				if dec.SkipValue() != nil {
					return "", false
				}
			}
			if len(b) > 0 {
				b = append(b, '.')
			}
			b = append(b, tok...)
		default:
			return "", false
		}
	}
	return string(b), true
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
