package extract

import (
	"bytes"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// The remote-media policy and the key must be derived from the body as the
// engine reads it (vLLM, SGLang: Python's json.loads, then pydantic), and
// the decoder (decode.go) reads only the fields this package needs:
//
//   - the engines fetch media from fields this package has no reason to
//     decode (vLLM reads part["image_url"] of any part carrying a uuid,
//     whatever its type; SGLang's /generate takes image_data; /v1/responses,
//     /v1/embeddings and /tokenize take chat messages);
//   - a body whose objects repeat a key, or hold keys that differ only in
//     case, reads differently to parsers that keep the first or fold case
//     ({"url":"http://x","URL":"data:..."} is a data: URL to Go's
//     encoding/json v1 and a remote URL to vLLM): CART refuses those
//     rather than guess what the next reader will take.
//
// So every body is walked once, before it is decoded, by a scanner that
// sees every member of every object: it refuses objects holding the same
// key twice or two keys that differ only in case, refuses keys that differ
// only in case from a field this package decodes at that place (a client
// misspelling one, which the exact-case decoder would silently skip), and
// checks every string under a media field, whatever the part's type. The
// walk also counts array items, so that an oversized body is refused
// before the decoder materialises it.

// Media is what a scan found in the media fields of a body.
type Media struct {
	Remote string // first http(s) URL (any scheme starting with "http")
	File   string // first file: URL
}

// ScanMedia checks a body the proxy forwards without decoding it (any
// endpoint other than the three routed ones) for media URLs and for the
// duplicate and case-variant keys described above. Bodies that are not a
// JSON object or array carry no media and are not looked at, but a body an
// engine would decode as JSON in another encoding (a byte order mark, or
// UTF-16/32, which Python's json.loads detects) is refused, since it cannot
// be checked.
func ScanMedia(body []byte) (Media, error) {
	if hasForeignEncoding(body) {
		return Media{}, apierr.BadRequest(codeInvalidJSON, "", "The request body must be UTF-8 JSON without a byte order mark.")
	}
	switch firstByte(body) {
	case '{', '[':
	default:
		return Media{}, nil
	}
	w := newWalker(body)
	defer w.release()
	w.value(nil, modeScan, 0)
	w.end()
	if w.err != nil {
		return Media{}, w.err
	}
	if w.bad {
		return Media{}, apierr.BadRequest(codeInvalidJSON, "", "The request body is not valid JSON.")
	}
	return w.media, nil
}

// hasForeignEncoding reports a byte order mark or the NUL bytes that make
// Python's json.detect_encoding pick UTF-16 or UTF-32.
func hasForeignEncoding(b []byte) bool {
	if bytes.HasPrefix(b, []byte{0xef, 0xbb, 0xbf}) || bytes.HasPrefix(b, []byte{0xfe, 0xff}) || bytes.HasPrefix(b, []byte{0xff, 0xfe}) {
		return true
	}
	return bytes.IndexByte(b[:min(len(b), 4)], 0) >= 0
}

// scanRouted walks the body of a routed endpoint with the decode levels of
// its request type, counting array items against maxItems (<= 0: no
// bound). bad reports a body the walker could not parse; the caller's
// decode then reports the syntax error. tooMany reports a body refused
// for its item count, which err then holds.
func scanRouted(e Endpoint, body []byte, maxItems int) (m Media, bad, tooMany bool, err error) {
	w := newWalker(body)
	defer w.release()
	w.maxItems = maxItems
	w.value(rootLevels[e], modeScan, 0)
	w.end()
	return w.media, w.bad, w.items > maxItems && maxItems > 0, w.err
}

// mode says what the walker does with the values it meets.
type mode uint8

const (
	modeScan   mode = iota // outside media fields: looking for them
	modeMedia              // under a media field: every string is checked
	modeExempt             // the value of "text" or "data" under a media field: a string here is content, not a location
	modeOpaque             // tool arguments, schemas, metadata: engines fetch nothing from them
)

// mediaKeys are the fields engines read media locations from. They are
// matched case-insensitively, a superset of what either Go or Python would
// match, and everything under them is checked.
var mediaKeys = foldSet(
	"image_url", "image_urls", "input_image", "audio_url", "video_url",
	"input_audio", "input_video", "input_file", "file", "files", "file_url", "file_data", "file_id",
	"image", "images", "image_data", "audio", "audio_data", "video", "video_data", "videos",
	"source", "url", "urls", "media", "media_url",
)

// opaqueKeys hold JSON the engines never fetch from, where a field called
// "url" or "image" is a client's own data: tool call arguments and inputs,
// JSON schemas (for tools and structured output), metadata, and the
// citations and annotations of earlier web-search answers. Matched exactly: a case variant is
// not the field the engine skips, so it stays scanned.
func opaqueKey(key []byte, top bool) bool {
	switch string(key) {
	case "arguments", "parameters", "input_schema", "json_schema", "schema", "guided_json",
		"structured_outputs", "metadata", "citations", "annotations":
		return true
	case "input":
		// Top-level input is what /v1/responses, /v1/embeddings and the
		// pooling APIs take their content from; nested, it is a tool
		// call's input.
		return !top
	}
	return false
}

// walker is a single pass over a JSON body. It is lenient about syntax it
// does not need (numbers, literals, invalid UTF-8): every body it accepts is
// also decoded by the decoder or refused, and on valid JSON it sees the
// same structure as any parser.
type walker struct {
	data  []byte
	pos   int
	bad   bool  // not JSON
	err   error // a refusal
	media Media
	keys  []byte    // decoded and folded keys of the objects being walked
	spans []keySpan // their positions in keys, a stack across nested objects

	// items counts array elements, the walk stopping once it passes
	// maxItems (> 0); see countItem.
	items, maxItems int
	// prompt is set inside the value of the top-level "prompt", where
	// arrays of numbers are token ids.
	prompt bool
}

type keySpan struct{ exact, fold, end int }

// walkers are pooled: every request is walked, and growing the key buffers
// from nothing each time would cost several allocations per request.
var walkers = sync.Pool{New: func() any { return new(walker) }}

func newWalker(body []byte) *walker {
	w := walkers.Get().(*walker)
	w.data = body
	return w
}

// maxPooledKeys bounds the key buffer kept for reuse: a hostile body's
// huge buffer must not stay pinned in the pool.
const maxPooledKeys = 64 << 10

func (w *walker) release() {
	keys, spans := w.keys[:0], w.spans[:0]
	if cap(keys) > maxPooledKeys || cap(spans) > maxPooledKeys/16 {
		keys, spans = nil, nil
	}
	*w = walker{keys: keys, spans: spans}
	walkers.Put(w)
}

// maxDepth is the decoder's nesting limit; deeper bodies are refused by
// the decoder anyway, and the bound keeps the walker's recursion finite.
const maxDepth = 10000

func (w *walker) stopped() bool { return w.bad || w.err != nil }

// end checks that nothing but whitespace follows the value.
func (w *walker) end() {
	w.space()
	if w.pos != len(w.data) {
		w.bad = true
	}
}

func (w *walker) space() {
	for w.pos < len(w.data) {
		switch w.data[w.pos] {
		case ' ', '\t', '\n', '\r':
			w.pos++
		default:
			return
		}
	}
}

func (w *walker) value(lv *level, m mode, depth int) {
	w.space()
	if w.pos >= len(w.data) {
		w.bad = true
		return
	}
	switch w.data[w.pos] {
	case '{':
		if m == modeExempt {
			m = modeMedia
		}
		w.object(lv, m, depth+1)
	case '[':
		if m == modeExempt {
			m = modeMedia
		}
		w.array(lv, m, depth+1)
	case '"':
		start := w.pos
		if w.str() && m == modeMedia {
			w.check(w.data[start:w.pos])
		}
	default:
		w.literal()
	}
}

// str skips the string literal at pos, reporting whether it was complete.
func (w *walker) str() bool {
	i := w.pos + 1
	for {
		j := bytes.IndexByte(w.data[i:], '"')
		if j < 0 {
			w.bad = true
			return false
		}
		i += j
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for k := i - 1; k > w.pos && w.data[k] == '\\'; k-- {
			n++
		}
		i++
		if n%2 == 0 {
			w.pos = i
			return true
		}
	}
}

func (w *walker) literal() {
	start := w.pos
	for w.pos < len(w.data) {
		c := w.data[w.pos]
		if c == '-' || c == '+' || c == '.' || ('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') {
			w.pos++
			continue
		}
		break
	}
	if w.pos == start {
		w.bad = true
	}
}

func (w *walker) array(lv *level, m mode, depth int) {
	if depth > maxDepth {
		w.bad = true
		return
	}
	w.pos++ // '['
	w.space()
	if w.pos < len(w.data) && w.data[w.pos] == ']' {
		w.pos++
		return
	}
	// Token ids of the prompt are read straight from the bytes by the
	// completions decoder, so they cost nothing and a long tokenised
	// prompt must not count; but an array mixing them with other values
	// is split into one value per element, numbers included.
	nums, mixed := 0, false
	for {
		w.space()
		switch {
		case w.prompt && w.pos < len(w.data) && (w.data[w.pos] == '-' || '0' <= w.data[w.pos] && w.data[w.pos] <= '9'):
			nums++
		default:
			mixed = mixed || w.prompt
			w.countItem(1)
		}
		if w.stopped() {
			return
		}
		w.value(lv, m, depth)
		if !w.next(']') {
			break
		}
	}
	if mixed && !w.stopped() {
		w.countItem(nums)
	}
}

// countItem adds n array items to the count, refusing the body once it
// passes maxItems. Decoding a request materialises every array item it
// reaches as a Go value: an empty message `{},` is 3 bytes of JSON but a
// struct of over 100 bytes, plus the slice growth (a 30 MiB body of empty
// messages took half a gigabyte), so the bound is checked here, before
// anything is decoded. Every element of every array counts, whatever its
// depth: messages, content parts, tool calls, nested tool results,
// prompts; token ids of the top-level prompt are the one exception.
func (w *walker) countItem(n int) {
	w.items += n
	if w.maxItems > 0 && w.items > w.maxItems {
		w.err = apierr.New(http.StatusBadRequest, apierr.TypeInvalidRequest, "too_many_items",
			"request has more than %d messages, content parts or other array items (proxy.max_messages)", w.maxItems)
	}
}

// manyKeys is where an object's key check switches from comparing each key
// with the ones before it to a map, so that a hostile object with a million
// keys costs linear time.
const manyKeys = 32

func (w *walker) object(lv *level, m mode, depth int) {
	if depth > maxDepth {
		w.bad = true
		return
	}
	start := w.pos
	w.pos++ // '{'
	mark, kmark := len(w.spans), len(w.keys)
	defer func() { w.spans, w.keys = w.spans[:mark], w.keys[:kmark] }()
	// Opaque JSON is not checked, unless this package decodes it (the
	// Anthropic metadata object is opaque to the media scan, but its
	// user_id is a session key).
	checked := m != modeOpaque || lv != nil
	var seen map[string]int
	w.space()
	if w.pos < len(w.data) && w.data[w.pos] == '}' {
		w.pos++
		return
	}
	for {
		w.space()
		if w.pos >= len(w.data) || w.data[w.pos] != '"' {
			w.bad = true
			return
		}
		ks := w.pos
		if !w.str() {
			return
		}
		ke := w.pos
		var key, fold []byte
		if checked {
			e := len(w.keys)
			w.keys = appendLiteral(w.keys, w.data[ks:w.pos])
			f := len(w.keys)
			w.keys = appendFold(w.keys, w.keys[e:f])
			sp := keySpan{e, f, len(w.keys)}
			key, fold = w.keys[sp.exact:sp.fold], w.keys[sp.fold:sp.end]
			if seen == nil && len(w.spans)-mark >= manyKeys {
				seen = make(map[string]int, 2*manyKeys)
				for i := mark; i < len(w.spans); i++ {
					seen[string(w.keys[w.spans[i].fold:w.spans[i].end])] = i
				}
			}
			prev := -1
			if seen != nil {
				if i, ok := seen[string(fold)]; ok {
					prev = i
				} else {
					seen[string(fold)] = len(w.spans)
				}
			} else {
				for i := mark; i < len(w.spans); i++ {
					if bytes.Equal(w.keys[w.spans[i].fold:w.spans[i].end], fold) {
						prev = i
						break
					}
				}
			}
			if prev >= 0 {
				w.refuseKeys(start, w.keys[w.spans[prev].exact:w.spans[prev].fold], key)
				return
			}
			if lv != nil {
				if f, ok := lv.fields[string(fold)]; ok && f != string(key) {
					w.refuseUnknown(start, key, f)
					return
				}
			}
			w.spans = append(w.spans, sp)
		}
		w.space()
		if w.pos >= len(w.data) || w.data[w.pos] != ':' {
			w.bad = true
			return
		}
		w.pos++
		var clv *level
		cm := modeOpaque
		if checked {
			if lv != nil {
				clv = lv.children[string(key)]
			}
			if m != modeOpaque {
				cm = w.childMode(m, key, fold, depth == 1)
			}
		}
		if depth == 1 {
			// Compared raw, escapes undecoded: a key spelled with escapes
			// gets no exemption.
			w.prompt = string(w.data[ks+1:ke-1]) == "prompt"
		}
		w.value(clv, cm, depth)
		if !w.next('}') {
			return
		}
	}
}

func (w *walker) childMode(m mode, key, fold []byte, top bool) mode {
	if m == modeMedia || m == modeExempt {
		if s := string(key); s == "text" || s == "data" {
			return modeExempt
		}
		return modeMedia
	}
	if mediaKeys[string(fold)] {
		return modeMedia
	}
	if opaqueKey(key, top) {
		return modeOpaque
	}
	return modeScan
}

// check records lit, a string literal under a media field, when it is a URL
// an engine would fetch or open.
func (w *walker) check(lit []byte) {
	dst := &w.media.Remote
	switch urlScheme(lit[1 : len(lit)-1]) {
	case schemeHTTP:
	case schemeFile:
		dst = &w.media.File
	default:
		return
	}
	if *dst != "" {
		return
	}
	if unmarshal(lit, dst) != nil || *dst == "" {
		*dst = string(lit)
	}
}

func (w *walker) refuseKeys(obj int, a, b []byte) {
	where := w.where(obj)
	if bytes.Equal(a, b) {
		w.err = apierr.BadRequest("duplicate_key", where.param, "Invalid value for %s: the key '%s' appears more than once; each key may appear only once.", where.name, truncate(a))
		return
	}
	w.err = apierr.BadRequest("duplicate_key", where.param, "Invalid value for %s: the keys '%s' and '%s' differ only in case; keys are case-sensitive and an object may not hold both.", where.name, truncate(a), truncate(b))
}

func (w *walker) refuseUnknown(obj int, key []byte, want string) {
	where := w.where(obj)
	w.err = apierr.BadRequest("invalid_key", where.param, "Invalid key '%s' in %s: keys are case-sensitive (did you mean '%s'?).", truncate(key), where.name, want)
}

type location struct{ param, name string }

// where names the object starting at byte obj for an error message. The
// path is worked out only now, since paths are needed only for refusals.
func (w *walker) where(obj int) location {
	if p, ok := objectPath(w.data, int64(obj)); ok && p != "" {
		return location{param: p, name: "'" + p + "'"}
	}
	return location{name: "the request body"}
}

// truncate shortens a client-chosen key for an error message, in escaped
// form (no control bytes).
func truncate(b []byte) string {
	const n = 64
	if len(b) > n {
		return strings.ToValidUTF8(string(b[:n]), "") + "..."
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// appendFold appends a form of key in which two keys are equal exactly when
// bytes.EqualFold (the rule encoding/json v1 matches fields by) says they are:
// every rune is replaced by the smallest rune of its simple folding orbit.
func appendFold(dst, key []byte) []byte {
	for len(key) > 0 {
		c := key[0]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			key = key[1:]
			continue
		}
		r, n := utf8.DecodeRune(key)
		key = key[n:]
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		dst = utf8.AppendRune(dst, least)
	}
	return dst
}

func foldSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[string(appendFold(nil, []byte(n)))] = true
	}
	return m
}

