package extract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// Structure bytes of the key format; see the package documentation.
const (
	sepMarker = 0x00
	sepOpen   = 0x02
	sepClose  = 0x03
	sepEscape = 0x1b
	sepField  = 0x1d
	sepRecord = 0x1e
	sepItem   = 0x1f
)

// reserved reports whether content byte c must be escaped: every C0 control
// except the whitespace that real prompts are full of. Reserving more than
// the bytes in use today keeps room for new structure without changing how
// existing content is encoded.
func reserved(c byte) bool {
	return c < 0x20 && c != '\t' && c != '\n' && c != '\r'
}

// builder accumulates the key text and what is learnt while building it.
type builder struct {
	key     []byte
	start   int       // len(key) before this request's key
	scratch []byte    // decoded string literals that are not appended to key
	tag     []byte    // hash field framing
	h       hash.Hash // created on first media item
	sum     [32]byte  // digest output, kept here so Sum does not allocate
	sorted  []string  // reused by canonicalHash
	ignore  []string  // Options.IgnoreSystemPrefixes
	sysMsg  bool      // in the content of a chat message IgnoreSystemPrefixes apply to
	dropped int       // blocks of the current message left out
}

// appendEscaped appends content (bytes, or a Go string that a typed field
// such as a name or id decoded into), escaping reserved bytes.
func appendEscaped[S ~string | ~[]byte](dst []byte, s S) []byte {
	for len(s) > 0 {
		i := 0
		for i < len(s) && !reserved(s[i]) {
			i++
		}
		dst = append(dst, s[:i]...)
		if i == len(s) {
			break
		}
		dst = append(dst, sepEscape, s[i]+0x40)
		s = s[i+1:]
	}
	return dst
}

// appendLiteral appends the escaped content of the JSON string literal lit,
// decoding JSON escapes on the way. Decoding here, rather than letting
// the decoder produce a Go string, saves an allocation and a copy per
// text, which is most of the body.
//
// lit must come from the decoder, which has validated it: JSON forbids
// raw control bytes in strings, so only escapes can produce reserved bytes
// and the runs between escapes are copied without looking at them.
// Malformed input still never causes a panic.
func appendLiteral(dst, lit []byte) []byte {
	if len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return appendEscaped(dst, lit)
	}
	// The decoded text is never longer than the literal: growing once here
	// keeps long texts from being copied at every step of append's growth.
	dst = slices.Grow(dst, len(lit))
	return appendUnquoted(dst, lit[1:len(lit)-1])
}

// appendUnquoted is appendLiteral on the inside of a literal.
func appendUnquoted(dst, s []byte) []byte {
	for len(s) > 0 {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		s = s[i:]
		r, n := decodeEscape(s)
		if n == 0 {
			// Not a valid escape: keep the backslash as content.
			dst = append(dst, '\\')
			s = s[1:]
			continue
		}
		switch {
		case r < utf8.RuneSelf && reserved(byte(r)):
			dst = append(dst, sepEscape, byte(r)+0x40)
		case r < utf8.RuneSelf:
			dst = append(dst, byte(r))
		default:
			dst = utf8.AppendRune(dst, r)
		}
		s = s[n:]
	}
	return dst
}

// ignored reports whether the text of the string literal lit starts with
// one of the ignored system prefixes.
func (b *builder) ignored(lit []byte) bool {
	if len(b.ignore) == 0 || len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return false
	}
	for _, p := range b.ignore {
		if p != "" && b.literalHasPrefix(lit[1:len(lit)-1], p) {
			return true
		}
	}
	return false
}

// literalHasPrefix compares the decoded text of the literal's inside s with
// prefix, decoding no more of s than the comparison needs: a system prompt
// may be long and full of escapes.
func (b *builder) literalHasPrefix(s []byte, prefix string) bool {
	want := prefix
	for i := range len(prefix) {
		if reserved(prefix[i]) {
			// Decoded text is compared in escaped form.
			want = string(appendEscaped(nil, prefix))
			break
		}
	}
	// A decoded byte takes at most 6 bytes of literal (\u0041), and the
	// escape cut by the bound at most 12 more (a surrogate pair): the first
	// len(want) decoded bytes of the cut literal are those of the whole.
	if n := 6*len(want) + 12; len(s) > n {
		s = s[:n]
	}
	if bytes.IndexByte(s, '\\') >= 0 {
		b.scratch = appendUnquoted(b.scratch[:0], s)
		s = b.scratch
	}
	return len(s) >= len(want) && string(s[:len(want)]) == want
}

