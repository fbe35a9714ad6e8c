package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/metrics"
	"github.com/cartrouter/cart/dataplane/router"
)

// ---- prefill/decode disaggregation -------------------------------------------
//
// A request on a split endpoint (DisaggOptions.Endpoints) asks the router
// for a pair (router.Request.Disagg). In a pool with prefill and decode
// workers the decision names both (Decision.Prefill), and the proxy runs
// vLLM's NIXL protocol itself, as vLLM's example proxies do:
//
//  1. prefill leg: the client's body with kv_transfer_params
//     {do_remote_decode: true, do_remote_prefill: false, the rest null},
//     max_tokens 1 (and max_completion_tokens, max_output_tokens where the
//     endpoint has them), stream false, the stream options and min_tokens
//     dropped, sent to the prefill worker; its JSON answer is read whole
//     (at most maxPrefillAnswer bytes) for the kv_transfer_params it
//     returns (do_remote_prefill true, remote_engine_id, remote_block_ids,
//     remote_host, remote_port...) and its usage;
//  2. decode leg: the client's body with exactly those kv_transfer_params
//     (their bytes as the prefill worker sent them), sent to the decode
//     worker, whose answer streams to the client as any answer does.
//
// Each leg is an attempt of its own (attempt.go): its own worker, breaker,
// in-flight gauge and settlement, so the prefill worker's load is given
// back as soon as its leg ends and the decode worker's when the stream
// does. Failures stay within the retry loop and its budget:
//   - a prefill leg that fails (refused, a retryable answer, an answer
//     without kv_transfer_params) is retried with that prefill worker
//     excluded: another prefill worker, or whole on a `both` worker when
//     none is left (the engine's rules); an answer that is not retryable
//     (a 400 for a prompt too long) goes to the client as it is;
//   - a decode leg that fails before any byte reached the client is retried
//     on another decode worker with the same kv_transfer_params only when
//     the first decode worker provably never took them (the connection was
//     refused, or it answered a retryable status): a decode worker that
//     may have pulled the KV cache may also have released it on the
//     prefill worker, and reading released blocks again would read other
//     requests' KV. Otherwise the retry runs a new pair (or whole).
//
// A prefill whose decode leg is never sent leaves no load or placement
// behind in CART (both tickets are settled), but its KV blocks stay
// reserved on the prefill engine: vLLM's NIXL connector keeps a finished
// prefill's blocks until a decode worker reads them or
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s by default) passes, and offers no
// API to release them sooner. cart-sim models that timeout.
//
// In sidecar mode (llm-d's convention) the routing sidecar on the decode
// worker runs the legs: the request goes to the decode worker with
// X-Prefiller-Host-Port naming the prefill worker, and the prefill leg is
// settled when the decode worker's answer starts (the sidecar finished
// the prefill before it started decoding).
//
// In a split pool CART owns kv_transfer_params: a client's own is dropped
// from every request that could have been split (it could point a decode
// engine at any host, or at another request's blocks), and the legs carry
// CART's.

// HeaderPrefillerHostPort tells llm-d's routing sidecar on a decode worker
// which prefill worker runs the prefill leg. A client's is never passed on.
const HeaderPrefillerHostPort = "X-Prefiller-Host-Port"

// HeaderRoutedPrefillPeer names a split request's prefill worker in the
// answer, beside X-Routed-Peer (proxy.add_routed_peer_header).
const HeaderRoutedPrefillPeer = "X-Routed-Prefill-Peer"

func init() {
	requestReplaced[HeaderPrefillerHostPort] = true
}

// kvTransferParams is the request field of vLLM's KV connectors.
const kvTransferParams = "kv_transfer_params"

// maxPrefillAnswer bounds the prefill answer read: one token, its usage
// and the transfer parameters (a block id list grows with the prompt:
// ~40 KB at 100k tokens and 16-token blocks), or prompt logprobs if the
// client asked for them.
const maxPrefillAnswer = 4 << 20

// prefillParams are the kv_transfer_params of a prefill leg.
var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// DisaggOptions configure how the proxy runs split requests
// (disaggregation.*).
type DisaggOptions struct {
	// Sidecar: llm-d's routing sidecar on the decode worker runs the two
	// legs (X-Prefiller-Host-Port); else CART runs them itself.
	Sidecar bool
	// Endpoints are the routed endpoints whose requests may be split.
	Endpoints []extract.Endpoint
}

