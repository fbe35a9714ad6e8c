// Package apierr renders errors in the OpenAI error shape, which every
// OpenAI-compatible client (and the Anthropic SDK, loosely) knows how to show:
//
//	{"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
package apierr

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Error is an API error with the HTTP status it maps to.
type Error struct {
	Status  int    // HTTP status code
	Type    string // OpenAI error type, e.g. invalid_request_error
	Code    string // machine-readable code, e.g. body_too_large
	Param   string // offending request field, if any
	Message string // human-readable explanation
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
	Code    string  `json:"code"`
}

// JSON returns the OpenAI-shaped body for e.
func (e *Error) JSON() []byte {
	b := body{Error: bodyError{Message: e.Message, Type: e.Type, Code: e.Code}}
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
	var e *Error
	if !errors.As(err, &e) {
		e = New(http.StatusInternalServerError, TypeServer, "internal_error", "%s", err.Error())
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.JSON())
}
