package extract

import (
	"encoding/json"
)

// A hand decoder for the chat completions and completions request types.
//
// json.Unmarshal into chatRequest was most of the key extraction's cost on
// the proxy's hot path: reflection per field, a copy of every
// json.RawMessage, and a validation pass before the decoding pass. The
// decoder below fills the same structs in one pass and leaves the
// RawMessages pointing into the body, for the builder to read as it does
// what json.Unmarshal produced.
//
// It is exact or it gives up: it validates the whole body against JSON's
// grammar, and it returns false (the caller then runs json.Unmarshal,
// which also produces the error a bad body deserves) on anything whose
// decoding it does not reproduce byte for byte: a key spelled with escapes
// or non-ASCII, a key matching a decoded field only up to case (which
// encoding/json would take, and the walker refuses), a repeated decoded
// field (encoding/json merges objects), a value of the wrong type, or
// nesting deeper than fastMaxDepth. Typed strings that hold escapes or
// non-ASCII bytes are decoded by encoding/json itself, since it rewrites
// invalid UTF-8; tool calls and function calls are handed to it too, being
// rare enough not to matter and rich in shapes. FuzzFastDecode checks the
// result against json.Unmarshal for every input.

// fastMaxDepth bounds the nesting the hand decoder follows; deeper bodies
// are left to encoding/json (and its limit).
const fastMaxDepth = 256

type fastDecoder struct {
	data []byte
	pos  int
}

// fastChat decodes body into req, reporting false when it cannot do so
// exactly as json.Unmarshal would; req is then in an unspecified state.
func fastChat(body []byte, req *chatRequest) bool {
	d := fastDecoder{data: body}
	var seen uint8
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "messages":
			if !once(&seen, 1<<0) {
				return false
			}
			return d.messages(&req.Messages)
		}
		return d.openAIField(key, &req.openAIFields, &seen, chatFieldNames)
	})
	return ok && d.end()
}

// fastCompletions is fastChat for completions.
func fastCompletions(body []byte, req *completionRequest) bool {
	d := fastDecoder{data: body}
	var seen uint8
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "prompt":
			return once(&seen, 1<<0) && d.raw(&req.Prompt)
		case "prompt_embeds":
			return once(&seen, 1<<1) && d.raw(&req.PromptEmbeds)
		}
		return d.openAIField(key, &req.openAIFields, &seen, completionFieldNames)
	})
	return ok && d.end()
}

// The field names encoding/json matches at each decoded level, for the
// case check on keys that are not exactly one of them.
var (
	chatFieldNames       = []string{"model", "stream", "stream_options", "user", "prompt_cache_key", "cache_salt", "messages"}
	completionFieldNames = []string{"model", "stream", "stream_options", "user", "prompt_cache_key", "cache_salt", "prompt", "prompt_embeds"}
	messageFieldNames    = []string{"role", "name", "tool_call_id", "content", "tool_calls", "function_call"}
	streamOptionNames    = []string{"include_usage"}
)

