package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/internal/every"
)

// ---- prefill/decode disaggregation (vLLM's NIXL connector) ---------------------
//
// With Config.Role set ("prefill" or "decode") the replica speaks the
// protocol vLLM's NIXL KV connector speaks (either role serves both sides,
// as a vLLM instance with kv_role kv_both does; the role names it):
//
//   - a request whose kv_transfer_params has do_remote_decode true is a
//     prefill leg: the prompt is computed (and cached) as any request's,
//     max_tokens (1) are generated, and the answer, never streamed, carries
//     kv_transfer_params {do_remote_prefill: true, do_remote_decode: false,
//     remote_engine_id, remote_block_ids, remote_host, remote_port,
//     tp_size}. The blocks are held for a decode replica to pull, until it
//     does or Config.KVHoldSecs pass (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
//     480 s by default), whatever happens to the request that would have
//     pulled them, or until held blocks outgrow Config.CacheTokens (they
//     live in the KV cache), when the oldest transfer is dropped.
//     remote_host:remote_port is the address the prefill leg reached this
//     replica at (its Host header).
//   - a request whose kv_transfer_params has do_remote_prefill true is a
//     decode leg: the replica pulls the named blocks from the prefill
//     replica (POST /sim/kv/pull there, with the request's X-Request-Id,
//     which the proxy sends on both legs), which checks that engine, block
//     ids and request id are exactly those it handed out; the transfer
//     takes KVTransferMs + KVTransferUsPerToken per token not already
//     cached here, during which the request holds a batch slot but no
//     prefill slot (vLLM's WAITING_FOR_REMOTE_KVS); then it decodes as
//     any request. A pull that fails (the prefill replica is gone, or the
//     parameters are not the ones it handed out) is recomputed here, as
//     vLLM's kv_load_failure_policy "recompute" does, and counted.
//
// A decode leg's usage reports the whole prompt as cached (the pulled
// tokens were not computed here), as vLLM counts external tokens; its
// prompt and cached tokens are not added to the replica's prefill
// counters, which stay what this replica computed.

// Replica roles.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// DefaultKVHoldSecs is vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
const DefaultKVHoldSecs = 480

// pathKVPull is where decode replicas pull a prefill's blocks.
const pathKVPull = "/sim/kv/pull"

// kvField is vLLM's request field, embedded in every generation request.
type kvField struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

func (k *kvField) kvParams() json.RawMessage { return k.KVTransferParams }

// kvParams is kv_transfer_params as vLLM's NIXL connector reads it.
type kvParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          int     `json:"tp_size"`
}

// transfer is a finished prefill's blocks, held for a decode replica.
type transfer struct {
	requestID string
	blocks    []int64
	tokens    int
	expires   time.Time
}

// pdState is a replica's side of the protocol.
type pdState struct {
	engineID string
	client   *http.Client

	mu        sync.Mutex
	pending   map[int64]*transfer // by first block id
	order     []int64             // pending's keys as handed out (also expiry order: one hold time); claimed ones are skipped
	held      int                 // tokens in pending
	maxHeld   int                 // Config.CacheTokens: held blocks live in KV memory; 0 is no bound but maxPending
	nextBlock int64

	prefills, decodes, claimed, expired, pullFailures, transferred atomic.Int64
}

// maxPending bounds the transfers held at once, whatever the cache size:
// past it the oldest is dropped (counted as expired), as a full KV cache
// would have to.
const maxPending = 100_000

func newPDState(name string, cacheTokens int) *pdState {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return &pdState{
		// A restarted replica is another engine: it cannot honour the
		// blocks its predecessor handed out.
		engineID: name + "-" + hex.EncodeToString(b[:]),
		client:   &http.Client{Timeout: 10 * time.Second},
		pending:  map[int64]*transfer{},
		maxHeld:  cacheTokens,
	}
}

// readKV reads a generation request's kv_transfer_params into j. Without
// a role the field is ignored, as by a vLLM without a KV connector.
func (s *Server) readKV(j *job, raw json.RawMessage) *apiError {
	if s.cfg.Role == "" || len(raw) == 0 || bytes.Equal(raw, jsonNull) {
		return nil
	}
	var p kvParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return badRequest("kv_transfer_params: "+err.Error(), "kv_transfer_params")
	}
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return badRequest("kv_transfer_params: do_remote_decode and do_remote_prefill are both set", "kv_transfer_params")
	case p.DoRemoteDecode:
		if j.stream {
			return badRequest("Prefill does not support streaming", "stream")
		}
		j.remoteDecode = true
	case p.DoRemotePrefill:
		if p.RemoteEngineID == nil || p.RemoteHost == nil || p.RemotePort == nil {
			return badRequest("kv_transfer_params: do_remote_prefill needs remote_engine_id, remote_host and remote_port", "kv_transfer_params")
		}
		j.pull = &p
	}
	return nil
}

