package raftnode

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// raft's "failed to contact" warning carries a duration named "time"; in a
// JSON log it must not shadow the record's timestamp, nor may raft fields
// named like the other record keys.
func TestHCLogRenamesReservedKeys(t *testing.T) {
	var buf bytes.Buffer
	a := newHCLogAdapter(slog.New(slog.NewJSONHandler(&buf, nil)), "raft")
	args := []any{"server-id", "n2", "time", 501037670 * time.Nanosecond, "msg", "y"}
	a.Named("replication").With("level", "x", "source", "z").Warn("failed to contact", args...)
	if args[2] != "time" {
		t.Fatalf("caller's args modified: %v", args)
	}
	line := strings.TrimSpace(buf.String())
	// Decode into raw fields: a duplicate key would make one value win
	// silently, so count the occurrences in the text too.
	for _, k := range []string{"time", "level", "msg", "source"} {
		if n := strings.Count(line, `"`+k+`":`); n > 1 {
			t.Errorf("key %q appears %d times: %s", k, n, line)
		}
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("not JSON: %v: %s", err, line)
	}
	if ts, _ := rec["time"].(string); ts == "" {
		t.Errorf("time = %v, want the record's timestamp", rec["time"])
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("time = %q is not a timestamp: %v", ts, err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "failed to contact" {
		t.Errorf("level/msg = %v/%v", rec["level"], rec["msg"])
	}
	want := map[string]any{"raft_time": float64(501037670), "raft_level": "x", "raft_msg": "y", "raft_source": "z", "server-id": "n2", "component": "raft.replication"}
	for k, v := range want {
		if got := rec[k]; got != v {
			t.Errorf("%s = %v, want %v (line %s)", k, got, v, line)
		}
	}
}