type urlKind uint8

const (
	schemeNone urlKind = iota
	schemeHTTP
	schemeFile
)

// urlScheme classifies the content of a JSON string literal (escapes not
// yet decoded) the way Python's urllib.parse.urlsplit, which vLLM uses,
// reads a scheme: leading C0 controls and spaces are dropped, tabs and
// newlines anywhere are ignored, and the scheme is an ASCII letter followed
// by letters, digits, '+', '-' or '.' up to the first ':'. vLLM fetches any
// scheme starting with "http" and opens file: URLs when allowed to. Only
// the first bytes are decoded, so a megabyte of base64 costs nothing.
func urlScheme(s []byte) urlKind {
	var scheme [4]byte
	n := 0
	leading := true
	for len(s) > 0 {
		r := rune(s[0])
		k := 1
		if s[0] == '\\' {
			if r, k = decodeEscape(s); k == 0 {
				return schemeNone
			}
		}
		s = s[k:]
		if leading && r <= ' ' {
			continue
		}
		leading = false
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			continue
		case r == ':':
			switch {
			case n >= 4 && string(scheme[:]) == "http":
				return schemeHTTP
			case n == 4 && string(scheme[:]) == "file":
				return schemeFile
			}
			return schemeNone
		case 'A' <= r && r <= 'Z', 'a' <= r && r <= 'z':
		case n > 0 && ('0' <= r && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return schemeNone
		}
		if n < len(scheme) {
			scheme[n] = byte(unicode.ToLower(r))
		}
		n++
	}
	return schemeNone
}

