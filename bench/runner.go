package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cartrouter/cart/internal/every"
)

// RunOptions bound and instrument a run.
type RunOptions struct {
	// Label prefixes the progress line.
	Label string
	// Concurrency caps requests in flight. It is a safety valve, not a
	// load shape: arrivals that find the cap full wait for a slot and are
	// counted as cap-delayed. <= 0 means 512.
	Concurrency int
	// RequestTimeout bounds one request; <= 0 means 5 minutes.
	RequestTimeout time.Duration
	// RunTimeout bounds the whole run, schedule and drain; requests not
	// yet sent when it expires are recorded as not sent. <= 0 means 30
	// minutes.
	RunTimeout time.Duration
	// OracleCapacityTokens is the pool's total cache capacity (0 =
	// unbounded) and BlockTokens the replicas' block size, for the oracle.
	OracleCapacityTokens int
	BlockTokens          int
	// Progress receives a progress line (nil: none). A terminal gets a
	// line rewritten at most twice a second; anything else a plain line
	// every ProgressEvery (default 10s).
	Progress      io.Writer
	ProgressEvery time.Duration
}

func (o RunOptions) withDefaults() RunOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 512
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 5 * time.Minute
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = 30 * time.Minute
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = 16
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 10 * time.Second
	}
	return o
}

// runState is shared by the dispatcher, the chats and the senders.
type runState struct {
	opts   RunOptions
	sender Sender
	start  time.Time
	sem    chan struct{}
	recs   []Record
	wg     sync.WaitGroup

	oracleMu sync.Mutex
	oracle   *Oracle

	sent, done, errs atomic.Int64
}

// Run sends the workload open loop: each request leaves at its scheduled
// time whether or not earlier ones have been answered (chats are closed
// loops within themselves but start independently). It returns one record
// per request, in workload order (open-loop requests first, then each
// chat's turns).
func Run(ctx context.Context, w *Workload, s Sender, opts RunOptions) []Record {
	opts = opts.withDefaults()
	st := &runState{
		opts:   opts,
		sender: s,
		sem:    make(chan struct{}, opts.Concurrency),
		recs:   make([]Record, w.Total()),
		oracle: NewOracle(opts.OracleCapacityTokens, opts.BlockTokens),
	}
	for i := range st.recs {
		st.recs[i] = Record{ID: i, Chat: -1, Turn: -1, Error: errNotSent}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.RunTimeout)
	defer cancel()

	var prog *progress
	if opts.Progress != nil {
		prog = newProgress(opts.Label, w.Total(), opts.Progress, opts.ProgressEvery, st)
		defer prog.stop()
	}

	st.start = time.Now()
	st.wg.Add(1)
	go func() {
		defer st.wg.Done()
		st.dispatch(ctx, w.Requests)
	}()
	next := len(w.Requests)
	for _, c := range w.Chats {
		base := next
		next += len(c.Questions)
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			st.chat(ctx, c, base)
		}()
	}
	st.wg.Wait()
	return st.recs
}

// waitUntil sleeps until at after the start, or until ctx ends.
func (st *runState) waitUntil(ctx context.Context, at time.Duration) bool {
	return every.Sleep(ctx, time.Until(st.start.Add(at))) == nil
}

// acquire takes a concurrency slot, reporting whether it had to wait.
func (st *runState) acquire(ctx context.Context) (delayed, ok bool) {
	select {
	case st.sem <- struct{}{}:
		return false, true
	default:
	}
	select {
	case st.sem <- struct{}{}:
		return true, true
	case <-ctx.Done():
		return true, false
	}
}

func (st *runState) access(msgs []Message) (prompt, cached int) {
	st.oracleMu.Lock()
	defer st.oracleMu.Unlock()
	return st.oracle.AccessMessages(msgs)
}

