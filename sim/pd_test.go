package sim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func pdPair(t *testing.T, hold float64) (pre, dec *Server, pts, dts *httptest.Server) {
	t.Helper()
	pre, pts = startReplica(t, Config{Name: "p", Role: RolePrefill, BlockTokens: 4, KVHoldSecs: hold})
	dec, dts = startReplica(t, Config{Name: "d", Role: RoleDecode, BlockTokens: 4})
	return pre, dec, pts, dts
}

func prefillBody(prompt string) map[string]any {
	return map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
}

// runPrefill sends a prefill leg and returns the kv_transfer_params of its
// answer, raw.
func runPrefill(t *testing.T, ts *httptest.Server, prompt, requestID string) json.RawMessage {
	t.Helper()
	resp, body := mustPost(t, ts, "/v1/completions", prefillBody(prompt), "X-Request-Id", requestID)
	if resp.StatusCode != 200 {
		t.Fatalf("prefill leg: %d %s", resp.StatusCode, body)
	}
	var out struct {
		KV      json.RawMessage `json:"kv_transfer_params"`
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &out); err != nil || len(out.KV) == 0 {
		t.Fatalf("prefill answer %s: %v", body, err)
	}
	return out.KV
}

func decodeBody(prompt string, kv json.RawMessage) map[string]any {
	return map[string]any{"model": "m", "prompt": prompt, "max_tokens": 3, "stream": false, "kv_transfer_params": kv}
}

// A prefill leg hands out its blocks once: the decode leg that names them
// exactly pulls them, and is not charged a prefill; pulling again, or with
// other parameters, fails and is recomputed on the decode replica.
func TestPrefillDecodeProtocol(t *testing.T) {
	pre, dec, preURL, decURL := pdPair(t, 0)
	prompt := strings.Repeat("abcd", 40) // 40 tokens, 10 blocks
	kv := runPrefill(t, preURL, prompt, "req-1")
	var p kvParams
	if err := json.Unmarshal(kv, &p); err != nil || !p.DoRemotePrefill || p.DoRemoteDecode || len(p.RemoteBlockIDs) != 10 || p.RemoteHost == nil || p.RemotePort == nil {
		t.Fatalf("kv_transfer_params %s (%v)", kv, err)
	}
	if st := pre.Stats(); st.PD.TransfersPending != 1 || st.PD.PrefillLegs != 1 || st.PromptTokens != 40 {
		t.Fatalf("prefill stats %+v %+v", st, st.PD)
	}
	resp, body := mustPost(t, decURL, "/v1/completions", decodeBody(prompt, kv), "X-Request-Id", "req-1")
	if resp.StatusCode != 200 || resp.Header.Get(HeaderCachedTokens) != "40" {
		t.Fatalf("decode leg: %d cached %s %s", resp.StatusCode, resp.Header.Get(HeaderCachedTokens), body)
	}
	if st := pre.Stats().PD; st.TransfersPending != 0 || st.TransfersClaimed != 1 {
		t.Fatalf("after the pull: %+v", st)
	}
	if st := dec.Stats(); st.PD.DecodeLegs != 1 || st.PD.PullFailures != 0 || st.PD.TransferredTokens != 40 || st.PromptTokens != 0 {
		t.Fatalf("decode stats %+v %+v", st, st.PD)
	}

	// The same parameters again: pulled already.
	mustPost(t, decURL, "/v1/completions", decodeBody(prompt, kv), "X-Request-Id", "req-1")
	// Altered block ids, or another request id: not what was handed out.
	kv2 := runPrefill(t, preURL, prompt+"more", "req-2")
	var p2 kvParams
	_ = json.Unmarshal(kv2, &p2)
	p2.RemoteBlockIDs[1]++
	altered, _ := json.Marshal(p2)
	mustPost(t, decURL, "/v1/completions", decodeBody(prompt+"more", altered), "X-Request-Id", "req-2")
	mustPost(t, decURL, "/v1/completions", decodeBody(prompt+"more", kv2), "X-Request-Id", "not-req-2")
	if st := dec.Stats(); st.PD.PullFailures != 3 || st.PromptTokens == 0 {
		t.Fatalf("decode stats after three bad pulls %+v %+v", st, st.PD)
	}
	if st := pre.Stats().PD; st.TransfersPending != 1 || st.TransfersClaimed != 1 {
		t.Fatalf("a bad pull released the blocks: %+v", st)
	}
}

