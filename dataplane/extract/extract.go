package extract

import (
	"net/http"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// Endpoint identifies which API a request body belongs to.
type Endpoint int

const (
	ChatCompletions Endpoint = iota + 1 // POST /v1/chat/completions
	Completions                         // POST /v1/completions
	Messages                            // POST /v1/messages (Anthropic)
	Responses                           // POST /v1/responses (OpenAI Responses API)
)

// endpoints is the one table of routed endpoints: the path the proxy
// serves (POST), the name used as metric label, in logs, traces, the
// Route RPC and cartctl. Adding an endpoint shape is a constant above, a
// row here and its walk.
var endpoints = [...]struct {
	ep          Endpoint
	path, label string
}{
	{ChatCompletions, "/v1/chat/completions", "chat_completions"},
	{Completions, "/v1/completions", "completions"},
	{Messages, "/v1/messages", "messages"},
	{Responses, "/v1/responses", "responses"},
}

// Endpoints lists every routed endpoint, in table order.
func Endpoints() []Endpoint {
	out := make([]Endpoint, len(endpoints))
	for i, e := range endpoints {
		out[i] = e.ep
	}
	return out
}

// EndpointForPath maps a request path to its endpoint. Only exact paths
// match: anything else is not a request this package understands.
func EndpointForPath(path string) (Endpoint, bool) {
	for _, e := range endpoints {
		if e.path == path {
			return e.ep, true
		}
	}
	return 0, false
}

// EndpointForName maps an endpoint's name (its String) back to it.
func EndpointForName(name string) (Endpoint, bool) {
	for _, e := range endpoints {
		if e.label == name {
			return e.ep, true
		}
	}
	return 0, false
}

// Path is the path the proxy serves the endpoint on.
func (e Endpoint) Path() string {
	for _, r := range endpoints {
		if r.ep == e {
			return r.path
		}
	}
	return ""
}

// String returns the endpoint's name: metric label, log and RPC value.
func (e Endpoint) String() string {
	for _, r := range endpoints {
		if r.ep == e {
			return r.label
		}
	}
	return "unknown"
}

// Request is what the router needs from a request body.
type Request struct {
	Model          string
	Stream         bool
	Key            []byte // key text T; empty when the prompt is empty
	RemoteMediaURL string // first URL under a media field whose scheme starts with "http", "" if none
	FileMediaURL   string // first file: URL under a media field, "" if none
	PromptCacheKey string // OpenAI prompt_cache_key
	CacheSalt      string // vLLM cache_salt: the engine shares no cache across salts
	User           string // OpenAI user, or Anthropic metadata.user_id
	IncludeUsage   bool   // stream_options.include_usage
	// PreviousResponseID is the Responses API's previous_response_id:
	// the request continues a response stored on one replica only.
	PreviousResponseID string
}

// Options change how the key text is derived.
type Options struct {
	// IgnoreSystemPrefixes leave out of the key every system block (an
	// Anthropic system string or text block; a chat system or developer
	// message's string content or text part) whose text starts with one of
	// them. A system message left with nothing leaves no record at all.
	// They are for volatile blocks the engine drops before templating, such
	// as Claude Code's per-request billing header: kept in the key, they
	// would make every request look like a new prompt.
	IgnoreSystemPrefixes []string
	// MaxItems, when > 0, refuses (400 too_many_items) a body with more
	// array items than this, counted in the walk that precedes decoding
	// (see countItem).
	MaxItems int
}

// DefaultIgnoreSystemPrefixes is what Extract and AppendKey leave out:
// Claude Code's first system block, "x-anthropic-billing-header: ...;
// cch=<per-request hash>;", which vLLM drops before templating.
var DefaultIgnoreSystemPrefixes = []string{"x-anthropic-billing-header"}

// Extract parses body for endpoint e with DefaultIgnoreSystemPrefixes.
// Problems with the body are reported as *apierr.Error with status 400 and
// Param naming the offending field.
func Extract(e Endpoint, body []byte) (*Request, error) {
	return AppendKey(nil, e, body)
}

// ExtractOptions is Extract with explicit options.
func ExtractOptions(e Endpoint, body []byte, o Options) (*Request, error) {
	return AppendKeyOptions(nil, e, body, o)
}

// maxPrealloc bounds the key buffer allocated up front. For text-only bodies
// T is close to the body size, but a body made of base64 media yields a
// tiny T, so a large body is no reason to allocate a large buffer.
const maxPrealloc = 64 << 10

// AppendKey is Extract with the key text appended to dst, so that callers
// can reuse key buffers across requests. The returned Request's Key shares
// dst's backing array when it has room.
func AppendKey(dst []byte, e Endpoint, body []byte) (*Request, error) {
	return AppendKeyOptions(dst, e, body, Options{IgnoreSystemPrefixes: DefaultIgnoreSystemPrefixes})
}

// AppendKeyOptions is AppendKey with explicit options.
func AppendKeyOptions(dst []byte, e Endpoint, body []byte, o Options) (*Request, error) {
	if cap(dst) == 0 {
		dst = make([]byte, 0, min(len(body), maxPrealloc))
	}
	media, bad, tooMany, err := scanRouted(e, body, o.MaxItems)
	if tooMany {
		// Refused before anything else: the count bounds the decode's
		// memory, whatever else is wrong with the body.
		return nil, err
	}
	if err := checkObject(body); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	b := builder{key: dst, start: len(dst), ignore: o.IgnoreSystemPrefixes}
	var req *Request
	switch e {
	case ChatCompletions:
		req, err = b.chat(body)
	case Completions:
		req, err = b.completions(body)
	case Messages:
		req, err = b.messages(body)
	case Responses:
		req, err = b.responses(body)
	default:
		// A caller bug, not a client mistake: never blame the client for it.
		return nil, apierr.New(http.StatusInternalServerError, apierr.TypeServer, "internal_error", "extract: unknown endpoint %d", int(e))
	}
	if err != nil {
		return nil, err
	}
	if bad {
		// The decoder accepted what the walker could not parse. That
		// would be a bug in the walker, and the body's media unchecked:
		// fail closed.
		return nil, apierr.BadRequest(codeInvalidJSON, "", "The request body could not be parsed.")
	}
	req.Key = b.key
	req.RemoteMediaURL, req.FileMediaURL = media.Remote, media.File
	return req, nil
}

// checkObject rejects bodies that are not a JSON object before decoding,
// because the decoder would silently accept "null" and would describe
// other non-objects in terms of Go types.
func checkObject(body []byte) error {
	switch firstByte(body) {
	case '{':
		return nil
	case 0:
		return apierr.BadRequest(codeInvalidJSON, "", "The request body is empty; expected a JSON object.")
	}
	return apierr.BadRequest(codeInvalidJSON, "", "The request body must be a JSON object.")
}