// dispatch sends the open-loop requests at their times. It never waits for
// a response, only (when the cap is full) for a free slot.
func (st *runState) dispatch(ctx context.Context, reqs []Request) {
	// heldUntil is when the dispatcher last got a slot after waiting for
	// one: requests due before then were held back by the cap too, even if
	// a slot happened to be free when their turn came.
	var heldUntil time.Duration
	for i := range reqs {
		r := &reqs[i]
		if !st.waitUntil(ctx, r.At) {
			return
		}
		msgs := r.Prompt()
		rec := &st.recs[i]
		rec.ScheduledMs = ms(r.At)
		delayed, ok := st.acquire(ctx)
		if delayed {
			heldUntil = time.Since(st.start)
		}
		rec.CapDelayed = delayed || r.At < heldUntil
		if !ok {
			return
		}
		rec.OraclePromptTokens, rec.OracleCachedTokens = st.access(msgs)
		st.wg.Add(1)
		go func() {
			defer st.wg.Done()
			st.send(ctx, rec, msgs, r.MaxTokens, false)
		}()
	}
}

// send performs one request (holding a slot) and fills rec.
func (st *runState) send(ctx context.Context, rec *Record, msgs []Message, maxTokens int, keep bool) Result {
	defer func() { <-st.sem }()
	rctx, cancel := context.WithTimeout(ctx, st.opts.RequestTimeout)
	defer cancel()
	rec.SentMs = ms(time.Since(st.start))
	rec.Error = ""
	st.sent.Add(1)
	res := st.sender.Send(rctx, msgs, maxTokens, keep)
	rec.Status = res.Status
	if res.Err != nil {
		rec.Error = res.Err.Error()
	}
	rec.TTFTMs, rec.E2EMs = ms(res.TTFT), ms(res.E2E)
	rec.Replica = res.Replica
	rec.PromptTokens, rec.CachedTokens, rec.CompletionTokens = res.PromptTokens, res.CachedTokens, res.CompletionTokens
	rec.UsageFrom = res.UsageFrom
	if !rec.OK() {
		st.errs.Add(1)
	}
	st.done.Add(1)
	return res
}

// chat runs one conversation: turn t+1 is due Think after turn t's answer.
func (st *runState) chat(ctx context.Context, c Chat, base int) {
	due := c.Start
	var history []Message
	if c.System != "" {
		history = append(history, Message{Role: "system", Content: c.System})
	}
	for t, q := range c.Questions {
		if !st.waitUntil(ctx, due) {
			return
		}
		history = append(history, Message{Role: "user", Content: q})
		msgs := append([]Message(nil), history...)
		rec := &st.recs[base+t]
		rec.Chat, rec.Turn, rec.ScheduledMs = c.ID, t, ms(due)
		delayed, ok := st.acquire(ctx)
		rec.CapDelayed = delayed
		if !ok {
			return
		}
		rec.OraclePromptTokens, rec.OracleCachedTokens = st.access(msgs)
		res := st.send(ctx, rec, msgs, c.MaxTokens, true)
		history = append(history, Message{Role: "assistant", Content: res.Content})
		due = time.Since(st.start) + c.Think
	}
}

// progress prints a status line while a run goes on.
type progress struct {
	label string
	total int
	w     io.Writer
	tty   bool
	st    *runState
	quit  chan struct{}
	over  chan struct{}
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newProgress(label string, total int, w io.Writer, every time.Duration, st *runState) *progress {
	p := &progress{label: label, total: total, w: w, tty: isTerminal(w), st: st,
		quit: make(chan struct{}), over: make(chan struct{})}
	interval := every
	if p.tty {
		interval = 500 * time.Millisecond // at most twice a second
	}
	go func() {
		defer close(p.over)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.print(false)
			case <-p.quit:
				p.print(true)
				return
			}
		}
	}()
	return p
}

func (p *progress) line() string {
	sent, done, errs := p.st.sent.Load(), p.st.done.Load(), p.st.errs.Load()
	el := time.Since(p.st.start).Truncate(100 * time.Millisecond)
	pct := 0.0
	if p.total > 0 {
		pct = 100 * float64(done) / float64(p.total)
	}
	label := p.label
	if label != "" {
		label += ": "
	}
	return fmt.Sprintf("%s%d/%d done (%.0f%%), %d in flight, %d errors, %s", label, done, p.total, pct, sent-done, errs, el)
}

func (p *progress) print(final bool) {
	switch {
	case p.tty && final:
		_, _ = fmt.Fprintf(p.w, "\r\x1b[K%s\n", p.line())
	case p.tty:
		_, _ = fmt.Fprintf(p.w, "\r\x1b[K%s", p.line())
	default:
		_, _ = fmt.Fprintln(p.w, p.line())
	}
}

func (p *progress) stop() {
	close(p.quit)
	<-p.over
}
