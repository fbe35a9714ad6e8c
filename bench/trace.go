// Package bench is CART's load generator and benchmark orchestrator.
//
// It replays Mooncake-format request traces and synthetic workloads against an
// OpenAI-compatible endpoint (open loop, streaming chat completions), measures
// TTFT, latency, cache hits and load balance per request, computes the oracle
// hit ratio of one pool-sized LRU cache, and (in suite.go) runs the same
// workload against several router set-ups in turn.
package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// TraceRecord is one request of a Mooncake-format trace.
type TraceRecord struct {
	// Timestamp is the arrival time in milliseconds since the trace start.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int `json:"input_length"`
	// OutputLength is the response length in tokens.
	OutputLength int `json:"output_length"`
	// HashIDs are prefix-chained ids of 512-token blocks.
	HashIDs []int64 `json:"hash_ids"`
	// Group and Prompt are set by the generated shared-prefix traces.
	Group  *int `json:"group,omitempty"`
	Prompt *int `json:"prompt,omitempty"`
}

// ParseTrace reads a JSON Lines trace. Blank lines are skipped; any other
// malformed line is an error naming its line number.
func ParseTrace(r io.Reader) ([]TraceRecord, error) {
	var out []TraceRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if rec.InputLength < 0 || rec.OutputLength < 0 || rec.Timestamp < 0 {
			return nil, fmt.Errorf("line %d: negative timestamp or length", line)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if len(out) == 0 {
		return nil, errors.New("trace has no requests")
	}
	return out, nil
}

// LoadTrace parses the trace file at path.
func LoadTrace(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	recs, err := ParseTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// SliceTrace returns limit records starting at start (limit <= 0: all the
// rest). Timestamps are rebased so that the slice starts at 0.
func SliceTrace(recs []TraceRecord, start, limit int) []TraceRecord {
	if start < 0 {
		start = 0
	}
	if start >= len(recs) {
		return nil
	}
	end := len(recs)
	if limit > 0 && start+limit < end {
		end = start + limit
	}
	out := make([]TraceRecord, end-start)
	copy(out, recs[start:end])
	base := out[0].Timestamp
	for _, r := range out {
		base = min(base, r.Timestamp)
	}
	for i := range out {
		out[i].Timestamp -= base
	}
	return out
}