// pdCall is a call's prefill/decode state.
type pdCall struct {
	ep extract.Endpoint
	on bool // the call may be split
	// kv are the kv_transfer_params of a prefill whose decode leg has not
	// reached a worker yet (a retry sends them to another decode worker),
	// and decode the body carrying them.
	kv, decode []byte
	// prefill is the prefill leg's body; stripped the body of a whole or
	// sidecar request, without the client's kv_transfer_params. Built
	// once each, when needed.
	prefill, stripped []byte
}

// leg says which part of a split request an attempt is.
type leg uint8

const (
	legWhole   leg = iota
	legPrefill     // the prefill leg: its answer is read, not delivered
	legDecode      // a decode leg carrying a prefill's kv_transfer_params
)

// pdChildren are the split requests' metric children.
type pdChildren struct {
	split                             prometheus.Counter
	whole                             map[string]prometheus.Counter // by Decision.Whole
	prefill, handoff, decodeFirstByte prometheus.Observer
}

func newPDChildren(m *metrics.Metrics) pdChildren {
	c := pdChildren{split: m.PDDecisions.WithLabelValues("split"), whole: map[string]prometheus.Counter{},
		prefill: m.PDLegs.WithLabelValues("prefill"), handoff: m.PDLegs.WithLabelValues("handoff"),
		decodeFirstByte: m.PDLegs.WithLabelValues("decode_first_byte")}
	for _, w := range []string{router.WholeShortPrompt, router.WholeNoPrefill, router.WholeNoDecode} {
		c.whole[w] = m.PDDecisions.WithLabelValues(w)
	}
	return c
}

// wholeCounter is cart_pd_decisions_total's child for a whole outcome.
func (p *Proxy) wholeCounter(why string) prometheus.Counter {
	if c, ok := p.pd.whole[why]; ok {
		return c
	}
	return p.m.PDDecisions.WithLabelValues(why)
}

// preparePD marks a call that may be split. A request naming a stored
// response is not: the response lives on one worker, which serves it whole.
func (p *Proxy) preparePD(c *call, ep extract.Endpoint) {
	c.pd.ep = ep
	c.pd.on = slices.Contains(p.o.Disagg.Endpoints, ep) && c.responseID == "" && c.pin == ""
}

// disagg is what the call asks the router for.
func (d *pdCall) disagg() router.Disagg {
	switch {
	case !d.on:
		return router.DisaggNone
	case d.kv != nil:
		return router.DisaggDecode
	}
	return router.DisaggPair
}

// decide asks the router for req's decision. A decode leg that no
// decode worker can take now is given up on: the request is routed afresh,
// to be computed again, split or whole.
func (p *Proxy) decide(ctx context.Context, c *call, req *router.Request) (router.Decision, error) {
	d, err := p.o.Router.Decide(ctx, req)
	if err != nil && req.Disagg == router.DisaggDecode && errors.Is(err, router.ErrUnavailable) {
		c.pd.kv, c.pd.decode = nil, nil
		req.Disagg = router.DisaggPair
		d, err = p.o.Router.Decide(ctx, req)
	}
	return d, err
}

// splitAttempt prepares a's legs from its decision: the prefill attempt of
// a pair, the body of a decode leg or of a whole request in a split pool.
// On an error the caller settles a and a.pre.
func (p *Proxy) splitAttempt(a *attempt) (err error) {
	c, d := a.c, a.d
	if !c.pd.on {
		return nil
	}
	if d.Prefill != nil {
		a.pre = &attempt{p: p, c: c, d: *d.Prefill, n: a.n, leg: legPrefill}
	}
	switch {
	case d.Prefill != nil:
		p.pd.split.Inc()
		if p.o.Disagg.Sidecar {
			a.reqBody, err = c.pd.strippedBody(c)
		}
	case c.pd.kv != nil:
		a.reqBody, a.leg = c.pd.decode, legDecode
	case d.Whole != "":
		p.wholeCounter(d.Whole).Inc()
		a.reqBody, err = c.pd.strippedBody(c)
	}
	return err
}

// strippedBody is the call's body without the client's kv_transfer_params
// (the call's own body when it has none, or it cannot be rewritten). A
// copy counts in the in-flight body budget as the body itself does.
func (d *pdCall) strippedBody(c *call) ([]byte, error) {
	if d.stripped == nil {
		b, err := extract.RewriteMembers(c.body, nil, kvTransferParams)
		if err != nil || len(b) == len(c.body) {
			d.stripped = c.body
			return d.stripped, nil
		}
		if !c.hold.grow(int64(len(b))) {
			return nil, errBodyBudget()
		}
		d.stripped = b
	}
	return d.stripped, nil
}