// once marks bit in seen, reporting false when it was already set: a
// repeated field is left to encoding/json.
func once(seen *uint8, bit uint8) bool {
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// openAIField decodes one member of the top-level object, the value
// starting at d.pos; any key not in openAIFields is skipped, unless
// encoding/json would match it to one of names.
func (d *fastDecoder) openAIField(key []byte, f *openAIFields, seen *uint8, names []string) bool {
	switch string(key) {
	case "model":
		return once(seen, 1<<2) && d.str(&f.Model)
	case "stream":
		return once(seen, 1<<3) && d.boolean(&f.Stream)
	case "stream_options":
		return once(seen, 1<<4) && d.streamOptions(&f.StreamOptions)
	case "user":
		return once(seen, 1<<5) && d.str(&f.User)
	case "prompt_cache_key":
		return once(seen, 1<<6) && d.str(&f.PromptCacheKey)
	case "cache_salt":
		return once(seen, 1<<7) && d.str(&f.CacheSalt)
	}
	return d.other(key, names)
}

// other skips the value of a key the decoded type has no field for.
func (d *fastDecoder) other(key []byte, names []string) bool {
	for _, n := range names {
		if asciiEqualFold(key, n) {
			return false
		}
	}
	return d.skip(0)
}

func (d *fastDecoder) streamOptions(dst **streamOptions) bool {
	if d.null() {
		*dst = nil
		return true
	}
	if d.peek() != '{' {
		return false
	}
	// A repeated stream_options is refused by once, so the struct is new.
	so := new(streamOptions)
	*dst = so
	var seen uint8
	return d.object(func(key []byte) bool {
		if string(key) == "include_usage" {
			return once(&seen, 1) && d.boolean(&so.IncludeUsage)
		}
		return d.other(key, streamOptionNames)
	})
}

func (d *fastDecoder) messages(dst *[]chatMessage) bool {
	if d.null() {
		*dst = nil
		return true
	}
	// encoding/json gives an empty array a non-nil, empty slice.
	msgs := make([]chatMessage, 0, 4)
	ok := d.elements(func() bool {
		if d.peek() != '{' {
			// A null element would decode to an empty message, and
			// anything else is a type error: neither is worth a fast path.
			return false
		}
		msgs = append(msgs, chatMessage{})
		return d.message(&msgs[len(msgs)-1])
	})
	*dst = msgs
	return ok
}

func (d *fastDecoder) message(m *chatMessage) bool {
	var seen uint8
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "role":
			return once(&seen, 1<<0) && d.raw(&m.Role)
		case "name":
			return once(&seen, 1<<1) && d.str(&m.Name)
		case "tool_call_id":
			return once(&seen, 1<<2) && d.str(&m.ToolCallID)
		case "content":
			return once(&seen, 1<<3) && d.raw(&m.Content)
		case "tool_calls":
			return once(&seen, 1<<4) && d.viaJSON(&m.ToolCalls)
		case "function_call":
			return once(&seen, 1<<5) && d.viaJSON(&m.FunctionCall)
		}
		return d.other(key, messageFieldNames)
	})
}

// object walks the object at d.pos, calling member for each key with d.pos
// at the member's value; member must consume the value.
func (d *fastDecoder) object(member func(key []byte) bool) bool {
	return d.members(member, false)
}

// members is object; anyKey lets keys with escapes or non-ASCII through,
// for objects whose keys are not matched against fields.
func (d *fastDecoder) members(member func(key []byte) bool, anyKey bool) bool {
	d.space()
	if d.peek() != '{' {
		return false
	}
	d.pos++
	d.space()
	if d.peek() == '}' {
		d.pos++
		return true
	}
	for {
		d.space()
		lit, plain, ok := d.literal()
		if !ok || !plain && !anyKey {
			// A key with escapes or non-ASCII bytes could match a field
			// by encoding/json's folding rules; not worth reproducing.
			return false
		}
		d.space()
		if d.peek() != ':' {
			return false
		}
		d.pos++
		d.space()
		if !member(lit[1 : len(lit)-1]) {
			return false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return true
		default:
			return false
		}
	}
}

// elements walks the array at d.pos, calling elem with d.pos at each
// element; elem must consume it.
func (d *fastDecoder) elements(elem func() bool) bool {
	d.space()
	if d.peek() != '[' {
		return false
	}
	d.pos++
	d.space()
	if d.peek() == ']' {
		d.pos++
		return true
	}
	for {
		d.space()
		if !elem() {
			return false
		}
		d.space()
		switch d.peek() {
		case ',':
			d.pos++
		case ']':
			d.pos++
			return true
		default:
			return false
		}
	}
}

// raw stores the value at d.pos as json.RawMessage does: its exact bytes,
// null included. It points into the body rather than copying, which the
// builder allows since it never keeps or modifies them.
func (d *fastDecoder) raw(dst *json.RawMessage) bool {
	start := d.pos
	if !d.skip(0) {
		return false
	}
	*dst = d.data[start:d.pos:d.pos]
	return true
}

// str decodes a string field; null leaves it unchanged, as encoding/json
// does.
func (d *fastDecoder) str(dst *string) bool {
	if d.null() {
		return true
	}
	lit, plain, ok := d.literal()
	if !ok {
		return false
	}
	if plain {
		*dst = string(lit[1 : len(lit)-1])
		return true
	}
	return json.Unmarshal(lit, dst) == nil
}

