package extract

import (
	"github.com/go-json-experiment/json"
)

// OpenAI Responses API (POST /v1/responses), as vLLM serves it.
//
// The key renders instructions as a system record and every input item as
// one self-terminated record, in the chat completions notation:
//
//	T        = ["system" item RS]  record*        (instructions)
//	message  = role item* RS                       (parts as in chat)
//	fn_call  = "assistant" US NUL "tool_call:" call_id GS name GS arguments RS
//	fn_out   = "tool" US NUL "call_id:" call_id (item | parts) RS
//	reason   = "reasoning" (US NUL "think:" text)* [US NUL "redacted_think:" hash] RS
//	other    = "item" US NUL "part:" type ":" hash RS
//
// A string input is one user message, so it gives the same T as a chat
// request with that user message. Item ids and statuses are left out: a
// client that replays a conversation in full (store: false) sends the
// earlier answer's output items back, and the replayed request must have
// the earlier request's T as its prefix whatever bookkeeping the items
// carry. previous_response_id is not part of the key: such a request is
// pinned to the replica holding that response, not routed by prefix.

type responsesRequest struct {
	Model              string  `json:"model"`
	Stream             bool    `json:"stream"`
	User               string  `json:"user"`
	PromptCacheKey     string  `json:"prompt_cache_key"`
	CacheSalt          string  `json:"cache_salt"`
	Instructions       rawJSON `json:"instructions"`
	Input              rawJSON `json:"input"`
	PreviousResponseID rawJSON `json:"previous_response_id"`
}