// holdTransfer holds a finished prefill's full blocks for a decode replica
// and returns the kv_transfer_params that name them. host is the address
// the prefill leg reached this replica at.
func (s *Server) holdTransfer(j *job, host string) json.RawMessage {
	d := s.pd
	n := j.promptTokens / s.cfg.BlockTokens
	now := time.Now()
	d.mu.Lock()
	d.expireLocked(now)
	blocks := make([]int64, n)
	for i := range blocks {
		d.nextBlock++
		blocks[i] = d.nextBlock
	}
	if n > 0 {
		// A prompt shorter than a block has nothing to pull: vLLM frees
		// it at once and the decode replica computes those tokens.
		t := &transfer{requestID: j.requestID, blocks: blocks, tokens: n * s.cfg.BlockTokens,
			expires: now.Add(time.Duration(s.cfg.KVHoldSecs * float64(time.Second)))}
		d.holdLocked(t)
	}
	d.mu.Unlock()
	d.prefills.Add(1)
	h, portStr, err := net.SplitHostPort(host)
	port, _ := strconv.Atoi(portStr)
	if err != nil {
		h, port = host, 80
	}
	out := kvParams{DoRemotePrefill: true, RemoteEngineID: &d.engineID, RemoteBlockIDs: blocks, RemoteHost: &h, RemotePort: &port, TPSize: 1}
	b, _ := json.Marshal(out) // our own type
	return b
}

// holdLocked keeps t for a decode replica to pull, dropping the oldest
// transfers past the bounds (the newest stays). d.mu held.
func (d *pdState) holdLocked(t *transfer) {
	d.pending[t.blocks[0]] = t
	d.order = append(d.order, t.blocks[0])
	d.held += t.tokens
	for len(d.pending) > maxPending || d.maxHeld > 0 && d.held > d.maxHeld && len(d.pending) > 1 {
		d.dropOldestLocked()
	}
}

// expireLocked drops transfers nobody pulled in time: the oldest first,
// so only those that expire are looked at. d.mu held.
func (d *pdState) expireLocked(now time.Time) {
	for len(d.order) > 0 {
		t := d.pending[d.order[0]]
		switch {
		case t == nil: // claimed
			d.order = d.order[1:]
		case now.After(t.expires):
			d.dropOldestLocked()
		default:
			return
		}
	}
}

// dropOldestLocked drops the transfer handed out first that is still held
// (a claimed one's key is only skipped). d.mu held.
func (d *pdState) dropOldestLocked() {
	for len(d.order) > 0 {
		k := d.order[0]
		d.order = d.order[1:]
		if t := d.pending[k]; t != nil {
			delete(d.pending, k)
			d.held -= t.tokens
			d.expired.Add(1)
			return
		}
	}
}

// claimLocked hands a transfer over to the decode replica that pulled it.
// d.mu held.
func (d *pdState) claimLocked(k int64) {
	if t := d.pending[k]; t != nil {
		delete(d.pending, k)
		d.held -= t.tokens
	}
	// Keys of claimed transfers stay in order until they reach its front;
	// compacted once they are most of it, so it stays within twice pending.
	if len(d.order) > 64 && len(d.order) > 2*len(d.pending) {
		live := d.order[:0:0]
		for _, k := range d.order {
			if d.pending[k] != nil {
				live = append(live, k)
			}
		}
		d.order = live
	}
}

// pullRequest is what a decode replica sends to pull blocks.
type pullRequest struct {
	EngineID  string  `json:"engine_id"`
	BlockIDs  []int64 `json:"block_ids"`
	RequestID string  `json:"request_id"`
}

// servePull hands held blocks to a decode replica, once.
func (s *Server) servePull(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodPost) {
		return
	}
	if s.pd == nil {
		(&apiError{status: http.StatusNotFound, message: "this replica has no KV connector (--pd-role)"}).write(w, styleOpenAI)
		return
	}
	var p pullRequest
	if aerr, err := readJSON(r.Context(), w, r, &p); aerr != nil || err != nil {
		if aerr != nil {
			aerr.write(w, styleOpenAI)
		}
		return
	}
	d := s.pd
	d.mu.Lock()
	d.expireLocked(time.Now())
	var t *transfer
	if p.EngineID == d.engineID && len(p.BlockIDs) > 0 {
		t = d.pending[p.BlockIDs[0]]
	}
	ok := t != nil && slices.Equal(t.blocks, p.BlockIDs) && (t.requestID == "" || t.requestID == p.RequestID)
	if ok {
		d.claimLocked(p.BlockIDs[0])
	}
	d.mu.Unlock()
	switch {
	case t == nil:
		(&apiError{status: http.StatusNotFound, message: "no such blocks held by engine " + d.engineID + " (never handed out, pulled already, or expired)"}).write(w, styleOpenAI)
	case !ok:
		(&apiError{status: http.StatusConflict, message: "the blocks or request id differ from those handed out"}).write(w, styleOpenAI)
	default:
		d.claimed.Add(1)
		writeJSON(w, http.StatusOK, map[string]int{"tokens": t.tokens})
	}
}

