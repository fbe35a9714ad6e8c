package sim

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiStyle selects the error body shape a client of an endpoint expects.
type apiStyle int

const (
	styleOpenAI apiStyle = iota
	styleAnthropic
)

// apiError is an error answered to an API client.
type apiError struct {
	status  int
	message string
	param   string // OpenAI only: offending request field
	// typ overrides the OpenAI "type" derived from status, and code, when
	// non-zero, is sent as the numeric "code": vLLM's own errors carry both
	// (e.g. "NotFoundError" with code 404), and clients match on them.
	typ  string
	code int
}

// notFound is a 404 in vLLM's shape: its error type and the status as a
// numeric code.
func notFound(message, typ, param string) *apiError {
	return &apiError{status: http.StatusNotFound, message: message, param: param, typ: typ, code: http.StatusNotFound}
}

// badRequest is a 400 about param ("" when no single field is to blame).
func badRequest(message, param string) *apiError {
	return &apiError{status: http.StatusBadRequest, message: message, param: param}
}

// openAIErrorType maps a status to the error "type" OpenAI uses for it.
func openAIErrorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

// anthropicErrorType maps a status to Anthropic's documented error types,
// which its SDK surfaces to callers.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// write sends e in the given style.
func (e *apiError) write(w http.ResponseWriter, style apiStyle) {
	var body any
	switch style {
	case styleAnthropic:
		body = map[string]any{
			"type": "error",
			"error": map[string]any{
				"type":    anthropicErrorType(e.status),
				"message": e.message,
			},
		}
	default:
		var param, code any // JSON null unless known, as OpenAI sends
		if e.param != "" {
			param = e.param
		}
		if e.status >= 500 {
			code = strconv.Itoa(e.status)
		}
		if e.code != 0 {
			code = e.code
		}
		typ := e.typ
		if typ == "" {
			typ = openAIErrorType(e.status)
		}
		body = map[string]any{
			"error": map[string]any{
				"message": e.message,
				"type":    typ,
				"param":   param,
				"code":    code,
			},
		}
	}
	writeJSON(w, e.status, body)
}

// writeJSON sends v as a complete JSON response with a Content-Length, so
// clients never see a chunked non-streaming body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own response types reach here; failing to encode one is
		// a programming error that should be loud in tests.
		panic("sim: encoding response: " + err.Error())
	}
	writeRawJSON(w, status, b)
}

// writeRawJSON writes an encoded JSON body.
func writeRawJSON(w http.ResponseWriter, status int, b []byte) {
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // a failed write means the client left; nothing to do
}