// decodeEscape decodes the JSON escape sequence at the start of s, which
// starts with a backslash, and returns the rune and the bytes consumed, or
// n == 0 if there is no valid escape. Lone surrogates become U+FFFD, as
// the decoder makes them (decodeOpts).
func decodeEscape(s []byte) (r rune, n int) {
	if len(s) < 2 {
		return 0, 0
	}
	switch s[1] {
	case '"', '\\', '/':
		return rune(s[1]), 2
	case 'b':
		return '\b', 2
	case 'f':
		return '\f', 2
	case 'n':
		return '\n', 2
	case 'r':
		return '\r', 2
	case 't':
		return '\t', 2
	case 'u':
		r1, ok := hex4(s[2:])
		if !ok {
			return 0, 0
		}
		if !utf16.IsSurrogate(r1) {
			return r1, 6
		}
		if len(s) >= 12 && s[6] == '\\' && s[7] == 'u' {
			if r2, ok := hex4(s[8:]); ok {
				if r := utf16.DecodeRune(r1, r2); r != utf8.RuneError {
					return r, 12
				}
			}
		}
		return utf8.RuneError, 6
	}
	return 0, 0
}

func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// decode returns the escaped content of the string literal lit without
// appending it to the key. Literals without escapes, which includes
// practically all base64, are returned in place; escaping is injective, so
// hashing this form identifies the decoded string.
func (b *builder) decode(lit []byte) []byte {
	if len(lit) >= 2 && lit[0] == '"' && lit[len(lit)-1] == '"' && bytes.IndexByte(lit, '\\') < 0 {
		return lit[1 : len(lit)-1]
	}
	b.scratch = appendLiteral(b.scratch[:0], lit)
	return b.scratch
}

// text appends a plain text item.
func (b *builder) text(lit []byte) {
	b.key = append(b.key, sepItem)
	b.key = appendLiteral(b.key, lit)
}

// marker starts a marker item of the given kind.
func (b *builder) marker(kind string) {
	b.key = append(b.key, sepItem, sepMarker)
	b.key = append(b.key, kind...)
	b.key = append(b.key, ':')
}

// field separates the sub-fields of a marker.
func (b *builder) field() { b.key = append(b.key, sepField) }

// appendJSON appends an arbitrary JSON value (tool arguments and inputs)
// compacted, so that formatting differences between clients do not split
// what the model sees as the same prompt. Compact JSON has no control
// bytes: those are always escaped inside JSON strings.
func (b *builder) appendJSON(raw []byte) {
	var err error
	if b.key, err = appendCompact(b.key, raw); err != nil {
		// raw was validated by the decoder that produced it.
		b.key = appendEscaped(b.key, raw)
	}
}

// hashStart begins the digest of a media item.
func (b *builder) hashStart() {
	if b.h == nil {
		b.h = sha256.New()
	} else {
		b.h.Reset()
	}
}

// hashField adds one named field to the digest. Values are in escaped form,
// which never contains NUL, so the framing below is unambiguous.
func (b *builder) hashField(name string, v []byte) {
	b.tag = append(b.tag[:0], name...)
	b.tag = append(b.tag, 0)
	b.h.Write(b.tag)
	b.h.Write(v)
	b.h.Write(b.tag[len(b.tag)-1:])
}

func (b *builder) hashString(name, v string) {
	b.scratch = appendEscaped(b.scratch[:0], v)
	b.hashField(name, b.scratch)
}

// hashEnd appends the digest, as hex, to the key.
func (b *builder) hashEnd() {
	sum := b.h.Sum(b.sum[:0])
	b.key = hex.AppendEncode(b.key, sum[:8])
}

// media appends a hashed media marker. The media is identified by uuid when
// the client supplied one, because vLLM then keys its multimodal cache by
// that uuid and not by the content; otherwise by the URL or data in lit.
func (b *builder) media(kind, uuid string, lit []byte) {
	b.hashStart()
	if lit != nil && uuid == "" {
		b.hashField("data", b.decode(lit))
	}
	if uuid != "" {
		b.hashString("uuid", uuid)
	}
	b.marker(kind)
	b.hashEnd()
}

// canonicalHash appends the digest of a JSON value of a type this package
// does not know. Objects are hashed by sorted key, without cache_control,
// because clients move Anthropic cache breakpoints from turn to turn and a
// moved breakpoint must not look like a different prompt.
func (b *builder) canonicalHash(raw []byte) {
	b.hashStart()
	var obj map[string]rawJSON
	if unmarshal(raw, &obj) != nil || obj == nil {
		b.scratch = compactAppend(b.scratch[:0], raw)
		b.hashField("value", b.scratch)
		b.hashEnd()
		return
	}
	b.sorted = b.sorted[:0]
	for k := range obj {
		if k != "cache_control" {
			b.sorted = append(b.sorted, k)
		}
	}
	slices.Sort(b.sorted)
	for _, k := range b.sorted {
		b.scratch = compactAppend(appendEscaped(b.scratch[:0], k), obj[k])
		b.hashField("member", b.scratch)
	}
	b.hashEnd()
}

func compactAppend(dst, raw []byte) []byte {
	out, err := appendCompact(append(dst, sepField), raw)
	if err != nil {
		return appendEscaped(dst, raw)
	}
	return out
}

// splitArray returns the elements of the JSON array raw. It is only used on
// rare paths (unknown part types, lenient fallbacks), as it costs a second
// full decode of the array.
func splitArray(raw []byte) []rawJSON {
	var elems []rawJSON
	if unmarshal(raw, &elems) != nil {
		return nil
	}
	return elems
}
