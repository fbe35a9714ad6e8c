package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

var sampleWorkers = &cartv1.ListWorkersResponse{
	Workers: []*cartv1.Worker{
		{Url: "http://10.0.0.5:8000", MaxLoad: 32, LoadPenalty: 2, CacheCapacityTokens: 1000000, Healthy: true, Load: 7},
		{Url: "http://10.0.0.6:8000", Source: "dns", Draining: true, Role: "prefill"},
	},
	WorkersVersion: 12,
}

var sampleStatus = &cartv1.ClusterStatusResponse{
	NodeId: "n1", State: "leader", LeaderId: "n1", LeaderUrl: "http://10.0.0.1:6701",
	Term: 3, CommitIndex: 120, AppliedIndex: 119, LastLogIndex: 121,
	Members: []*cartv1.Member{
		{Id: "n1", RaftAddress: "10.0.0.1:6702", ApiUrl: "http://10.0.0.1:6701", Suffrage: "voter", Leader: true},
		{Id: "n2", RaftAddress: "10.0.0.2:6702", Suffrage: "nonvoter"},
	},
	Workers: 2, HealthyWorkers: 1, IndexEntries: 4096, Dataplanes: 3, IndexEvictions: 5000, IndexSkippedInserts: 120,
}

var sampleRoute = &cartv1.RouteResponse{
	Worker: "http://10.0.0.5:8000", Reason: "cache_hit", MatchedChars: 128, MatchedRatio: 0.8,
	DecisionMicros: 42, FromLeader: true, Candidate: "http://10.0.0.5:8000", ChosenChars: 128, LeaderId: "n1",
}

func TestEngineCacheText(t *testing.T) {
	for _, c := range []struct {
		k    *cartv1.KVCache
		want string
	}{
		{nil, "-"},
		{&cartv1.KVCache{OccupiedTokens: 512}, "512/?"},
		{&cartv1.KVCache{OccupiedTokens: 96000, CapacityTokens: 102400}, "96000/102400"},
	} {
		if got := engineCacheText(c.k); got != c.want {
			t.Errorf("engineCacheText(%v) = %q, want %q", c.k, got, c.want)
		}
	}
}