// level describes one place in a request type: the fields the decoder
// decodes there and the levels of their values.
type level struct {
	children map[string]*level // exact field name -> level of its value (nil: not an object this package decodes)
	fields   map[string]string // folded name -> exact name
}

// rawChildren names the levels of rawJSON fields that this package
// decodes later, by hand.
var rawChildren = map[reflect.Type]map[string]reflect.Type{
	reflect.TypeFor[chatMessage]():      {"content": reflect.TypeFor[chatPart]()},
	reflect.TypeFor[messagesRequest]():  {"system": reflect.TypeFor[systemBlock]()},
	reflect.TypeFor[anthMessage]():      {"content": reflect.TypeFor[anthBlock]()},
	reflect.TypeFor[anthBlock]():        {"content": reflect.TypeFor[anthBlock]()},
	reflect.TypeFor[anthSource]():       {"content": reflect.TypeFor[anthBlock]()},
	reflect.TypeFor[responsesRequest](): {"input": reflect.TypeFor[responsesItem](), "instructions": reflect.TypeFor[responsesItem]()},
	reflect.TypeFor[responsesItem]():    {"content": reflect.TypeFor[responsesPart](), "output": reflect.TypeFor[responsesPart]()},
}

// rootLevels are derived from the request types themselves, so that the
// check always covers exactly the fields the decoder will match.
var rootLevels = func() map[Endpoint]*level {
	cache := map[reflect.Type]*level{}
	return map[Endpoint]*level{
		ChatCompletions: levelFor(reflect.TypeFor[chatRequest](), cache),
		Completions:     levelFor(reflect.TypeFor[completionRequest](), cache),
		Messages:        levelFor(reflect.TypeFor[messagesRequest](), cache),
		Responses:       levelFor(reflect.TypeFor[responsesRequest](), cache),
	}
}()

func levelFor(t reflect.Type, cache map[reflect.Type]*level) *level {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	if l, ok := cache[t]; ok {
		return l
	}
	l := &level{children: map[string]*level{}, fields: map[string]string{}}
	cache[t] = l
	var add func(st reflect.Type)
	add = func(st reflect.Type) {
		for i := range st.NumField() {
			f := st.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous && name == "" {
				add(f.Type)
				continue
			}
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if rt, ok := rawChildren[st][name]; ok {
				l.children[name] = levelFor(rt, cache)
			} else {
				l.children[name] = levelFor(f.Type, cache)
			}
			l.fields[string(appendFold(nil, []byte(name)))] = name
		}
	}
	add(t)
	return l
}

// next consumes what follows an array element or object member: true after
// a ',' (another follows), false at close, when the walk has stopped, or on
// anything else (then w.bad is set).
func (w *walker) next(close byte) bool {
	if w.stopped() {
		return false
	}
	w.space()
	if w.pos >= len(w.data) {
		w.bad = true
		return false
	}
	c := w.data[w.pos]
	w.pos++
	switch c {
	case ',':
		return true
	case close:
		return false
	}
	w.bad = true
	return false
}
