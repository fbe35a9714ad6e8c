package extract

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

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
	bad := func() error {
		return apierr.BadRequest(codeInvalidJSON, "", "The request body is not a JSON object.")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, bad()
	}
	out := make([]byte, 0, len(body)+len(salt)+len(CacheSaltField)+8)
	out = append(out, '{')
	for dec.More() {
		start := dec.InputOffset() // before the separator and the key
		key, err := dec.Token()
		if err != nil {
			return nil, bad()
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, bad()
		}
		if key == CacheSaltField {
			continue
		}
		member := bytes.TrimLeft(body[start:dec.InputOffset()], " \t\r\n,")
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, member...)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, bad()
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad() // something after the object
	}
	if len(out) > 1 {
		out = append(out, ',')
	}
	q, _ := json.Marshal(salt) // a string cannot fail to encode
	out = append(out, `"`+CacheSaltField+`":`...)
	out = append(out, q...)
	return append(out, '}'), nil
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
