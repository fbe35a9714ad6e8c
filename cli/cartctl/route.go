package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/cartrouter/cart/controlplane/cpclient"
	"github.com/cartrouter/cart/controlplane/engine"
	"github.com/cartrouter/cart/dataplane/extract"
	cartv1 "github.com/cartrouter/cart/gen/cart/v1"
)

// maxTextBytes is the control plane's request size limit. Longer text
// could never be routed, so it is refused before it is sent rather than
// after it is uploaded.
const maxTextBytes = cpclient.MaxMessageBytes

type routeFlags struct {
	text     string
	textFile string
	body     string
	endpoint string
	model    string
	exclude  []string
	explain  bool
	whole    bool
}

func (a *app) routeCmd() *cobra.Command {
	var f routeFlags
	cmd := &cobra.Command{
		Use:   "route (--text TEXT | --text-file PATH | --body PATH)",
		Short: "Ask where the control plane would route a prompt (dry run)",
		Long: withExitCodes(`Ask the control plane which worker it would choose for a request whose
key text is TEXT, and why. This is always a dry run: the control plane
decides exactly as for live traffic but takes no load and records no
placement, so it is safe to run against production.

TEXT is the key text a data plane extracts from a request (for chat
completions, the rendered messages). --model must be the request's model
name, because it seeds the prefix hash chain: the same text under another
model matches nothing. --text - or --text-file - read the text from stdin,
byte for byte (a trailing newline is part of the text).

--body takes a whole request body instead (a JSON file, or - for stdin), as
a client would send it to --endpoint: cartctl extracts the key text with the
data plane's own code, and takes the model from the body unless --model is
given, so the answer is exactly what that request would get.

In a pool with prefill and decode workers the request is asked as one
that may be split (as data planes ask for the endpoints of
disaggregation.endpoints): the answer names the prefill worker and the
decode worker, or says why the request would go whole. --whole asks for a
whole decision instead.

--explain adds a plain-English account of the rule that fired. With -o json
the output is the RouteResponse message, plus an "explanation" field with
--explain.`),
		Example: `  cartctl route --model llama-3-8b --text "You are a helpful assistant." --explain
  cartctl route --model llama-3-8b --text-file prompt.txt --exclude http://10.0.0.5:8000
  cartctl route --endpoint chat_completions --body request.json --explain`,
		Args: checkArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			text, err := f.readText(cmd, a.stdin)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("body") {
				ep, ok := extract.EndpointForName(f.endpoint)
				if !ok {
					return usagef("--endpoint must be one of %s with --body", endpointNames())
				}
				req, err := extract.Extract(ep, []byte(text))
				if err != nil {
					return usagef("body: %v", err)
				}
				text = string(req.Key)
				if !cmd.Flags().Changed("model") {
					f.model = req.Model
				}
			}
			return a.withSession(cmd, func(ctx context.Context, s *session) error {
				req := &cartv1.RouteRequest{
					Endpoint:       f.endpoint,
					Model:          f.model,
					Text:           text,
					ExcludeWorkers: f.exclude,
					DryRun:         true,
					Disaggregation: cartv1.Disaggregation_DISAGGREGATION_PAIR,
				}
				if f.whole {
					req.Disaggregation = cartv1.Disaggregation_DISAGGREGATION_UNSPECIFIED
				}
				resp, err := call(ctx, s.cp, func(ctx context.Context, e endpoint) (*connect.Response[cartv1.RouteResponse], error) {
					return e.router.Route(ctx, connect.NewRequest(req))
				})
				if err != nil {
					return err
				}
				var why string
				if f.explain {
					why = explain(resp, len(text))
				}
				if s.output == outputJSON {
					return writeRouteJSON(s.out, resp, why)
				}
				return writeRoute(s.out, resp, len(text), why)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.text, "text", "", `key text to route ("-" reads stdin)`)
	fl.StringVar(&f.textFile, "text-file", "", `read the key text from this file ("-" for stdin)`)
	fl.StringVar(&f.body, "body", "", `a request body (JSON file, "-" for stdin) to extract the key text from, as a data plane would`)
	fl.StringVar(&f.endpoint, "endpoint", "chat_completions", "endpoint the request would arrive on: "+endpointNames())
	fl.StringVar(&f.model, "model", "", "model name of the request (seeds the prefix hashes)")
	fl.StringArrayVar(&f.exclude, "exclude", nil, "worker URL the request must not go to (repeatable)")
	fl.BoolVar(&f.explain, "explain", false, "explain the routing rule that fired")
	fl.BoolVar(&f.whole, "whole", false, "ask for a whole decision (no prefill/decode split)")
	return cmd
}

// readText returns the key text from exactly one of --text and
// --text-file. An explicitly empty --text is allowed: it shows what
// happens to requests with no key text.
func (f *routeFlags) readText(cmd *cobra.Command, stdin io.Reader) (string, error) {
	hasText, hasFile := cmd.Flags().Changed("text"), cmd.Flags().Changed("text-file")
	if cmd.Flags().Changed("body") {
		if hasText || hasFile {
			return "", usagef("give --body or --text/--text-file, not both")
		}
		hasFile, f.textFile = true, f.body
	}
	var r io.Reader
	switch {
	case hasText && hasFile:
		return "", usagef("give --text or --text-file, not both")
	case !hasText && !hasFile:
		return "", usagef("give the key text with --text or --text-file, or a request with --body")
	case hasText && f.text != "-":
		if len(f.text) > maxTextBytes {
			return "", usagef("text is %d bytes; the control plane accepts at most %d", len(f.text), maxTextBytes)
		}
		return f.text, nil
	case hasText || f.textFile == "-":
		r = stdin
	default:
		file, err := os.Open(f.textFile)
		if err != nil {
			return "", usagef("text file: %v", err)
		}
		defer file.Close()
		r = file
	}
	data, err := io.ReadAll(io.LimitReader(r, maxTextBytes+1))
	if err != nil {
		return "", fmt.Errorf("read text: %w", err)
	}
	if len(data) > maxTextBytes {
		return "", usagef("text is longer than the %d bytes the control plane accepts", maxTextBytes)
	}
	return string(data), nil
}

func writeRoute(w io.Writer, r *cartv1.RouteResponse, keyLen int, why string) error {
	tw := newTable(w)
	candidate := r.GetCandidate()
	if candidate == "" {
		candidate = "-"
	}
	if r.GetQueued() {
		fmt.Fprintf(tw, "worker:\t- (pool saturated: a live request would wait)\n")
		fmt.Fprintf(tw, "queue:\t%d waiting\n", r.GetQueueDepth())
	} else {
		fmt.Fprintf(tw, "worker:\t%s\n", r.GetWorker())
	}
	if p := r.GetPrefill(); p != nil {
		fmt.Fprintf(tw, "prefill:\t%s (%s, holds %d chars)\n", p.GetWorker(), p.GetReason(), p.GetChosenChars())
	}
	if wh := r.GetWhole(); wh != "" {
		fmt.Fprintf(tw, "whole:\t%s\n", wh)
	}
	fmt.Fprintf(tw, "reason:\t%s\n", r.GetReason())
	fmt.Fprintf(tw, "matched:\t%d of %d chars (ratio %.2f)\n", r.GetMatchedChars(), keyLen, r.GetMatchedRatio())
	fmt.Fprintf(tw, "candidate:\t%s\n", candidate)
	fmt.Fprintf(tw, "chosen chars:\t%d\n", r.GetChosenChars())
	fmt.Fprintf(tw, "decision:\t%dµs\n", r.GetDecisionMicros())
	fmt.Fprintf(tw, "from leader:\t%s\n", yesNo(r.GetFromLeader()))
	fmt.Fprintf(tw, "leader id:\t%s\n", r.GetLeaderId())
	if err := tw.Flush(); err != nil {
		return err
	}
	if why == "" {
		return nil
	}
	_, err := fmt.Fprintf(w, "\n%s\n", wrap("why: "+why, 78))
	return err
}

// writeRouteJSON writes the RouteResponse, with the explanation added as
// one more top-level field when there is one.
func writeRouteJSON(w io.Writer, r *cartv1.RouteResponse, why string) error {
	b, err := marshalJSON(r)
	if err != nil {
		return err
	}
	if why != "" {
		q, err := json.Marshal(why)
		if err != nil {
			return err
		}
		// b is an indented object ending in "\n}\n" with at least one
		// field (EmitUnpopulated), so the field goes before the brace.
		end := bytes.LastIndexByte(b, '}')
		b = append(b[:end-1], []byte(",\n  \"explanation\": "+string(q)+"\n}\n")...)
	}
	_, err = w.Write(b)
	return err
}

// explain describes in plain English the rule behind a decision. keyLen is
// the key text length in bytes, which is what the control plane counts.
// The thresholds are named by their config keys: the response does not
// carry their values.
func explain(r *cartv1.RouteResponse, keyLen int) string {
	if r.GetQueued() {
		return fmt.Sprintf("Every worker this request may use is saturated: its in-flight requests reached its limit (the "+
			"least of max_load and its engine's concurrency, declared as max_concurrency or learned from the engine's "+
			"metrics). A live request would wait in the leader's flow-control queue, behind the %d requests waiting now "+
			"(in priority, then token-fair, then deadline order), until a worker has room and then go to the cache-aware "+
			"choice among those with room; after flow.queue_timeout_secs it is answered 429. A sheddable one (priority "+
			"below 0) is refused at once.", r.GetQueueDepth())
	}
	meaning, ok := engine.Reason(r.GetReason()).Meaning()
	if !ok {
		return fmt.Sprintf("the control plane gave reason %q, which this cartctl does not know; it may be older than the "+
			"control plane.", r.GetReason())
	}
	if d := explainDetail(r, keyLen); d != "" {
		return meaning + ". " + d
	}
	return meaning + "."
}

// explainDetail fills in the numbers and config keys behind a reason's
// registered meaning; TestExplainEveryReason makes sure no registered
// reason is left without one.
func explainDetail(r *cartv1.RouteResponse, keyLen int) string {
	worker, n, ratio := r.GetWorker(), r.GetMatchedChars(), r.GetMatchedRatio()
	switch engine.Reason(r.GetReason()) {
	case engine.ReasonCacheHit:
		return fmt.Sprintf("%s holds the longest cached prefix of this text: it matched %d of %d chars "+
			"(ratio %.2f ≥ cache.threshold, or %d chars ≥ cache.match_abs_threshold), and its load is within the "+
			"balance rule (at most cache.balance_abs_threshold above the least-loaded worker's, or at most "+
			"cache.balance_rel_threshold times it, load_penalty included), so the request goes where its prefix is "+
			"already in the KV cache.", worker, n, keyLen, ratio, n)
	case engine.ReasonCacheMiss:
		if n == 0 {
			return fmt.Sprintf("No worker holds any prefix of this text (0 of %d chars matched), so the "+
				"least-loaded worker, %s, was chosen.", keyLen, worker)
		}
		return fmt.Sprintf("The best cached prefix matched only %d of %d chars (ratio %.2f), below both "+
			"cache.threshold and cache.match_abs_threshold, so affinity is not worth it and the least-loaded worker, "+
			"%s, was chosen.", n, keyLen, ratio, worker)
	case engine.ReasonHitOverloaded:
		return fmt.Sprintf("Candidate %s holds %d of %d chars (ratio %.2f), but it was "+
			"too busy: its load (load_penalty included) exceeds the least-loaded worker's by more than "+
			"cache.balance_abs_threshold and is more than cache.balance_rel_threshold times it, so the least-loaded "+
			"worker, %s, won (it holds %d chars of this text).", r.GetCandidate(), n, keyLen, ratio, worker, r.GetChosenChars())
	case engine.ReasonEmptyText:
		return fmt.Sprintf("The least-loaded worker was %s.", worker)
	case engine.ReasonSessionHit:
		return fmt.Sprintf("%s served this request's session within session.ttl_secs and its load is within "+
			"the balance rule, so the session stays where its conversation is cached, whatever the prefix match "+
			"(%d of %d chars here).", worker, n, keyLen)
	case engine.ReasonPD:
		p := r.GetPrefill()
		if p == nil {
			return fmt.Sprintf("%s decodes; the answer names no prefill worker (a decode leg sent again after its first decode worker refused it).", worker)
		}
		pre := explainDetail(&cartv1.RouteResponse{Worker: p.GetWorker(), Reason: p.GetReason(), MatchedChars: p.GetMatchedChars(),
			MatchedRatio: p.GetMatchedRatio(), Candidate: p.GetCandidate(), ChosenChars: p.GetChosenChars()}, keyLen)
		return fmt.Sprintf("Prefill on %s, chosen among the prefill workers as any request is (%s): %s Decode on %s, the "+
			"least-loaded decode worker with room. Each takes a unit of load of its own; the prefix is recorded on the "+
			"prefill worker. Below disaggregation.threshold_tokens uncached prompt tokens, or with no prefill or no decode "+
			"worker able to take it, the request would go whole instead.", p.GetWorker(), p.GetReason(), pre, worker)
	case engine.ReasonFallbackLocal:
		return fmt.Sprintf("A data plane records this when it cannot reach the control plane and picks %s by its own "+
			"in-flight counts and shadow index; the control plane itself never answers with it.", worker)
	}
	return ""
}

// wrap breaks s into lines of at most width columns at spaces (a longer
// word gets a line of its own).
func wrap(s string, width int) string {
	var b strings.Builder
	col := 0
	for i, word := range strings.Fields(s) {
		n := len([]rune(word))
		switch {
		case i == 0:
		case col+1+n > width:
			b.WriteByte('\n')
			col = 0
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += n
	}
	return b.String()
}

// endpointNames lists the routed endpoints' names, from extract's table.
func endpointNames() string {
	var names []string
	for _, ep := range extract.Endpoints() {
		names = append(names, ep.String())
	}
	return strings.Join(names, ", ")
}