// errBodyBudget is the refusal of a leg's body copy that no longer fits
// the in-flight budget: 503, as the body itself would have been.
func errBodyBudget() error {
	return apierr.New(http.StatusServiceUnavailable, apierr.TypeUnavailable, "server_busy",
		"too many request bytes are being handled at once; retry shortly (proxy.max_inflight_body_bytes)")
}

// prefillBody is the body of the call's prefill leg (package comment).
func (d *pdCall) prefillBody(c *call) ([]byte, error) {
	if d.prefill != nil {
		return d.prefill, nil
	}
	set := []extract.Member{{Name: kvTransferParams, Value: prefillParams}, {Name: "stream", Value: []byte("false")}}
	drop := []string{"stream_options", "min_tokens", "min_completion_tokens"}
	one := []byte("1")
	switch d.ep {
	case extract.Responses:
		set = append(set, extract.Member{Name: "max_output_tokens", Value: one},
			// A stored or background prefill would answer without the KV
			// parameters, or keep a one-token response nobody asks for.
			extract.Member{Name: "store", Value: []byte("false")}, extract.Member{Name: "background", Value: []byte("false")})
	case extract.ChatCompletions:
		set = append(set, extract.Member{Name: "max_tokens", Value: one}, extract.Member{Name: "max_completion_tokens", Value: one, IfPresent: true})
	default:
		set = append(set, extract.Member{Name: "max_tokens", Value: one})
	}
	b, err := extract.RewriteMembers(c.body, set, drop...)
	if err != nil {
		return nil, err
	}
	if !c.hold.grow(int64(len(b))) {
		return nil, errBodyBudget()
	}
	d.prefill = b
	return b, nil
}

// runPrefill runs the prefill leg of a's split decision. done: resp or
// err is the attempt's outcome (the prefill leg failed or answered what
// the client gets); else a is ready to send its decode leg.
func (a *attempt) runPrefill(ctx context.Context) (resp *http.Response, err error, done bool) {
	p, c, pa := a.p, a.c, a.pre
	fail := func(resp *http.Response, err error) (*http.Response, error, bool) {
		a.settle(undelivered) // the decode worker was never sent anything
		a.blame = pa.d.Worker
		return resp, err, true
	}
	if pa.reqBody, err = c.pd.prefillBody(c); err != nil {
		pa.settle(undelivered)
		return fail(nil, err)
	}
	start := p.o.Now()
	resp, err = pa.send(ctx)
	if err != nil {
		return fail(nil, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Not retryable (send held those): the worker's own answer, a 400
		// for a prompt too long, is the client's.
		return fail(pa.deliver(resp), nil)
	}
	kv, u, err := readPrefill(pa, resp)
	if err != nil {
		p.o.Breakers.Failure(pa.d.Worker, p.o.Now())
		p.log.Warn("prefill answer unusable", "request_id", c.id, "worker", pa.d.Worker, "attempt", pa.n, "error", err.Error())
		return fail(nil, fmt.Errorf("prefill worker %s: %w", pa.d.Worker, err))
	}
	pa.settle(router.Outcome{Delivered: true, PromptTokens: u.prompt, CachedTokens: u.cached, CompletionTokens: u.completion})
	_ = resp.Body.Close()
	p.observeUsage(c, pa.d, pa.w, u)
	read := p.o.Now()
	p.pd.prefill.Observe(read.Sub(start).Seconds())
	decode, err := extract.RewriteMembers(c.body, []extract.Member{{Name: kvTransferParams, Value: kv}})
	if err != nil {
		return fail(nil, err)
	}
	if !c.hold.grow(int64(len(decode))) {
		return fail(nil, errBodyBudget())
	}
	c.pd.kv, c.pd.decode = kv, decode
	a.reqBody, a.leg, a.handoff = decode, legDecode, read
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("prefill leg done", "request_id", c.id, "prefill_worker", pa.d.Worker, "decode_worker", a.d.Worker,
			"prefill_ms", read.Sub(start).Milliseconds(), "prompt_tokens", u.prompt, "cached_tokens", u.cached)
	}
	return nil, nil, false
}

