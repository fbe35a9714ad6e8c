package config

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with the configuration. File and Line are empty
// and 0 when the offending value came from a default or the location is not
// known (for example a YAML syntax error the parser could not place).
type Problem struct {
	File   string
	Line   int
	Key    string
	Reason string

	// cause keeps an underlying error (e.g. fs.ErrNotExist) reachable
	// through errors.Is/As on the enclosing Problems.
	cause error
}

// String formats the problem as "file:line: key: reason", leaving out the
// parts that are unknown.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
	} else if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Reason)
	return b.String()
}

// Problems collects every problem found in one pass, so a user fixing a
// config sees them all at once instead of one per attempt.
//
// Load and Validate return a *Problems as their error. The pointer (rather
// than the slice itself) is the error type because a slice inside an error
// interface panics when compared with ==. Use errors.As with a
// **Problems target to inspect the list.
type Problems []Problem

// Error lists every problem, one per line.
func (ps *Problems) Error() string {
	if ps == nil || len(*ps) == 0 {
		return "config: no problems"
	}
	lines := make([]string, len(*ps))
	for i, p := range *ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap exposes underlying causes such as I/O errors, so callers can still
// use errors.Is(err, fs.ErrNotExist).
func (ps *Problems) Unwrap() []error {
	if ps == nil {
		return nil
	}
	var errs []error
	for _, p := range *ps {
		if p.cause != nil {
			errs = append(errs, p.cause)
		}
	}
	return errs
}

// asError returns nil for an empty list so callers never return a non-nil
// error interface holding an empty *Problems.
func (ps Problems) asError() error {
	if len(ps) == 0 {
		return nil
	}
	return &ps
}

// At makes a problem of err against key, with the file and line that set
// key: for the checks the roles make at start, outside this package.
func (c *Config) At(key string, err error) Problem {
	file, line := c.Origin(key)
	return Problem{File: file, Line: line, Key: key, Reason: err.Error(), cause: err}
}

// Err returns ps as an error, nil when it is empty.
func (ps Problems) Err() error { return ps.asError() }