func TestOutputGolden(t *testing.T) {
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
		want  string
	}{
		{"workers table", func(b *bytes.Buffer) error { return writeWorkersTable(b, sampleWorkers) }, `URL                   HEALTHY  LOAD  MAX_LOAD   PENALTY  CAPACITY  ENGINE_CACHE  SOURCE          ROLE
http://10.0.0.5:8000  yes      7     32         2        1000000   -             static          both
http://10.0.0.6:8000  no       0     unlimited  0        default   -             dns (draining)  prefill

2 worker(s), workers version 12; CAPACITY is in tokens; ENGINE_CACHE is occupied/size tokens from the engine's KV events (- without)
`},
		{"workers json", func(b *bytes.Buffer) error { return writeJSON(b, sampleWorkers) }, `{
  "workers": [
    {
      "url": "http://10.0.0.5:8000",
      "max_load": 32,
      "load_penalty": 2,
      "cache_capacity_tokens": "1000000",
      "healthy": true,
      "load": 7,
      "predicted_cached_tokens": "0",
      "actual_cached_tokens": "0",
      "cache_misses": "0",
      "model_capacity_blocks": 0,
      "source": "",
      "draining": false,
      "models": [],
      "kv_cache": null,
      "max_concurrency": 0,
      "concurrency_limit": 0,
      "role": ""
    },
    {
      "url": "http://10.0.0.6:8000",
      "max_load": 0,
      "load_penalty": 0,
      "cache_capacity_tokens": "0",
      "healthy": false,
      "load": 0,
      "predicted_cached_tokens": "0",
      "actual_cached_tokens": "0",
      "cache_misses": "0",
      "model_capacity_blocks": 0,
      "source": "dns",
      "draining": true,
      "models": [],
      "kv_cache": null,
      "max_concurrency": 0,
      "concurrency_limit": 0,
      "role": "prefill"
    }
  ],
  "workers_version": "12"
}
`},
		{"empty workers json", func(b *bytes.Buffer) error { return writeJSON(b, &cartv1.ListWorkersResponse{}) }, `{
  "workers": [],
  "workers_version": "0"
}
`},
		{"cluster status table", func(b *bytes.Buffer) error { return writeClusterStatus(b, sampleStatus) }, `node:            n1
state:           leader
leader:          n1 at http://10.0.0.1:6701
term:            3
commit index:    120
applied index:   119
last log index:  121
workers:         1 healthy of 2
index entries:   4096 (5000 evicted since start)
index skipped:   120 new blocks not recorded: the index was full before an eviction pass made room (raise cache.max_tree_size)
data planes:     3

ID  RAFT ADDRESS   API URL               SUFFRAGE  LEADER
n1  10.0.0.1:6702  http://10.0.0.1:6701  voter     yes
n2  10.0.0.2:6702  -                     nonvoter  no
`},
		{"cluster status without leader", func(b *bytes.Buffer) error {
			return writeClusterStatus(b, &cartv1.ClusterStatusResponse{NodeId: "n3", State: "candidate", Term: 9})
		}, `node:            n3
state:           candidate
leader:          none (no quorum reachable from this node)
term:            9
commit index:    0
applied index:   0
last log index:  0
workers:         0 healthy of 0
index entries:   0 (0 evicted since start)
data planes:     0

ID  RAFT ADDRESS  API URL  SUFFRAGE  LEADER
`},
		{"route table", func(b *bytes.Buffer) error { return writeRoute(b, sampleRoute, 160, "") }, `worker:        http://10.0.0.5:8000
reason:        cache_hit
matched:       128 of 160 chars (ratio 0.80)
candidate:     http://10.0.0.5:8000
chosen chars:  128
decision:      42µs
from leader:   yes
leader id:     n1
`},
		{"route table explained", func(b *bytes.Buffer) error {
			return writeRoute(b, &cartv1.RouteResponse{Worker: "http://w2", Reason: "empty_text", FromLeader: true, LeaderId: "n1"}, 0,
				explain(&cartv1.RouteResponse{Worker: "http://w2", Reason: "empty_text"}, 0))
		}, `worker:        http://w2
reason:        empty_text
matched:       0 of 0 chars (ratio 0.00)
candidate:     -
chosen chars:  0
decision:      0µs
from leader:   yes
leader id:     n1

why: empty text: there was no key text to match on, so the least-loaded worker
was chosen. The least-loaded worker was http://w2.
`},
		{"route table of a pair", func(b *bytes.Buffer) error {
			return writeRoute(b, &cartv1.RouteResponse{Worker: "http://d1", Reason: "pd", MatchedChars: 128, MatchedRatio: 0.8, FromLeader: true, LeaderId: "n1",
				Prefill: &cartv1.PrefillLeg{Worker: "http://p1", Reason: "cache_hit", MatchedChars: 128, MatchedRatio: 0.8, ChosenChars: 128}}, 160, "")
		}, `worker:        http://d1
prefill:       http://p1 (cache_hit, holds 128 chars)
reason:        pd
matched:       128 of 160 chars (ratio 0.80)
candidate:     -
chosen chars:  0
decision:      0µs
from leader:   yes
leader id:     n1
`},
		{"route json explained", func(b *bytes.Buffer) error { return writeRouteJSON(b, sampleRoute, "because") }, `{
  "worker": "http://10.0.0.5:8000",
  "reason": "cache_hit",
  "matched_chars": 128,
  "matched_ratio": 0.8,
  "decision_micros": "42",
  "from_leader": true,
  "candidate": "http://10.0.0.5:8000",
  "chosen_chars": 128,
  "ticket": "0",
  "leader_id": "n1",
  "pinned": false,
  "leader_url": "",
  "avoid_ignored": false,
  "worker_source": "",
  "queued": false,
  "waited_micros": "0",
  "queue_depth": 0,
  "prefill": null,
  "whole": "",
  "explanation": "because"
}
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tt.write(&b); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tt.want {
				t.Errorf("output mismatch\n--- got\n%s--- want\n%s", got, tt.want)
			}
			if strings.HasPrefix(tt.want, "{") && !json.Valid(b.Bytes()) {
				t.Errorf("output is not valid JSON")
			}
		})
	}
}

func TestExplain(t *testing.T) {
	tests := []struct {
		name string
		resp *cartv1.RouteResponse
		want []string // substrings, in order
	}{
		{"cache hit", sampleRoute, []string{"cache hit: ", "http://10.0.0.5:8000 holds the longest cached prefix", "matched 128 of 160 chars",
			"ratio 0.80 ≥ cache.threshold", "within the balance rule"}},
		{"cache miss, nothing cached", &cartv1.RouteResponse{Worker: "http://w2", Reason: "cache_miss"},
			[]string{"cache miss: ", "No worker holds any prefix", "0 of 160 chars", "least-loaded worker, http://w2"}},
		{"cache miss, short match", &cartv1.RouteResponse{Worker: "http://w2", Reason: "cache_miss", MatchedChars: 16, MatchedRatio: 0.1},
			[]string{"cache miss: ", "matched only 16 of 160 chars (ratio 0.10)", "below both cache.threshold", "http://w2"}},
		{"hit overloaded", &cartv1.RouteResponse{Worker: "http://w2", Reason: "hit_overloaded", Candidate: "http://w1", MatchedChars: 128, MatchedRatio: 0.8, ChosenChars: 64},
			[]string{"overloaded: ", "Candidate http://w1 holds 128 of 160 chars", "too busy", "least-loaded worker, http://w2, won", "holds 64 chars"}},
		{"empty text", &cartv1.RouteResponse{Worker: "http://w2", Reason: "empty_text"}, []string{"empty text: ", "http://w2"}},
		{"unknown reason", &cartv1.RouteResponse{Worker: "http://w2", Reason: "session_affinity"}, []string{`reason "session_affinity"`, "does not know"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := explain(tt.resp, 160)
			rest := got
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("explanation %q lacks %q (in order)", got, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestWrap(t *testing.T) {
	tests := []struct {
		in    string
		width int
		want  string
	}{
		{"", 10, ""},
		{"one two three", 7, "one two\nthree"},
		{"averyveryverylongword x", 5, "averyveryverylongword\nx"},
		{"a  b\n c", 80, "a b c"},
	}
	for _, tt := range tests {
		if got := wrap(tt.in, tt.width); got != tt.want {
			t.Errorf("wrap(%q, %d) = %q, want %q", tt.in, tt.width, got, tt.want)
		}
	}
}