// Blocks nobody pulls are released after the hold time.
func TestUnclaimedTransferExpires(t *testing.T) {
	pre, _, preURL, _ := pdPair(t, 0.05)
	runPrefill(t, preURL, strings.Repeat("x", 64), "r")
	if st := pre.Stats().PD; st.TransfersPending != 1 {
		t.Fatalf("%+v", st)
	}
	deadline := time.Now().Add(5 * time.Second)
	for pre.Stats().PD.TransfersPending != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := pre.Stats().PD; st.TransfersPending != 0 || st.TransfersExpired != 1 {
		t.Fatalf("after the hold time: %+v", st)
	}
}

// A prefill leg is never streamed; a replica without a role ignores the
// field, as a vLLM without a KV connector, and answers without it.
func TestPrefillLegRules(t *testing.T) {
	_, _, preURL, _ := pdPair(t, 0)
	b := prefillBody("hello")
	b["stream"] = true
	if resp, body := mustPost(t, preURL, "/v1/completions", b); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("streamed prefill: %d %s", resp.StatusCode, body)
	}
	_, plain := startReplica(t, Config{Name: "plain"})
	resp, body := mustPost(t, plain, "/v1/completions", prefillBody("hello"))
	if resp.StatusCode != 200 || strings.Contains(string(body), "kv_transfer_params") {
		t.Fatalf("plain replica: %d %s", resp.StatusCode, body)
	}
	if err := (Config{Role: "both"}).Validate(); err == nil {
		t.Fatal(`role "both" accepted`)
	}
}

// Held blocks live in the KV cache: past Config.CacheTokens the oldest
// transfer is dropped (counted as expired), and its pull fails while the
// newer ones succeed.
func TestHeldTransfersFitTheCache(t *testing.T) {
	pre, pts := startReplica(t, Config{Name: "p", Role: RolePrefill, BlockTokens: 4, CacheTokens: 80})
	dec, dts := startReplica(t, Config{Name: "d", Role: RoleDecode, BlockTokens: 4})
	var kvs []json.RawMessage
	prompts := []string{strings.Repeat("a", 160), strings.Repeat("b", 160), strings.Repeat("c", 160)} // 40 tokens each
	for i, p := range prompts {
		kvs = append(kvs, runPrefill(t, pts, p, string(rune('0'+i))))
	}
	if st := pre.Stats().PD; st.TransfersPending != 2 || st.TransfersExpired != 1 {
		t.Fatalf("three 40-token transfers in an 80-token cache: %+v", st)
	}
	for i, p := range prompts {
		mustPost(t, dts, "/v1/completions", decodeBody(p, kvs[i]), "X-Request-Id", string(rune('0'+i)))
	}
	if st := dec.Stats().PD; st.PullFailures != 1 || st.TransferredTokens != 80 {
		t.Fatalf("pulls: %+v, want the oldest one failed and the two others pulled", st)
	}
	if st := pre.Stats().PD; st.TransfersPending != 0 || st.TransfersClaimed != 2 {
		t.Fatalf("after the pulls: %+v", st)
	}
}

// The order of held transfers stays proportional to what is held, however
// many are claimed out of order, and the held token count matches.
func TestHeldTransferBookkeeping(t *testing.T) {
	d := newPDState("x", 0)
	now := time.Now()
	for i := range 10_000 {
		k := int64(i + 1)
		d.holdLocked(&transfer{blocks: []int64{k}, tokens: 4, expires: now.Add(time.Hour)})
		if i%10 != 0 {
			d.claimLocked(k) // most are pulled at once; every tenth waits
		}
	}
	if len(d.pending) != 1000 || d.held != 4000 || len(d.order) > 2*len(d.pending)+64 {
		t.Fatalf("pending %d, held %d tokens, order %d keys", len(d.pending), d.held, len(d.order))
	}
	// A claimed key at the front is passed over, not taken for an expired
	// one: nothing is due yet.
	k := int64(20_000)
	d.holdLocked(&transfer{blocks: []int64{k}, tokens: 4, expires: now.Add(time.Hour)})
	d.order = append([]int64{k}, d.order[:len(d.order)-1]...) // at the front, as if handed out first
	d.claimLocked(k)
	d.expireLocked(now)
	if len(d.pending) != 1000 || d.expired.Load() != 0 || d.held != 4000 {
		t.Fatalf("before the hold ran out: pending %d, expired %d, held %d", len(d.pending), d.expired.Load(), d.held)
	}
	d.expireLocked(now.Add(2 * time.Hour))
	if len(d.pending) != 0 || d.held != 0 || len(d.order) != 0 || d.expired.Load() != 1000 {
		t.Fatalf("after the hold: pending %d, held %d, order %d, expired %d", len(d.pending), d.held, len(d.order), d.expired.Load())
	}
}