// responsesItem is one element of a list input. Content and Output hold
// a string or an array of parts.
type responsesItem struct {
	Type             *string         `json:"type"`
	Role             rawJSON         `json:"role"`
	Content          rawJSON         `json:"content"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Arguments        rawJSON         `json:"arguments"`
	Input            rawJSON         `json:"input"`
	Output           rawJSON         `json:"output"`
	Summary          []reasoningText `json:"summary"`
	EncryptedContent rawJSON         `json:"encrypted_content"`
}

type reasoningText struct {
	Text rawJSON `json:"text"`
}

// responsesPart is a content part: the chat part shapes (image_url as a
// plain string, as input_image sends it) plus input_file's flat fields.
type responsesPart struct {
	chatPartLoose
	FileData rawJSON `json:"file_data"`
	FileURL  rawJSON `json:"file_url"`
	Filename string  `json:"filename"`
}

func (b *builder) responses(body []byte) (*Request, error) {
	var req responsesRequest
	if err := unmarshal(body, &req); err != nil {
		return nil, decodeError(err, body, nil)
	}
	switch firstByte(req.PreviousResponseID) {
	case 0, 'n', '"':
	default:
		p := path{name: "previous_response_id"}
		return nil, errType(&p, "a string", req.PreviousResponseID)
	}
	// Response objects echo instructions as a list of input items.
	if err := b.textOrItems(req.Instructions, "instructions", "system", "a string"); err != nil {
		return nil, err
	}
	// Input may be left out when previous_response_id or a stored prompt
	// supplies the conversation.
	if err := b.textOrItems(req.Input, "input", "user", "a string or an array of input items"); err != nil {
		return nil, err
	}
	out := &Request{
		Model:          req.Model,
		Stream:         req.Stream,
		User:           req.User,
		PromptCacheKey: req.PromptCacheKey,
		CacheSalt:      req.CacheSalt,
	}
	if firstByte(req.PreviousResponseID) == '"' {
		out.PreviousResponseID = string(b.decode(req.PreviousResponseID))
	}
	return out, nil
}

// textOrItems appends the top-level field name: absent, a string (one turn
// of role) or a list of input items. want names the accepted types in the
// error for anything else.
func (b *builder) textOrItems(raw rawJSON, name, role, want string) error {
	p := path{name: name}
	switch firstByte(raw) {
	case 0, 'n':
	case '"':
		b.key = append(b.key, role...)
		b.text(raw)
		b.key = append(b.key, sepRecord)
	case '[':
		return b.responsesItems(raw, &p)
	default:
		return errType(&p, want, raw)
	}
	return nil
}

func (b *builder) responsesItems(raw rawJSON, p *path) error {
	return eachTyped(raw, p, func(it *responsesItem) *string { return it.Type }, knownItemType, b.responsesItem, b.responsesItemsLoose)
}

func knownItemType(t string) bool {
	switch t {
	case "message", "function_call", "custom_tool_call", "function_call_output", "custom_tool_call_output", "reasoning":
		return true
	}
	return false
}

func (b *builder) responsesItemsLoose(raw rawJSON, p *path) error {
	return eachLoose(raw, p, b.responsesItem)
}

// eachLoose decodes a JSON array of objects element by element and hands
// each to one, so that the first element that does not decode is named
// exactly.
func eachLoose[T any](raw rawJSON, p *path, one func(*T, rawJSON, *path) error) error {
	for i, elem := range splitArray(raw) {
		ep := p.index(i)
		if firstByte(elem) != '{' {
			return errType(&ep, "an object", elem)
		}
		var x T
		if err := unmarshal(elem, &x); err != nil {
			return decodeError(err, elem, &ep)
		}
		if err := one(&x, elem, &ep); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) responsesItem(it *responsesItem, elem rawJSON, p *path) error {
	typ := "message" // the "easy" input message has no type
	if it.Type != nil {
		typ = *it.Type
	}
	switch typ {
	case "message":
		if err := b.role(it.Role, p); err != nil {
			return err
		}
		cp := p.field("content")
		if err := b.responsesContent(it.Content, &cp); err != nil {
			return err
		}
	case "function_call", "custom_tool_call":
		b.key = append(b.key, "assistant"...)
		b.marker("tool_call")
		b.key = appendEscaped(b.key, it.CallID)
		b.field()
		b.key = appendEscaped(b.key, it.Name)
		b.field()
		args, name := it.Arguments, "arguments"
		if typ == "custom_tool_call" {
			args, name = it.Input, "input"
		}
		ap := p.field(name)
		if err := b.arguments(args, &ap); err != nil {
			return err
		}
	case "function_call_output", "custom_tool_call_output":
		b.key = append(b.key, "tool"...)
		b.marker("call_id")
		b.key = appendEscaped(b.key, it.CallID)
		op := p.field("output")
		if err := b.responsesContent(it.Output, &op); err != nil {
			return err
		}
	case "reasoning":
		b.key = append(b.key, "reasoning"...)
		sp := p.field("summary")
		for j := range it.Summary {
			tp := sp.index(j)
			if err := b.textField(it.Summary[j].Text, &tp, "text", "think"); err != nil {
				return err
			}
		}
		// Reasoning content parts are text parts of their own types.
		if firstByte(it.Content) == '[' {
			cp := p.field("content")
			if err := b.responsesParts(it.Content, &cp); err != nil {
				return err
			}
		}
		switch firstByte(it.EncryptedContent) {
		case 0, 'n':
		case '"':
			b.hashStart()
			b.hashField("data", b.decode(it.EncryptedContent))
			b.marker("redacted_think")
			b.hashEnd()
		default:
			ep := p.field("encrypted_content")
			return errType(&ep, "a string", it.EncryptedContent)
		}
	default:
		// Built-in tool calls, item references, MCP items...: what they
		// hold differs from one call to the next, so they are hashed.
		b.key = append(b.key, "item"...)
		b.unknownPart(typ, elem)
	}
	b.key = append(b.key, sepRecord)
	return nil
}

// responsesContent appends a message's content or a tool output: a string
// or an array of parts.
func (b *builder) responsesContent(raw rawJSON, p *path) error {
	switch firstByte(raw) {
	case '"':
		b.text(raw)
		return nil
	case '[':
		return b.responsesParts(raw, p)
	case 0, 'n':
		return errMissing(p)
	}
	return errType(p, "a string or an array of content parts", raw)
}

func (b *builder) responsesParts(raw rawJSON, p *path) error {
	return eachTyped(raw, p, func(rp *responsesPart) *string { return rp.Type }, knownResponsesPartType, b.responsesPart, b.responsesPartsLoose)
}

// knownResponsesPartType is true for the part types responsesPart handles
// itself: chat's, and the Responses API's own.
func knownResponsesPartType(t string) bool {
	return knownChatType(t) || t == "input_file" || t == "reasoning_text" || t == "summary_text"
}

func (b *builder) responsesPartsLoose(raw rawJSON, p *path) error {
	return eachLoose(raw, p, b.responsesPart)
}

// responsesPart appends one content part; elem is its JSON, needed only
// for types this package does not know.
func (b *builder) responsesPart(rp *responsesPart, elem rawJSON, pp *path) error {
	typ := ""
	if rp.Type != nil {
		typ = *rp.Type
	}
	switch typ {
	case "input_file":
		return b.inputFile(rp, pp)
	case "reasoning_text", "summary_text":
		return b.textField(rp.Text, pp, "text", "think")
	}
	if rp.Type != nil && !knownChatType(typ) {
		if elem == nil {
			elem, _ = json.Marshal(rp, compactOpts) // cannot happen: split when such a part is present
		}
		b.unknownPart(typ, elem)
		return nil
	}
	part, err := rp.strict(pp)
	if err != nil {
		return err
	}
	return b.chatPart(&part, elem, pp)
}

// inputFile appends a Responses input_file part, whose fields are those of
// a chat file part laid flat, with the same digest.
func (b *builder) inputFile(rp *responsesPart, p *path) error {
	return b.fileDigest(rp.FileID, rp.Filename, rp.FileData, rp.FileURL, p)
}
