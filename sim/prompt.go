package sim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// bytesPerToken is the tokenisation approximation: one token per 4 bytes.
const bytesPerToken = 4

// tokenCount returns the approximate number of tokens in a rendered prompt.
func tokenCount(prompt []byte) int {
	return (len(prompt) + bytesPerToken - 1) / bytesPerToken
}

// blockHashes returns the chained hash of every full block of prompt. Block i
// covers tokens [i*blockTokens, (i+1)*blockTokens); its hash covers the hash
// of block i-1 and its own bytes, so equal hashes mean equal prefixes.
//
// "Full" is judged in tokens, like the cached-token count it feeds, so the
// last full block may be a few bytes short when the final token is partial.
//
// A non-empty adapter (LoRA name) seeds the chain, as vLLM puts the adapter
// into every block's hash: KV computed under one adapter is never reused
// under another or under the base model. A non-empty salt (the request's
// cache_salt) seeds it too, as vLLM puts the salt into the first block's
// hash: requests with different salts, or with a salt and without, share
// no block.
func blockHashes(prompt []byte, blockTokens int, adapter, salt string) []uint64 {
	n := tokenCount(prompt) / blockTokens
	if n == 0 {
		return nil
	}
	blockBytes := blockTokens * bytesPerToken
	out := make([]uint64, n)
	h := fnv.New64a()
	var prev [8]byte
	if adapter != "" {
		_, _ = h.Write([]byte("lora:" + adapter))
		binary.LittleEndian.PutUint64(prev[:], h.Sum64())
	}
	if salt != "" {
		h.Reset()
		_, _ = h.Write(prev[:])
		_, _ = h.Write([]byte("salt:" + salt))
		binary.LittleEndian.PutUint64(prev[:], h.Sum64())
	}
	for i := range n {
		end := min((i+1)*blockBytes, len(prompt))
		h.Reset()
		_, _ = h.Write(prev[:]) // hash.Hash never fails
		_, _ = h.Write(prompt[i*blockBytes : end])
		out[i] = h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], out[i])
	}
	return out
}

// promptBuilder renders requests into the chat-template text described in the
// package documentation.
type promptBuilder struct {
	buf bytes.Buffer
}

func (b *promptBuilder) bytes() []byte { return b.buf.Bytes() }

// turn opens a template section for role.
func (b *promptBuilder) turn(role string) {
	b.buf.WriteString("<|")
	b.buf.WriteString(role)
	b.buf.WriteString("|>\n")
}

func (b *promptBuilder) endTurn() { b.buf.WriteByte('\n') }

// tools renders tool definitions first, as chat templates put them at the top
// of the system section; this makes a shared toolset part of the cacheable
// prefix, which it is in real deployments.
func (b *promptBuilder) tools(raw json.RawMessage) {
	if isAbsent(raw) {
		return
	}
	b.turn("tools")
	b.buf.Write(canonicalJSON(raw))
	b.endTurn()
}

// generationPrompt appends the assistant header that templates add so the
// model starts answering.
func (b *promptBuilder) generationPrompt() { b.turn("assistant") }

// placeholder renders a non-text content part deterministically.
func (b *promptBuilder) placeholder(typ string, raw json.RawMessage) {
	h := fnv.New64a()
	_, _ = h.Write(canonicalJSON(raw))
	if typ == "" {
		typ = "part"
	}
	fmt.Fprintf(&b.buf, "<|%s:%016x|>", typ, h.Sum64())
}

// content renders a message's content: a string, an array of typed parts, or
// null. textTypes lists the part types whose "text" field is copied verbatim.
func (b *promptBuilder) content(raw json.RawMessage, field string, textTypes ...string) error {
	if isAbsent(raw) {
		return nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		b.buf.WriteString(s)
		return nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		for i, p := range parts {
			var head struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if err := json.Unmarshal(p, &head); err != nil {
				return fmt.Errorf("%s[%d]: content parts must be objects: %w", field, i, err)
			}
			if head.Text != nil && slices.Contains(textTypes, head.Type) {
				b.buf.WriteString(*head.Text)
				continue
			}
			b.placeholder(head.Type, p)
		}
		return nil
	default:
		return fmt.Errorf("%s: must be a string, an array of content parts or null", field)
	}
}

// isAbsent reports whether a raw JSON field was missing or null.
func isAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// canonicalJSON re-encodes raw with sorted object keys and no insignificant
// whitespace, so that semantically equal JSON from differently formatting
// clients renders (and hashes) identically.
func canonicalJSON(raw json.RawMessage) []byte {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // keep numbers exactly as sent
	var v any
	if err := dec.Decode(&v); err != nil {
		return bytes.TrimSpace(raw)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return bytes.TrimSpace(raw)
	}
	return out
}

// chatMessage is one OpenAI chat message, keeping content raw because it may
// be a string, an array of parts, or null.
type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// renderChat renders an OpenAI chat request.
func renderChat(tools json.RawMessage, msgs []chatMessage) ([]byte, error) {
	var b promptBuilder
	b.tools(tools)
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		b.turn(m.Role)
		// "refusal" parts come back from assistant turns and are text too.
		if err := b.content(m.Content, fmt.Sprintf("messages[%d].content", i), "text", "refusal", "input_text", "output_text"); err != nil {
			return nil, err
		}
		if !isAbsent(m.ToolCalls) {
			b.buf.WriteString("<|tool_calls|>")
			b.buf.Write(canonicalJSON(m.ToolCalls))
		}
		b.endTurn()
	}
	b.generationPrompt()
	return b.bytes(), nil
}

// anthropicMessage is one Anthropic message.
type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// renderAnthropic renders an Anthropic messages request. Tools come first and
// then the system prompt, the same order in which Anthropic's own prompt
// caching considers them.
func renderAnthropic(tools, system json.RawMessage, msgs []anthropicMessage) ([]byte, error) {
	var b promptBuilder
	b.tools(tools)
	if !isAbsent(system) {
		b.turn("system")
		if err := b.content(system, "system", "text"); err != nil {
			return nil, err
		}
		b.endTurn()
	}
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		b.turn(m.Role)
		if err := b.content(m.Content, fmt.Sprintf("messages[%d].content", i), "text"); err != nil {
			return nil, err
		}
		b.endTurn()
	}
	b.generationPrompt()
	return b.bytes(), nil
}

// renderCompletionPrompt renders a legacy completions prompt: a string, a list
// of strings, a list of token ids, or a list of token-id lists. Lists are
// concatenated into one sequence rather than treated as a batch; the router
// and benchmarks send one prompt per request, and a batch would need one
// cache lookup per element for no benefit here.
func renderCompletionPrompt(raw json.RawMessage) ([]byte, error) {
	if isAbsent(raw) {
		return nil, fmt.Errorf("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []byte(s), nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		return []byte(strings.Join(strs, "")), nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return encodeTokenIDs(nil, ids)
	}
	var batches [][]int64
	if err := json.Unmarshal(raw, &batches); err == nil {
		var out []byte
		for _, ids := range batches {
			var err error
			if out, err = encodeTokenIDs(out, ids); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("prompt must be a string, an array of strings, an array of token ids, or an array of token-id arrays")
}

// encodeTokenIDs appends each id as exactly bytesPerToken bytes, so that
// tokenCount gives one token per id and equal id sequences share blocks.
func encodeTokenIDs(dst []byte, ids []int64) ([]byte, error) {
	for _, id := range ids {
		if id < 0 || id > 1<<32-1 {
			return nil, fmt.Errorf("token id %d is out of range", id)
		}
		dst = binary.LittleEndian.AppendUint32(dst, uint32(id))
	}
	return dst, nil
}