// boolean decodes a bool field; null leaves it unchanged.
func (d *fastDecoder) boolean(dst *bool) bool {
	switch {
	case d.word("true"):
		*dst = true
	case d.word("false"):
		*dst = false
	case d.word("null"):
	default:
		return false
	}
	return true
}

// viaJSON decodes the value at d.pos with encoding/json, after checking its
// syntax: a field's value decodes the same alone as inside the body.
func (d *fastDecoder) viaJSON(dst any) bool {
	start := d.pos
	if !d.skip(0) {
		return false
	}
	return json.Unmarshal(d.data[start:d.pos], dst) == nil
}

func (d *fastDecoder) null() bool { return d.word("null") }

// word consumes the literal w when it is next.
func (d *fastDecoder) word(w string) bool {
	if len(d.data)-d.pos >= len(w) && string(d.data[d.pos:d.pos+len(w)]) == w {
		d.pos += len(w)
		return true
	}
	return false
}

func (d *fastDecoder) peek() byte {
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

func (d *fastDecoder) space() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// end checks that only whitespace follows the top-level value.
func (d *fastDecoder) end() bool {
	d.space()
	return d.pos == len(d.data)
}

// literal consumes the string literal at d.pos, checking it as JSON does
// (no raw control bytes, valid escapes), and returns it with its quotes.
// plain reports that it holds neither escapes nor non-ASCII bytes, so that
// its inside is its decoded text.
func (d *fastDecoder) literal() (lit []byte, plain, ok bool) {
	if d.peek() != '"' {
		return nil, false, false
	}
	start := d.pos
	plain = true
	i := d.pos + 1
	for i < len(d.data) {
		// Prompt text is long runs of ordinary bytes: skip them with one
		// table lookup each.
		for i < len(d.data) && !litSpecial[d.data[i]] {
			i++
		}
		if i >= len(d.data) {
			break
		}
		c := d.data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			return d.data[start:d.pos], plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(d.data) {
				return nil, false, false
			}
			switch d.data[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := hex4(d.data[i+2:]); !ok {
					return nil, false, false
				}
				i += 6
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		case c >= 0x80:
			plain = false
			i++
		default:
			i++
		}
	}
	return nil, false, false
}

// litSpecial marks the bytes literal must look at: the closing quote,
// escapes, control bytes (invalid in JSON strings) and non-ASCII.
var litSpecial = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '"' || c == '\\' || c < 0x20 || c >= 0x80
	}
	return t
}()

// skip consumes any JSON value, checking its syntax.
func (d *fastDecoder) skip(depth int) bool {
	d.space()
	switch c := d.peek(); {
	case c == '"':
		_, _, ok := d.literal()
		return ok
	case c == '{':
		if depth >= fastMaxDepth {
			return false
		}
		return d.members(func([]byte) bool { return d.skip(depth + 1) }, true)
	case c == '[':
		if depth >= fastMaxDepth {
			return false
		}
		return d.elements(func() bool { return d.skip(depth + 1) })
	case c == 't':
		return d.word("true")
	case c == 'f':
		return d.word("false")
	case c == 'n':
		return d.word("null")
	case c == '-' || '0' <= c && c <= '9':
		return d.number()
	}
	return false
}

// number consumes a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (d *fastDecoder) number() bool {
	if d.peek() == '-' {
		d.pos++
	}
	switch c := d.peek(); {
	case c == '0':
		d.pos++
	case '1' <= c && c <= '9':
		d.digits()
	default:
		return false
	}
	if d.peek() == '.' {
		d.pos++
		if !d.digits() {
			return false
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.pos++
		if c := d.peek(); c == '+' || c == '-' {
			d.pos++
		}
		if !d.digits() {
			return false
		}
	}
	return true
}

// digits consumes one or more decimal digits.
func (d *fastDecoder) digits() bool {
	start := d.pos
	for d.pos < len(d.data) && '0' <= d.data[d.pos] && d.data[d.pos] <= '9' {
		d.pos++
	}
	return d.pos > start
}

// asciiEqualFold is encoding/json's case-insensitive key match restricted
// to ASCII keys (object only hands over keys without non-ASCII bytes).
func asciiEqualFold(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range len(key) {
		a, b := key[i], name[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}