// pull fetches a decode leg's blocks from its prefill replica and returns
// how many tokens they hold.
func (s *Server) pull(ctx context.Context, j *job) (int, error) {
	p := j.pull
	if len(p.RemoteBlockIDs) == 0 {
		return 0, nil
	}
	body, _ := json.Marshal(pullRequest{EngineID: *p.RemoteEngineID, BlockIDs: p.RemoteBlockIDs, RequestID: j.requestID})
	u := "http://" + net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)) + pathKVPull
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.pd.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Tokens int `json:"tokens"`
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("pull from %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("pull from %s: %w", u, err)
	}
	return out.Tokens, nil
}

// admitRemote runs a decode leg through admission: a batch slot, the
// transfer of what is not cached here, the blocks cached. A failed pull
// is recomputed here (admit's prefill). On success the job counts as
// running until the returned func is called.
func (s *Server) admitRemote(ctx context.Context, j *job) (func(), error) {
	s.pd.decodes.Add(1)
	s.queued.Add(1)
	err := s.seqs.acquire(ctx, j.priority)
	s.queued.Add(-1)
	if err != nil {
		return nil, err
	}
	local := min(s.cache.match(j.hashes)*s.cfg.BlockTokens, j.promptTokens)
	got, err := s.pull(ctx, j)
	if err != nil {
		if ctx.Err() != nil {
			s.seqs.release()
			return nil, ctx.Err()
		}
		s.pd.pullFailures.Add(1)
		s.log.Warn("KV pull failed; recomputing the prompt here", "error", err.Error())
		s.seqs.release()
		j.pull = nil
		return s.admit(ctx, j)
	}
	s.running.Add(1)
	moved := max(min(got, j.promptTokens)-local, 0)
	err = every.Sleep(ctx, s.scaled(s.cfg.KVTransferMs*1000+float64(moved)*s.cfg.KVTransferUsPerToken, time.Microsecond))
	if err != nil {
		s.running.Add(-1)
		s.seqs.release()
		return nil, err
	}
	s.pd.transferred.Add(int64(moved))
	s.cache.insert(j.hashes, s.cacheChanged(j))
	j.cachedTokens = j.promptTokens
	return func() { s.running.Add(-1); s.seqs.release() }, nil
}

// withKV returns the JSON object body with kv_transfer_params added.
func withKV(body []byte, kv json.RawMessage) []byte {
	i := bytes.LastIndexByte(body, '}')
	if i < 0 || len(kv) == 0 {
		return body
	}
	out := append([]byte{}, body[:i]...)
	if t := bytes.TrimSpace(out); len(t) > 0 && t[len(t)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"kv_transfer_params":`...)
	out = append(out, kv...)
	return append(out, body[i:]...)
}

// PDStats is a replica's side of prefill/decode disaggregation.
type PDStats struct {
	Role string `json:"role"`
	// PrefillLegs and DecodeLegs count the requests served as either leg.
	PrefillLegs int64 `json:"prefill_legs"`
	DecodeLegs  int64 `json:"decode_legs"`
	// TransfersPending are prefills whose blocks no decode replica pulled
	// yet; Claimed were pulled, Expired given up after Config.KVHoldSecs.
	TransfersPending int64 `json:"transfers_pending"`
	TransfersClaimed int64 `json:"transfers_claimed"`
	TransfersExpired int64 `json:"transfers_expired"`
	// PullFailures are decode legs whose pull failed (recomputed here);
	// TransferredTokens the tokens pulled from prefill replicas.
	PullFailures      int64 `json:"pull_failures"`
	TransferredTokens int64 `json:"transferred_tokens"`
}

func (s *Server) pdStats() *PDStats {
	d := s.pd
	if d == nil {
		return nil
	}
	d.mu.Lock()
	d.expireLocked(time.Now())
	pending := len(d.pending)
	d.mu.Unlock()
	return &PDStats{Role: s.cfg.Role, PrefillLegs: d.prefills.Load(), DecodeLegs: d.decodes.Load(),
		TransfersPending: int64(pending), TransfersClaimed: d.claimed.Load(), TransfersExpired: d.expired.Load(),
		PullFailures: d.pullFailures.Load(), TransferredTokens: d.transferred.Load()}
}

// collectors export the protocol's counters.
func (d *pdState) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sim_kv_transfers_pending", Help: "Finished prefills whose blocks wait for a decode replica to pull them."},
			func() float64 {
				d.mu.Lock()
				defer d.mu.Unlock()
				d.expireLocked(time.Now())
				return float64(len(d.pending))
			}),
		counter("sim_kv_transfers_claimed_total", "Prefills whose blocks a decode replica pulled.", &d.claimed),
		counter("sim_kv_transfers_expired_total", "Prefills whose blocks nobody pulled within the hold time (VLLM_NIXL_ABORT_REQUEST_TIMEOUT), or dropped oldest first when held blocks outgrew the cache.", &d.expired),
		counter("sim_kv_pull_failures_total", "Decode legs whose pull failed and that were recomputed here.", &d.pullFailures),
		counter("sim_prefill_legs_total", "Requests served as prefill legs (kv_transfer_params do_remote_decode).", &d.prefills),
		counter("sim_decode_legs_total", "Requests served as decode legs (kv_transfer_params do_remote_prefill).", &d.decodes),
	}
}

// errBadRole is the Config.Role check.
var errBadRole = errors.New(`role must be "", "prefill" or "decode"`)
