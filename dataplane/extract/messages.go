package extract

import (
	"github.com/go-json-experiment/json"
)

// Anthropic messages.

type messagesRequest struct {
	Model     string        `json:"model"`
	CacheSalt string        `json:"cache_salt"`
	Stream    bool          `json:"stream"`
	System    rawJSON       `json:"system"`
	Messages  []anthMessage `json:"messages"`
	Metadata  *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

type anthMessage struct {
	Role    rawJSON `json:"role"`
	Content rawJSON `json:"content"`
}

type anthBlock struct {
	Type      *string     `json:"type"`
	Text      rawJSON     `json:"text"`
	Source    *anthSource `json:"source"`
	ID        string      `json:"id"`
	Name      string      `json:"name"`
	Input     rawJSON     `json:"input"`
	ToolUseID string      `json:"tool_use_id"`
	Content   rawJSON     `json:"content"`
	IsError   bool        `json:"is_error"`
	Thinking  rawJSON     `json:"thinking"`
	Data      rawJSON     `json:"data"`
}

type anthSource struct {
	Type      string  `json:"type"`
	MediaType string  `json:"media_type"`
	Data      rawJSON `json:"data"`
	URL       rawJSON `json:"url"`
	FileID    string  `json:"file_id"`
	Content   rawJSON `json:"content"`
}

type systemBlock struct {
	Type *string `json:"type"`
	Text rawJSON `json:"text"`
}

// maxNesting bounds how deep tool results and documents may nest content.
// The API allows two levels; the bound only keeps recursion finite on
// hostile input.
const maxNesting = 8

func (b *builder) messages(body []byte) (*Request, error) {
	var req messagesRequest
	if err := unmarshal(body, &req); err != nil {
		return nil, decodeError(err, body, nil)
	}
	root := path{name: "messages"}
	if err := checkMessages(len(req.Messages), req.Messages == nil, &root); err != nil {
		return nil, err
	}
	if err := b.system(req.System); err != nil {
		return nil, err
	}
	// Declared outside the loop: through the recursion in anthContent,
	// escape analysis would move per-iteration paths to the heap, one
	// allocation per message; these stay on the stack.
	var p, cp path
	for i := range req.Messages {
		p = root.index(i)
		m := &req.Messages[i]
		if err := b.role(m.Role, &p); err != nil {
			return nil, err
		}
		cp = p.field("content")
		if isNull(m.Content) {
			return nil, errMissing(&cp)
		}
		if err := b.anthContent(m.Content, &cp, 0); err != nil {
			return nil, err
		}
		b.key = append(b.key, sepRecord)
	}
	out := &Request{Model: req.Model, Stream: req.Stream, CacheSalt: req.CacheSalt}
	if req.Metadata != nil {
		out.User = req.Metadata.UserID
	}
	return out, nil
}

// system appends the top-level system prompt as a record of its own, laid
// out like a chat completions system message. Blocks starting with an
// ignored prefix are left out, and a system prompt left with nothing gives
// no record, as if it were absent.
func (b *builder) system(raw rawJSON) error {
	p := path{name: "system"}
	start := len(b.key)
	switch firstByte(raw) {
	case 0, 'n':
		return nil
	case '"':
		if b.ignored(raw) {
			return nil
		}
		b.key = append(b.key, "system"...)
		b.text(raw)
	case '[':
		var blocks []systemBlock
		if err := unmarshal(raw, &blocks); err != nil {
			return decodeError(err, raw, &p)
		}
		b.key = append(b.key, "system"...)
		kept, dropped := 0, 0
		for j := range blocks {
			bp := p.index(j)
			tp := bp.field("type")
			switch t := blocks[j].Type; {
			case t == nil:
				return errMissing(&tp)
			case *t != "text":
				return errValue(&tp, "system blocks must be of type 'text'.")
			}
			if firstByte(blocks[j].Text) != '"' {
				xp := bp.field("text")
				if isNull(blocks[j].Text) {
					return errMissing(&xp)
				}
				return errType(&xp, "a string", blocks[j].Text)
			}
			if b.ignored(blocks[j].Text) {
				dropped++
				continue
			}
			kept++
			b.text(blocks[j].Text)
		}
		if kept == 0 && dropped > 0 {
			b.key = b.key[:start]
			return nil
		}
	default:
		return errType(&p, "a string or an array of text blocks", raw)
	}
	b.key = append(b.key, sepRecord)
	return nil
}

// anthContent appends a non-null content value: a string or an array of
// content blocks.
func (b *builder) anthContent(raw rawJSON, p *path, depth int) error {
	switch firstByte(raw) {
	case '"':
		b.text(raw)
		return nil
	case '[':
		if depth > maxNesting {
			return errValue(p, "content is nested too deeply.")
		}
		return b.anthBlocks(raw, p, depth)
	}
	return errType(p, "a string or an array of content blocks", raw)
}

func (b *builder) anthBlocks(raw rawJSON, p *path, depth int) error {
	var blocks []anthBlock
	if unmarshal(raw, &blocks) != nil {
		return b.anthBlocksLoose(raw, p, depth)
	}
	var elems []rawJSON
	for j := range blocks {
		if t := blocks[j].Type; t != nil && !knownAnthType(*t) {
			elems = splitArray(raw)
			break
		}
	}
	var bp path // outside the loop, for the reason given in messages
	for j := range blocks {
		var elem rawJSON
		if j < len(elems) {
			elem = elems[j]
		}
		bp = p.index(j)
		if err := b.anthBlock(&blocks[j], elem, &bp, depth); err != nil {
			return err
		}
	}
	return nil
}

// anthBlocksLoose decodes blocks one at a time, so that a block of an
// unknown type whose fields clash with the known ones is still accepted, and
// a broken known block is reported precisely.
func (b *builder) anthBlocksLoose(raw rawJSON, p *path, depth int) error {
	var bp path
	for j, elem := range splitArray(raw) {
		bp = p.index(j)
		if firstByte(elem) != '{' {
			return errType(&bp, "an object", elem)
		}
		var blk anthBlock
		if err := unmarshal(elem, &blk); err != nil {
			if t, ok := partType(elem); ok && !knownAnthType(t) {
				b.unknownPart(t, elem)
				continue
			}
			return decodeError(err, elem, &bp)
		}
		if err := b.anthBlock(&blk, elem, &bp, depth); err != nil {
			return err
		}
	}
	return nil
}

func knownAnthType(t string) bool {
	switch t {
	case "text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking":
		return true
	}
	return false
}

func (b *builder) anthBlock(blk *anthBlock, elem rawJSON, p *path, depth int) error {
	if blk.Type == nil {
		tp := p.field("type")
		return errMissing(&tp)
	}
	switch typ := *blk.Type; typ {
	case "text":
		if firstByte(blk.Text) != '"' {
			tp := p.field("text")
			if isNull(blk.Text) {
				return errMissing(&tp)
			}
			return errType(&tp, "a string", blk.Text)
		}
		b.text(blk.Text)
	case "image":
		return b.source("img", blk.Source, p, depth)
	case "document":
		return b.source("doc", blk.Source, p, depth)
	case "tool_use":
		b.marker("tool_use")
		b.key = appendEscaped(b.key, blk.ID)
		b.field()
		b.key = appendEscaped(b.key, blk.Name)
		b.field()
		if !isNull(blk.Input) {
			b.appendJSON(blk.Input)
		}
	case "tool_result":
		b.marker("tool_result")
		b.key = appendEscaped(b.key, blk.ToolUseID)
		if blk.IsError {
			b.field()
			b.key = append(b.key, "error"...)
		}
		b.key = append(b.key, sepOpen)
		if !isNull(blk.Content) {
			cp := p.field("content")
			if err := b.anthContent(blk.Content, &cp, depth+1); err != nil {
				return err
			}
		}
		b.key = append(b.key, sepClose)
	case "thinking":
		switch firstByte(blk.Thinking) {
		case '"', 0, 'n':
		default:
			tp := p.field("thinking")
			return errType(&tp, "a string", blk.Thinking)
		}
		b.marker("think")
		if !isNull(blk.Thinking) {
			b.key = appendLiteral(b.key, blk.Thinking)
		}
	case "redacted_thinking":
		b.hashStart()
		if firstByte(blk.Data) == '"' {
			b.hashField("data", b.decode(blk.Data))
		}
		b.marker("redacted_think")
		b.hashEnd()
	default:
		if elem == nil {
			// Cannot happen: anthBlocks splits the array when it sees an
			// unknown type. Hash what is known rather than fail.
			elem, _ = json.Marshal(blk, compactOpts)
		}
		b.unknownPart(typ, elem)
	}
	return nil
}

// source appends an image or document.
func (b *builder) source(kind string, s *anthSource, p *path, depth int) error {
	sp := p.field("source")
	if s == nil {
		return errMissing(&sp)
	}
	str := func(raw rawJSON, name string) error {
		fp := sp.field(name)
		switch firstByte(raw) {
		case '"':
			return nil
		case 0, 'n':
			return errMissing(&fp)
		}
		return errType(&fp, "a string", raw)
	}
	switch s.Type {
	case "base64", "text":
		if err := str(s.Data, "data"); err != nil {
			return err
		}
		b.hashStart()
		b.hashString("media_type", s.MediaType)
		b.hashField("data", b.decode(s.Data))
	case "url":
		if err := str(s.URL, "url"); err != nil {
			return err
		}
		b.hashStart()
		b.hashField("url", b.decode(s.URL))
	case "file":
		if s.FileID == "" {
			fp := sp.field("file_id")
			return errMissing(&fp)
		}
		b.hashStart()
		b.hashString("file_id", s.FileID)
	case "content":
		// A document made of blocks: nest them so that their text and any
		// remote image in them are seen like anywhere else.
		if isNull(s.Content) {
			cp := sp.field("content")
			return errMissing(&cp)
		}
		b.marker(kind)
		b.key = append(b.key, sepOpen)
		cp := sp.field("content")
		if err := b.anthContent(s.Content, &cp, depth+1); err != nil {
			return err
		}
		b.key = append(b.key, sepClose)
		return nil
	default:
		// A source type this package does not know: identify it by every
		// field it has in common with the known ones.
		b.hashStart()
		b.hashString("type", s.Type)
		b.hashString("media_type", s.MediaType)
		b.hashString("file_id", s.FileID)
		for _, f := range [...]struct {
			name string
			raw  rawJSON
		}{{"data", s.Data}, {"url", s.URL}, {"content", s.Content}} {
			if !isNull(f.raw) {
				b.scratch = compactAppend(b.scratch[:0], f.raw)
				b.hashField(f.name, b.scratch)
			}
		}
	}
	b.marker(kind)
	b.hashEnd()
	return nil
}
