package extract

import (
	"bytes"
	"slices"
)

// OpenAI completions.

type completionRequest struct {
	openAIFields
	Prompt       rawJSON `json:"prompt"`
	PromptEmbeds rawJSON `json:"prompt_embeds"`
}

const promptTypes = "a string, an array of strings, an array of token ids or an array of arrays of token ids"

func (b *builder) completions(body []byte) (*Request, error) {
	var req completionRequest
	if err := unmarshal(body, &req); err != nil {
		return nil, decodeError(err, body, nil)
	}
	p := path{name: "prompt"}
	switch firstByte(req.Prompt) {
	case '"':
		b.key = appendLiteral(b.key, req.Prompt)
	case '[':
		if err := b.promptArray(req.Prompt, &p); err != nil {
			return nil, err
		}
	case 0, 'n':
		// vLLM takes precomputed embeddings instead of a prompt.
		if isNull(req.PromptEmbeds) {
			return nil, errMissing(&p)
		}
	default:
		return nil, errType(&p, promptTypes, req.Prompt)
	}
	if !isNull(req.PromptEmbeds) {
		// Relative to where this request's key starts: AppendKey's dst may
		// already hold bytes.
		if len(b.key) > b.start {
			b.key = append(b.key, sepRecord)
		}
		b.marker("embeds")
		b.canonicalHash(req.PromptEmbeds)
	}
	return req.request(), nil
}

// promptArray appends an array prompt, whose kind its first element decides.
func (b *builder) promptArray(raw rawJSON, p *path) error {
	// Rendered ids are never longer than their JSON.
	b.key = slices.Grow(b.key, len(raw))
	s := scanner{data: bytes.TrimLeft(raw, " \t\r\n")}
	s.next() // '['
	s.skipSpace()
	switch s.peek() {
	case ']':
		return nil
	case '"':
		for j, elem := range splitArray(raw) {
			if firstByte(elem) != '"' {
				ep := p.index(j)
				return errType(&ep, "a string", elem)
			}
			if j > 0 {
				b.key = append(b.key, sepRecord)
			}
			b.key = appendLiteral(b.key, elem)
		}
		return nil
	case '[':
		for j := 0; ; j++ {
			ep := p.index(j)
			if s.peek() != '[' {
				return errType(&ep, "an array of token ids", s.rest())
			}
			if j > 0 {
				b.key = append(b.key, sepRecord)
			}
			if err := b.tokenIDs(&s, &ep); err != nil {
				return err
			}
			if !s.more() {
				return nil
			}
		}
	}
	return b.tokenIDs(s.reset(), p)
}

// tokenIDs appends the array of integers at s. Token prompts can run to
// hundreds of thousands of ids, so they are read straight from the
// validated JSON rather than decoded into a []int.
func (b *builder) tokenIDs(s *scanner, p *path) error {
	s.next() // '['
	s.skipSpace()
	if s.peek() == ']' {
		s.next()
		return nil
	}
	for j := 0; ; j++ {
		lit := s.number()
		if lit == nil {
			ep := p.index(j)
			return errType(&ep, "an integer", s.rest())
		}
		for _, c := range lit {
			if c == '.' || c == 'e' || c == 'E' {
				ep := p.index(j)
				return errValue(&ep, "token ids must be integers.")
			}
		}
		b.key = append(b.key, lit...)
		b.key = append(b.key, sepItem)
		if !s.more() {
			return nil
		}
	}
}

// scanner walks JSON that the decoder has already validated. It only
// reads arrays of numbers; anything else is reported back to the caller
// rather than parsed. It never indexes past the data, whatever it holds.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) reset() *scanner { s.pos = 0; return s }

func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *scanner) next() { s.pos++ }

func (s *scanner) rest() []byte {
	if s.pos < len(s.data) {
		return s.data[s.pos:]
	}
	return nil
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// more consumes the separator after an element and reports whether another
// element follows; it consumes the closing bracket otherwise.
func (s *scanner) more() bool {
	s.skipSpace()
	c := s.peek()
	s.next()
	if c != ',' {
		return false
	}
	s.skipSpace()
	return true
}

// number consumes a number literal, or returns nil if none starts here.
func (s *scanner) number() []byte {
	start := s.pos
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		if ('0' <= c && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			s.pos++
			continue
		}
		break
	}
	if s.pos == start {
		return nil
	}
	return s.data[start:s.pos]
}
