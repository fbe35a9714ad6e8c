package extract

import (
	"github.com/go-json-experiment/json"
)

// OpenAI chat completions (and the vLLM/SGLang extensions of it).
//
// Fields that may hold more than one JSON type, or whose text goes straight
// into the key, are rawJSON; everything else is typed so that the decoder
// checks it.

type chatRequest struct {
	openAIFields
	Messages []chatMessage `json:"messages"`
}

// openAIFields are the fields of chat and completions requests that
// Request reports.
type openAIFields struct {
	Model          string         `json:"model"`
	Stream         bool           `json:"stream"`
	StreamOptions  *streamOptions `json:"stream_options"`
	User           string         `json:"user"`
	PromptCacheKey string         `json:"prompt_cache_key"`
	CacheSalt      string         `json:"cache_salt"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func (f *openAIFields) request() *Request {
	out := &Request{
		Model:          f.Model,
		Stream:         f.Stream,
		User:           f.User,
		PromptCacheKey: f.PromptCacheKey,
		CacheSalt:      f.CacheSalt,
	}
	if f.StreamOptions != nil {
		out.IncludeUsage = f.StreamOptions.IncludeUsage
	}
	return out
}

type chatMessage struct {
	Role         rawJSON    `json:"role"`
	Name         string     `json:"name"`
	ToolCallID   string     `json:"tool_call_id"`
	Content      rawJSON    `json:"content"`
	ToolCalls    []toolCall `json:"tool_calls"`
	FunctionCall *callBody  `json:"function_call"`
}

type toolCall struct {
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	Function *callBody `json:"function"`
	Custom   *callBody `json:"custom"`
}

// callBody is a function call ({name, arguments}) or a custom tool call
// ({name, input}). Arguments are a JSON-encoded string per the API, but some
// clients send the object itself; both are accepted.
type callBody struct {
	Name      string  `json:"name"`
	Arguments rawJSON `json:"arguments"`
	Input     rawJSON `json:"input"`
}

// partFields are the content part fields that have one JSON type.
type partFields struct {
	Type       *string     `json:"type"`
	Text       rawJSON     `json:"text"`
	Refusal    rawJSON     `json:"refusal"`
	Thinking   rawJSON     `json:"thinking"`
	InputAudio *inputAudio `json:"input_audio"`
	File       *fileRef    `json:"file"`
	FileID     string      `json:"file_id"`
	UUID       string      `json:"uuid"`
}

// chatPart is a content part in the shape nearly every client sends: media
// URLs as {"url": ...} objects. Decoding a whole content array straight into
// it, instead of element by element, saves two passes of the JSON scanner
// over every base64 image.
type chatPart struct {
	partFields
	ImageURL *mediaURL `json:"image_url"`
	AudioURL *mediaURL `json:"audio_url"`
	VideoURL *mediaURL `json:"video_url"`
}

// chatPartLoose accepts the other shapes vLLM takes: a media URL given as a
// plain string (also the Responses-style input_image part).
type chatPartLoose struct {
	partFields
	ImageURL rawJSON `json:"image_url"`
	AudioURL rawJSON `json:"audio_url"`
	VideoURL rawJSON `json:"video_url"`
}

// strict reads the loose part's media fields in the strict shape; pp is
// the part's path, for error messages.
func (l *chatPartLoose) strict(pp *path) (chatPart, error) {
	part := chatPart{partFields: l.partFields}
	var err error
	for _, f := range [...]struct {
		name string
		raw  rawJSON
		dst  **mediaURL
	}{
		{"image_url", l.ImageURL, &part.ImageURL},
		{"audio_url", l.AudioURL, &part.AudioURL},
		{"video_url", l.VideoURL, &part.VideoURL},
	} {
		fp := pp.field(f.name)
		if *f.dst, err = looseMedia(f.raw, &fp); err != nil {
			return part, err
		}
	}
	return part, nil
}

type mediaURL struct {
	URL rawJSON `json:"url"`
}

type inputAudio struct {
	Data   rawJSON `json:"data"`
	Format string  `json:"format"`
}

type fileRef struct {
	FileData rawJSON `json:"file_data"`
	FileID   string  `json:"file_id"`
	Filename string  `json:"filename"`
	FileURL  rawJSON `json:"file_url"`
}

func (b *builder) chat(body []byte) (*Request, error) {
	var req chatRequest
	if err := unmarshal(body, &req); err != nil {
		return nil, decodeError(err, body, nil)
	}
	root := path{name: "messages"}
	if err := checkMessages(len(req.Messages), req.Messages == nil, &root); err != nil {
		return nil, err
	}
	for i := range req.Messages {
		p := root.index(i)
		if err := b.chatMessage(&req.Messages[i], &p); err != nil {
			return nil, err
		}
	}
	return req.request(), nil
}

func checkMessages(n int, absent bool, p *path) error {
	switch {
	case absent:
		return errMissing(p)
	case n == 0:
		return errValue(p, "expected a non-empty array of messages.")
	}
	return nil
}

func (b *builder) chatMessage(m *chatMessage, p *path) error {
	start := len(b.key)
	if err := b.role(m.Role, p); err != nil {
		return err
	}
	b.sysMsg = len(b.ignore) > 0 && b.systemRole(m.Role)
	b.dropped = 0
	defer func() { b.sysMsg = false }()
	if m.Name != "" {
		b.marker("name")
		b.key = appendEscaped(b.key, m.Name)
	}
	if m.ToolCallID != "" {
		b.marker("call_id")
		b.key = appendEscaped(b.key, m.ToolCallID)
	}
	contentStart := len(b.key)
	switch firstByte(m.Content) {
	case '"':
		if b.sysMsg && b.ignored(m.Content) {
			b.dropped++
		} else {
			b.text(m.Content)
		}
	case '[':
		// chatParts keeps the path it is given (its callbacks make it
		// escape): it gets one built on a copy of p, so that p, and with it
		// the path of every message, is not moved to the heap for it.
		mp := *p
		cp := mp.field("content")
		if err := b.chatParts(m.Content, &cp); err != nil {
			return err
		}
	case 0, 'n':
		// Assistant turns carry tool calls instead of content, and the
		// legacy function role may have none either.
		if r := string(b.decode(m.Role)); r != "assistant" && r != "function" {
			cp := p.field("content")
			return errMissing(&cp)
		}
	default:
		cp := p.field("content")
		return errType(&cp, "a string or an array of content parts", m.Content)
	}
	calls := p.field("tool_calls")
	for j := range m.ToolCalls {
		tp := calls.index(j)
		if err := b.toolCall(&m.ToolCalls[j], &tp); err != nil {
			return err
		}
	}
	if fc := m.FunctionCall; fc != nil {
		fp := p.field("function_call")
		b.marker("fn_call")
		b.key = appendEscaped(b.key, fc.Name)
		b.field()
		ap := fp.field("arguments")
		if err := b.arguments(fc.Arguments, &ap); err != nil {
			return err
		}
	}
	if b.dropped > 0 && len(b.key) == contentStart {
		// Nothing but ignored blocks: the message leaves no record, as if
		// the client had not sent it.
		b.key = b.key[:start]
		return nil
	}
	b.key = append(b.key, sepRecord)
	return nil
}

// systemRole reports the roles whose messages IgnoreSystemPrefixes apply to.
func (b *builder) systemRole(role rawJSON) bool {
	r := b.decode(role)
	return string(r) == "system" || string(r) == "developer"
}

// role starts a message record with its role, which must be a string.
func (b *builder) role(raw rawJSON, p *path) error {
	switch firstByte(raw) {
	case '"':
		b.key = appendLiteral(b.key, raw)
		return nil
	case 0, 'n':
		rp := p.field("role")
		return errMissing(&rp)
	}
	rp := p.field("role")
	return errType(&rp, "a string", raw)
}

func (b *builder) toolCall(tc *toolCall, p *path) error {
	b.marker("tool_call")
	b.key = appendEscaped(b.key, tc.ID)
	b.field()
	switch {
	case tc.Function != nil:
		return b.namedCall(tc.Function.Name, tc.Function.Arguments, p, "function", "arguments")
	case tc.Custom != nil:
		return b.namedCall(tc.Custom.Name, tc.Custom.Input, p, "custom", "input")
	}
	// A call type this package does not know: its type at least tells
	// calls apart.
	b.key = appendEscaped(b.key, tc.Type)
	return nil
}

// namedCall appends a call's name and its arguments, which the request
// holds at p.field(kind).field(argsField).
func (b *builder) namedCall(name string, args rawJSON, p *path, kind, argsField string) error {
	b.key = appendEscaped(b.key, name)
	b.field()
	kp := p.field(kind)
	ap := kp.field(argsField)
	return b.arguments(args, &ap)
}

func (b *builder) arguments(raw rawJSON, p *path) error {
	switch firstByte(raw) {
	case '"':
		b.key = appendLiteral(b.key, raw)
	case '{', '[':
		b.appendJSON(raw)
	case 0, 'n':
	default:
		return errType(p, "a string", raw)
	}
	return nil
}

// chatParts appends a content array.
func (b *builder) chatParts(raw rawJSON, p *path) error {
	return eachTyped(raw, p, func(pt *chatPart) *string { return pt.Type }, knownChatType, b.chatPart, b.chatPartsLoose)
}

// eachTyped decodes a JSON array of typed objects in one pass and hands
// each to one, with its index path. Objects of an unknown type are hashed
// from their JSON, which the typed decode does not keep, so the array is
// split as well only when such an object is present. When the one-pass
// decode fails, loose takes over element by element (for the exact error).
func eachTyped[T any](raw rawJSON, p *path, typeOf func(*T) *string, known func(string) bool,
	one func(*T, rawJSON, *path) error, loose func(rawJSON, *path) error) error {
	var xs []T
	if unmarshal(raw, &xs) != nil {
		return loose(raw, p)
	}
	var elems []rawJSON
	for i := range xs {
		if t := typeOf(&xs[i]); t != nil && !known(*t) {
			elems = splitArray(raw)
			break
		}
	}
	for i := range xs {
		var elem rawJSON
		if i < len(elems) {
			elem = elems[i]
		}
		ip := p.index(i)
		if err := one(&xs[i], elem, &ip); err != nil {
			return err
		}
	}
	return nil
}

// chatPartsLoose decodes a content array element by element. It accepts
// every shape vLLM does and reports errors with the exact element.
func (b *builder) chatPartsLoose(raw rawJSON, p *path) error {
	elems := splitArray(raw)
	for j, elem := range elems {
		pp := p.index(j)
		switch firstByte(elem) {
		case '"':
			// vLLM takes bare strings as text parts.
			if b.sysMsg && b.ignored(elem) {
				b.dropped++
			} else {
				b.text(elem)
			}
			continue
		case '{':
		default:
			return errType(&pp, "an object", elem)
		}
		var loose chatPartLoose
		if err := unmarshal(elem, &loose); err != nil {
			if t, ok := partType(elem); ok && !knownChatType(t) {
				b.unknownPart(t, elem)
				continue
			}
			return decodeError(err, elem, &pp)
		}
		if t := loose.Type; t != nil && !knownChatType(*t) {
			b.unknownPart(*t, elem)
			continue
		}
		part, err := loose.strict(&pp)
		if err != nil {
			return err
		}
		if err := b.chatPart(&part, elem, &pp); err != nil {
			return err
		}
	}
	return nil
}

// looseMedia accepts a media URL as {"url": ...} or as the bare string.
func looseMedia(raw rawJSON, p *path) (*mediaURL, error) {
	switch firstByte(raw) {
	case 0, 'n':
		return nil, nil
	case '"':
		return &mediaURL{URL: raw}, nil
	case '{':
		var m mediaURL
		if err := unmarshal(raw, &m); err != nil {
			return nil, decodeError(err, raw, p)
		}
		return &m, nil
	}
	return nil, errType(p, "an object or a string", raw)
}

// partType returns the "type" of a part or block when it is a string.
func partType(elem []byte) (string, bool) {
	var v struct {
		Type *string `json:"type"`
	}
	if unmarshal(elem, &v) != nil || v.Type == nil {
		return "", false
	}
	return *v.Type, true
}

func knownChatType(t string) bool {
	switch t {
	case "text", "input_text", "output_text", "refusal", "thinking",
		"image_url", "input_image", "audio_url", "input_audio", "video_url", "file":
		return true
	}
	return false
}

// chatPart appends one content part. elem is the part's JSON, needed only
// for types this package does not know.
func (b *builder) chatPart(pt *chatPart, elem rawJSON, p *path) error {
	var typ string
	if pt.Type != nil {
		typ = *pt.Type
	} else {
		// vLLM infers the type of untyped parts from the media field.
		switch {
		case pt.ImageURL != nil:
			typ = "image_url"
		case pt.AudioURL != nil:
			typ = "audio_url"
		case pt.VideoURL != nil:
			typ = "video_url"
		case pt.InputAudio != nil:
			typ = "input_audio"
		default:
			tp := p.field("type")
			return errMissing(&tp)
		}
	}
	var err error
	switch typ {
	case "text", "input_text", "output_text":
		if b.sysMsg && b.ignored(pt.Text) {
			b.dropped++
			return nil
		}
		err = b.textField(pt.Text, p, "text", "")
	case "refusal":
		err = b.textField(pt.Refusal, p, "refusal", "refusal")
	case "thinking":
		err = b.textField(pt.Thinking, p, "thinking", "think")
	case "image_url", "input_image":
		err = b.chatMedia("img", "image_url", pt.ImageURL, pt, p)
	case "audio_url":
		err = b.chatMedia("audio", "audio_url", pt.AudioURL, pt, p)
	case "video_url":
		err = b.chatMedia("video", "video_url", pt.VideoURL, pt, p)
	case "input_audio":
		err = b.inputAudio(pt, p)
	case "file":
		err = b.file(pt, p)
	default:
		if elem == nil {
			// Cannot happen: chatParts splits the array when it sees an
			// unknown type. Hash what is known rather than fail.
			elem, _ = json.Marshal(pt, compactOpts)
		}
		b.unknownPart(typ, elem)
	}
	return err
}

// textField appends a text-valued field as plain text (kind "") or as a
// marker of the given kind. Null counts as empty, as it does in vLLM.
func (b *builder) textField(raw rawJSON, p *path, name, kind string) error {
	switch firstByte(raw) {
	case '"':
	case 0, 'n':
		raw = nil
	default:
		fp := p.field(name)
		return errType(&fp, "a string", raw)
	}
	if kind == "" {
		b.key = append(b.key, sepItem)
	} else {
		b.marker(kind)
	}
	if raw != nil {
		b.key = appendLiteral(b.key, raw)
	}
	return nil
}

func (b *builder) chatMedia(kind, name string, m *mediaURL, pt *chatPart, p *path) error {
	fp := p.field(name)
	var lit rawJSON
	if m != nil {
		switch firstByte(m.URL) {
		case '"':
			lit = m.URL
		case 0, 'n':
		default:
			up := fp.field("url")
			return errType(&up, "a string", m.URL)
		}
	}
	uuid := pt.UUID
	if lit == nil && uuid == "" && pt.FileID != "" {
		// Responses-style input_image may name an uploaded file instead.
		uuid = "file:" + pt.FileID
	}
	if lit == nil && uuid == "" {
		if m != nil {
			up := fp.field("url")
			return errMissing(&up)
		}
		return errMissing(&fp)
	}
	b.media(kind, uuid, lit)
	return nil
}

func (b *builder) inputAudio(pt *chatPart, p *path) error {
	ap := p.field("input_audio")
	a := pt.InputAudio
	if a == nil {
		if pt.UUID != "" {
			b.media("audio", pt.UUID, nil)
			return nil
		}
		return errMissing(&ap)
	}
	switch firstByte(a.Data) {
	case '"':
	case 0, 'n':
		if pt.UUID != "" {
			b.media("audio", pt.UUID, nil)
			return nil
		}
		dp := ap.field("data")
		return errMissing(&dp)
	default:
		dp := ap.field("data")
		return errType(&dp, "a string", a.Data)
	}
	b.hashStart()
	if pt.UUID != "" {
		b.hashString("uuid", pt.UUID)
	} else {
		// The same bytes in another format decode to other audio.
		b.hashString("format", a.Format)
		b.hashField("data", b.decode(a.Data))
	}
	b.marker("audio")
	b.hashEnd()
	return nil
}

func (b *builder) file(pt *chatPart, p *path) error {
	fp := p.field("file")
	f := pt.File
	if f == nil {
		return errMissing(&fp)
	}
	return b.fileDigest(f.FileID, f.Filename, f.FileData, f.FileURL, &fp)
}

// fileDigest appends a file part (chat's "file" object, or a Responses
// input_file laid flat: the same digest either way). p is where its
// fields sit.
func (b *builder) fileDigest(id, name string, data, url rawJSON, p *path) error {
	for _, v := range [...]struct {
		name string
		raw  rawJSON
	}{{"file_data", data}, {"file_url", url}} {
		if !isNull(v.raw) && firstByte(v.raw) != '"' {
			vp := p.field(v.name)
			return errType(&vp, "a string", v.raw)
		}
	}
	if isNull(data) && isNull(url) && id == "" {
		dp := p.field("file_data")
		return errMissing(&dp)
	}
	b.hashStart()
	b.hashString("file_id", id)
	// OpenAI shows the model the file name along with the file.
	b.hashString("filename", name)
	if !isNull(data) {
		b.hashField("file_data", b.decode(data))
	}
	if !isNull(url) {
		b.hashField("file_url", b.decode(url))
	}
	b.marker("file")
	b.hashEnd()
	return nil
}

// unknownPart appends a marker for a part or block of a type this package
// does not know, so that new types never fail a request and different
// contents still give different keys.
func (b *builder) unknownPart(typ string, elem []byte) {
	b.marker("part")
	b.key = appendEscaped(b.key, typ)
	b.key = append(b.key, ':')
	b.canonicalHash(elem)
}
