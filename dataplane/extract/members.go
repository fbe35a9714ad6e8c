package extract

import (
	"bytes"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/cartrouter/cart/dataplane/apierr"
)

// Member is a top-level member RewriteMembers sets.
type Member struct {
	Name  string
	Value []byte // JSON
	// IfPresent sets it only when the body has a member of that name
	// (vLLM's proxies set max_completion_tokens only where it was sent).
	IfPresent bool
}

// RewriteMembers returns body, a JSON object, without its top-level
// members named in drop or set (every spelling: names are matched as the
// engine matches them, exactly and after unescaping), followed by set's
// members in order. Every other member keeps its bytes and its order. It
// is how the proxy builds the two legs of a split request from the
// client's body (kv_transfer_params, stream, max_tokens...).
func RewriteMembers(body []byte, set []Member, drop ...string) ([]byte, error) {
	// Checked whole first: the member walk below then only has to find
	// where each top-level member ends.
	if !jsontext.Value(body).IsValid(compactOpts) {
		return nil, apierr.BadRequest(codeInvalidJSON, "", "The request body is not valid JSON.")
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return nil, apierr.BadRequest(codeInvalidJSON, "", "The request body is not a JSON object.")
	}
	named := func(k []byte) int {
		for j, m := range set {
			if isKey(k, m.Name) {
				return j
			}
		}
		for _, d := range drop {
			if isKey(k, d) {
				return len(set)
			}
		}
		return -1
	}
	var present []bool
	grow := 0
	for _, m := range set {
		grow += len(m.Name) + len(m.Value) + 4
	}
	out := make([]byte, 1, len(body)+grow)
	out[0] = '{'
	for i = skipSpace(body, i+1); body[i] != '}'; i = skipSpace(body, i) {
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
		keyEnd := stringEnd(body, i)
		valEnd := valueEnd(body, skipSpace(body, skipSpace(body, keyEnd)+1)) // past the ':'
		if j := named(body[i:keyEnd]); j >= 0 {
			if j < len(set) {
				if present == nil {
					present = make([]bool, len(set))
				}
				present[j] = true
			}
		} else {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, bytes.TrimRight(body[i:valEnd], " \t\r\n")...)
		}
		i = valEnd
	}
	for j, m := range set {
		if m.IfPresent && (present == nil || !present[j]) {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out, _ = jsontext.AppendQuote(out, m.Name) // invalid UTF-8 (no name here has any) becomes U+FFFD
		out = append(out, ':')
		out = append(out, m.Value...)
	}
	return append(out, '}'), nil
}