// readPrefill reads a prefill leg's answer: its kv_transfer_params, which
// must be a JSON object, as the worker wrote them (the top-level member
// as Python reads it: exact name, the last of duplicates), and its usage.
// The read is bounded in size, and in time by the stream idle timeout.
func readPrefill(pa *attempt, resp *http.Response) (kv []byte, u usage, err error) {
	if idle := pa.p.o.StreamIdleTimeout; idle > 0 {
		t := time.AfterFunc(idle, pa.cancel)
		defer t.Stop()
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	if err != nil {
		_ = resp.Body.Close()
		return nil, usage{}, fmt.Errorf("reading its answer: %w", err)
	}
	u = bodyUsage(body)
	if len(body) > maxPrefillAnswer {
		err = fmt.Errorf("its answer is over %d bytes", maxPrefillAnswer)
	} else {
		kv, err = kvParams(body)
	}
	if err != nil {
		// It computed the prompt all the same: the placement stays.
		pa.settle(router.Outcome{Delivered: true, PromptTokens: u.prompt, CachedTokens: u.cached})
		_ = resp.Body.Close()
	}
	return kv, u, err
}

// kvParams extracts the top-level kv_transfer_params of a prefill answer.
func kvParams(body []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("its answer is not a JSON object: %w", err)
	}
	kv := bytes.TrimSpace(top[kvTransferParams])
	if len(kv) == 0 || kv[0] != '{' {
		return nil, errors.New("its answer has no kv_transfer_params object: is it a vLLM engine with a KV connector (--kv-transfer-config)?")
	}
	return kv, nil
}

// bodyUsage reads a whole answer's usage as a streamed one's is read.
func bodyUsage(b []byte) usage {
	t := trackedBody{head: b[:min(len(b), sniffHead)], tail: b[max(0, len(b)-sniffTail):]}
	return t.usage()
}

// legHeaders gives the legs of a split request the headers they need on
// top of the call's: a prefill leg asks for an answer it can read (no
// content coding: the client's Accept-Encoding is for the decode leg), a
// sidecar request names its prefill worker. own reports that h is the
// request's own copy already.
func (a *attempt) legHeaders(h http.Header, own bool) http.Header {
	sidecar := a.pre != nil && a.p.o.Disagg.Sidecar
	if a.leg != legPrefill && !sidecar {
		return h
	}
	if !own {
		h = h.Clone()
	}
	if a.leg == legPrefill {
		h.Del("Accept-Encoding")
	}
	if sidecar {
		h.Set(HeaderPrefillerHostPort, hostPort(a.pre.d.Worker))
	}
	return h
}

// hostPort is a worker URL's host:port, the port the scheme's default
// when the URL has none.
func hostPort(worker string) string {
	u, err := url.Parse(worker)
	if err != nil {
		return worker
	}
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// sidecarDone settles a sidecar request's prefill leg when its decode
// worker answered (or failed): the sidecar ran the prefill before it
// started the decode.
func (a *attempt) sidecarDone(err error, rejected bool) {
	if a.pre == nil || !a.p.o.Disagg.Sidecar {
		return
	}
	delivered := err == nil && !rejected || err != nil && !neverSent(err)
	a.pre.settle(router.Outcome{Delivered: delivered, PromptTokens: -1, CachedTokens: -1})
}

// decodeFailed forgets the kv_transfer_params of a decode leg whose worker
// may have taken them (package comment): the retry computes the prompt
// again.
func (a *attempt) decodeFailed(mayHaveTaken bool) {
	if a.leg == legDecode && mayHaveTaken {
		a.c.pd.kv, a.c.pd.decode = nil, nil
	}
}

// failedWorker is the worker a failed attempt is put down to: its
// prefill worker when that leg failed.
func (a *attempt) failedWorker() string {
	if a.blame != "" {
		return a.blame
	}
	return a.d.Worker
}

// delivered finishes a delivered answer of a split request: the prefill
// worker named beside X-Routed-Peer (a worker's own value never passes),
// the decode leg's first byte timed.
func (a *attempt) delivered(resp *http.Response) *http.Response {
	p := a.p
	if p.o.AddRoutedPeerHeader && a.pre != nil {
		resp.Header.Set(HeaderRoutedPrefillPeer, a.pre.d.Worker)
	} else {
		resp.Header.Del(HeaderRoutedPrefillPeer)
	}
	if a.leg != legDecode {
		return resp
	}
	if !a.handoff.IsZero() {
		p.pd.handoff.Observe(a.sent.Sub(a.handoff).Seconds())
	}
	resp.Body = &firstByte{ReadCloser: resp.Body, at: func() {
		p.pd.decodeFirstByte.Observe(p.o.Now().Sub(a.sent).Seconds())
	}}
	return resp
}

// firstByte calls at when the first bytes are read.
type firstByte struct {
	io.ReadCloser
	at   func()
	seen bool
}

func (f *firstByte) Read(b []byte) (int, error) {
	n, err := f.ReadCloser.Read(b)
	if n > 0 && !f.seen {
		f.seen = true
		f.at()
	}
	return n, err
}
