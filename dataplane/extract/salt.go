package extract

import (
	"bytes"
	"net/http"
	"strconv"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// CacheSaltField is the request field vLLM isolates its prefix cache by:
// requests with different salts share no cached block.
const CacheSaltField = "cache_salt"

// SetCacheSalt returns body, a JSON object, with its top-level cache_salt
// member set to salt: every member named cache_salt is dropped and one is
// added at the end. Every other member keeps its bytes and its order. The
// name is matched as the engine matches it, exactly and after unescaping
// (Python's json.loads turns "cache\u005fsalt" into cache_salt too), so no
// spelling of the field the client chose survives next to CART's; the
// routed endpoints' bodies hold no case variant of it either (the scan
// before extraction refuses those). Key text and policy checks are
// unaffected: cache_salt is no part of either.
func SetCacheSalt(body []byte, salt string) ([]byte, error) {
	// Invalid UTF-8 (never in CART's base64 salts) becomes U+FFFD.
	q, _ := jsontext.AppendQuote(nil, salt)
	return setMember(body, CacheSaltField, q)
}

// PriorityField is vLLM's request priority: under --scheduling-policy
// priority, lower values run first.
const PriorityField = "priority"

// SetPriority returns body with its top-level priority member set to p,
// as SetCacheSalt sets cache_salt (flow.engine_priority: the engine's own
// scheduler then orders its queue as CART does).
func SetPriority(body []byte, p int) ([]byte, error) {
	return setMember(body, PriorityField, strconv.AppendInt(nil, int64(p), 10))
}

// PriorityHonored reports whether vLLM reads priority on e: chat
// completions, completions and responses; not its Messages endpoint.
func PriorityHonored(e Endpoint) bool { return e != Messages }

// setMember returns body, a JSON object, with its top-level member name
// set to the JSON value v: every member of that name (after unescaping) is
// dropped and one added at the end; every other member keeps its bytes
// and order.
func setMember(body []byte, name string, v []byte) ([]byte, error) {
	return RewriteMembers(body, []Member{{Name: name, Value: v}})
}

// The walk below runs on valid JSON only (RewriteMembers checks it first).

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string starting at b[i].
func stringEnd(b []byte, i int) int {
	for i++; b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++
		}
	}
	return i + 1
}

// valueEnd returns the index just past the value starting at b[i]: a
// scalar ends before the ',' or '}' that follows it (whitespace included).
func valueEnd(b []byte, i int) int {
	depth := 0
	for ; ; i++ {
		switch b[i] {
		case '"':
			i = stringEnd(b, i) - 1
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',':
			if depth == 0 {
				return i
			}
		}
	}
}

// isKey reports whether the quoted key k is name once unescaped.
func isKey(k []byte, name string) bool {
	raw := k[1 : len(k)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == name
	}
	key, err := jsontext.AppendUnquote(nil, k)
	return err == nil && string(key) == name
}

// ErrCacheSaltUnsupported refuses a request whose cache must be isolated
// on an endpoint where vLLM ignores cache_salt.
func ErrCacheSaltUnsupported(e Endpoint) error {
	return &apierr.Error{Status: http.StatusBadRequest, Type: apierr.TypeInvalidRequest, Code: "cache_isolation_unsupported",
		Message: "this API key's prefix cache is isolated from other tenants (auth.client_keys[].isolate_cache), and vLLM ignores cache_salt on " +
			e.Path() + ", so the isolation could not be kept: send the request to /v1/chat/completions instead"}
}

// SaltHonored reports whether vLLM reads cache_salt on e: chat
// completions, completions and responses declare it; its Anthropic
// Messages request model has no such field (and drops what it does not
// know), so a salt sent there isolates nothing.
func SaltHonored(e Endpoint) bool {
	return e != Messages
}
