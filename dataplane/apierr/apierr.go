// Package apierr renders errors in the OpenAI error shape (and, for the
// Anthropic Messages API, in Anthropic's), which every
// OpenAI-compatible client (and the Anthropic SDK, loosely) knows how to show:
//
//	{"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
package apierr

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error is an API error with the HTTP status it maps to.
type Error struct {
	Status  int    // HTTP status code
	Type    string // OpenAI error type, e.g. invalid_request_error
	Code    string // machine-readable code, e.g. body_too_large
	Param   string // offending request field, if any
	Message string // human-readable explanation
	// NumericCode sends Status as the "code", a number, instead of Code:
	// what vLLM's own errors carry, for answers that must read exactly as
	// the engine's.
	NumericCode bool
}

func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s: %s (param %s)", e.Status, e.Code, e.Message, e.Param)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// Type names used by OpenAI.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
	TypeAuthentication = "authentication_error"
	// TypeRateLimit: a 429, the request was not served and may be retried
	// after Retry-After.
	TypeRateLimit = "rate_limit_error"
)

// BadRequest is a 400 invalid_request_error about param.
func BadRequest(code, param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// New builds an error with an explicit status.
func New(status int, typ, code, format string, args ...any) *Error {
	return &Error{Status: status, Type: typ, Code: code, Message: fmt.Sprintf(format, args...)}
}

type body struct {
	Error bodyError `json:"error"`
}

type bodyError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"` // a string, or the status for NumericCode
}

// JSON returns the OpenAI-shaped body for e.
func (e *Error) JSON() []byte {
	b := body{Error: bodyError{Message: e.Message, Type: e.Type, Code: e.Code}}
	if e.NumericCode {
		b.Error.Code = e.Status
	}
	if e.Param != "" {
		p := e.Param
		b.Error.Param = &p
	}
	out, _ := json.Marshal(b) // cannot fail: only strings
	return out
}

// Write sends err to w. A non-*Error becomes a 500 server_error so that
// internal details never decide the status code by accident.
func Write(w http.ResponseWriter, err error) {
	e := asError(err)
	writeBody(w, e.Status, e.JSON())
}

// writeBody sends an error body; nosniff keeps a browser from rendering
// a message that echoes client input as anything but JSON.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Anthropic error types, by the HTTP status the Messages API uses them with.
const (
	AnthropicInvalidRequest = "invalid_request_error"
	AnthropicAuthentication = "authentication_error"
	AnthropicPermission     = "permission_error"
	AnthropicNotFound       = "not_found_error"
	AnthropicTooLarge       = "request_too_large"
	AnthropicRateLimit      = "rate_limit_error"
	AnthropicAPI            = "api_error"
	AnthropicOverloaded     = "overloaded_error"
)

// AnthropicType maps a status to the error type the Anthropic API would
// send with it, which is what Anthropic SDKs turn into their typed errors.
func AnthropicType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return AnthropicInvalidRequest
	case http.StatusUnauthorized:
		return AnthropicAuthentication
	case http.StatusForbidden:
		return AnthropicPermission
	case http.StatusNotFound:
		return AnthropicNotFound
	case http.StatusRequestEntityTooLarge:
		return AnthropicTooLarge
	case http.StatusTooManyRequests:
		return AnthropicRateLimit
	case http.StatusServiceUnavailable, 529:
		return AnthropicOverloaded
	}
	if status >= 500 {
		return AnthropicAPI
	}
	return AnthropicInvalidRequest
}

type anthropicBody struct {
	Type  string             `json:"type"`
	Error anthropicBodyError `json:"error"`
}

type anthropicBodyError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// AnthropicJSON returns the Anthropic-shaped body for e:
//
//	{"type": "error", "error": {"type": "...", "message": "..."}}
func (e *Error) AnthropicJSON() []byte {
	out, _ := json.Marshal(anthropicBody{Type: "error", Error: anthropicBodyError{Type: AnthropicType(e.Status), Message: e.Message}})
	return out
}

// IsAnthropicPath reports whether path belongs to the Anthropic Messages
// API, whose clients expect its error shape rather than OpenAI's.
func IsAnthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// WriteFor sends err in the error shape of the API r was addressed to:
// Anthropic's for /v1/messages, OpenAI's everywhere else.
func WriteFor(w http.ResponseWriter, r *http.Request, err error) {
	if r != nil && IsAnthropicPath(r.URL.Path) {
		WriteAnthropic(w, err)
		return
	}
	Write(w, err)
}

// WriteAnthropic is Write in the Anthropic error shape.
func WriteAnthropic(w http.ResponseWriter, err error) {
	e := asError(err)
	writeBody(w, e.Status, e.AnthropicJSON())
}

func asError(err error) *Error {
	var e *Error
	if !errors.As(err, &e) {
		e = New(http.StatusInternalServerError, TypeServer, "internal_error", "%s", err.Error())
	}
	return e
}
