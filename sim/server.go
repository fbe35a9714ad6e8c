package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/cartrouter/cart/internal/every"
)

// maxBodyBytes bounds request bodies. Long-context prompts with inline images
// reach several MiB; anything far beyond that is a client bug.
const maxBodyBytes = 64 << 20

// Server is one simulated replica. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	cache   *prefixCache
	models  *models
	stored  *responseStore
	slots   *semaphore.Weighted // prefill slots, granted in FIFO order
	seqs    *sequences          // the running batch and the engine's waiting queue
	metrics *metrics
	pd      *pdState // nil without a role
	handler http.Handler
	started time.Time

	// Counters reported by Stats and /metrics; Reset zeroes them.
	requests, promptTokens, cachedTokens, completionTokens atomic.Int64
	// Live gauges; Reset leaves them alone because they describe requests
	// that are still in flight.
	running, queued atomic.Int64

	mu    sync.Mutex
	fault Fault
	// life is the parent of every in-flight request's cancellation. It is
	// cancelled, with ErrDown or ErrClosed as the cause, when those requests
	// must be cut off, and replaced so later requests are unaffected.
	life    context.Context
	endLife context.CancelCauseFunc
	closed  bool

	hooks hooks
}

// hooks are observation points for this package's tests, which need to order
// events across concurrent requests without relying on wall-clock timing.
type hooks struct {
	// prefillStart runs holding a prefill slot, after the cache lookup and
	// before the prefill delay.
	prefillStart func(j *job)
	// prefillEnd runs after the prompt's blocks were inserted, before the
	// slot is released.
	prefillEnd func(j *job)
	// answerEnd runs after the last token is generated, before the
	// answer's closing bytes are written.
	answerEnd func(j *job)
}

// New returns a replica configured by cfg. It panics if cfg is invalid (see
// Config.Validate), since a bad configuration is a programming error in
// tests and is validated up front by the command line.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic("sim: invalid config: " + err.Error())
	}
	cfg = cfg.withDefaults()
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:     cfg,
		log:     logger.With("replica", cfg.Name),
		cache:   newPrefixCache(cfg.CacheTokens / cfg.BlockTokens),
		models:  newModels(cfg),
		stored:  newResponseStore(cfg.StoredResponses),
		slots:   semaphore.NewWeighted(int64(cfg.MaxConcurrency)),
		seqs:    &sequences{max: cfg.MaxRunning, priority: cfg.PriorityScheduling},
		fault:   Fault{Mode: FaultNone},
		started: time.Now(),
	}
	s.life, s.endLife = context.WithCancelCause(context.Background())
	if cfg.Role != "" {
		s.pd = newPDState(cfg.Name, cfg.CacheTokens)
	}
	s.metrics = newMetrics(s)
	s.handler = s.routes()
	return s
}

// Config returns the effective configuration, with defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// Handler returns the replica's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Close aborts every in-flight request (their connections are cut, as if the
// process had died) and makes later API requests fail with 503. The Server
// starts no goroutines of its own, so once the HTTP server that serves
// Handler has finished its handlers nothing of the replica is left running.
// Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.endLife(ErrClosed)
	}
	return nil
}

// SetFault injects (or, with FaultNone, clears) a failure mode. Entering
// FaultDown also cuts the connections of requests already in flight.
func (s *Server) SetFault(f Fault) error {
	f, err := f.normalize()
	if err != nil {
		return err
	}
	s.mu.Lock()
	prev := s.fault
	s.fault = f
	if f.Mode == FaultDown && prev.Mode != FaultDown && !s.closed {
		s.endLife(ErrDown)
		s.life, s.endLife = context.WithCancelCause(context.Background())
	}
	s.mu.Unlock()
	s.log.Info("fault changed", "mode", f.Mode, "status", f.Status, "delay_ms", f.DelayMS)
	return nil
}

// Fault returns the current fault.
func (s *Server) Fault() Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault
}

// state returns, atomically, the fault, the context that in-flight requests
// hang off, and whether the replica is closed. Reading them together is what
// guarantees that a request either sees FaultDown or is cut by it.
func (s *Server) state() (Fault, context.Context, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fault, s.life, s.closed
}

// Stats is a snapshot of a replica's counters, also served at GET /sim/stats.
type Stats struct {
	// Requests counts inference requests received (chat, completions,
	// messages, responses), including those that failed or were faulted.
	Requests int64 `json:"requests"`
	// PromptTokens and CachedTokens sum over requests whose prefill
	// completed.
	PromptTokens     int64 `json:"prompt_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	CacheBlocks      int   `json:"cache_blocks"`
	// Running counts requests past the prefill queue and not yet finished;
	// Queued counts those waiting for a prefill slot.
	Running int64 `json:"running"`
	Queued  int64 `json:"queued"`
	// PD is the replica's prefill/decode side; nil without a role.
	PD *PDStats `json:"pd,omitempty"`
}

// Stats returns current counters.
func (s *Server) Stats() Stats {
	return Stats{
		Requests:         s.requests.Load(),
		PromptTokens:     s.promptTokens.Load(),
		CachedTokens:     s.cachedTokens.Load(),
		CompletionTokens: s.completionTokens.Load(),
		CacheBlocks:      s.cache.len(),
		Running:          s.running.Load(),
		Queued:           s.queued.Load(),
		PD:               s.pdStats(),
	}
}

// Reset empties the prefix cache and zeroes the counters, so one replica can
// serve several test cases or benchmark runs. In-flight requests, the fault,
// loaded adapters and stored responses are left alone. With a KV event sink,
// it publishes AllBlocksCleared.
func (s *Server) Reset() {
	s.cache.reset(s.cacheCleared())
	s.requests.Store(0)
	s.promptTokens.Store(0)
	s.cachedTokens.Store(0)
	s.completionTokens.Store(0)
	s.metrics.requests.Reset()
}

// API paths.
const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathMessages    = "/v1/messages"
	pathModels      = "/v1/models"
	pathResponses   = "/v1/responses"
	pathLoadLoRA    = "/v1/load_lora_adapter"
	pathUnloadLoRA  = "/v1/unload_lora_adapter"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(pathChat, s.api(pathChat, http.MethodPost, styleOpenAI, true, s.serveChat))
	mux.Handle(pathCompletions, s.api(pathCompletions, http.MethodPost, styleOpenAI, true, s.serveCompletions))
	mux.Handle(pathMessages, s.api(pathMessages, http.MethodPost, styleAnthropic, true, s.serveMessages))
	mux.Handle(pathModels, s.api(pathModels, http.MethodGet, styleOpenAI, false, s.serveModels))
	mux.Handle(pathResponses, s.api(pathResponses, http.MethodPost, styleOpenAI, true, s.serveResponses))
	// One metrics label for every id keeps the requests metric bounded.
	mux.Handle(pathResponses+"/", s.api(pathResponses+"/{id}", http.MethodGet, styleOpenAI, false, s.serveGetResponse))
	mux.Handle(pathLoadLoRA, s.api(pathLoadLoRA, http.MethodPost, styleOpenAI, false, s.serveLoadLoRA))
	mux.Handle(pathUnloadLoRA, s.api(pathUnloadLoRA, http.MethodPost, styleOpenAI, false, s.serveUnloadLoRA))
	mux.HandleFunc("/health", s.serveHealth)
	mux.Handle("/metrics", s.diesWhenDown(onlyMethods(s.metrics.handler, http.MethodGet)))
	mux.HandleFunc("/sim/stats", s.serveStats)
	mux.HandleFunc("/sim/fault", s.serveFault)
	mux.HandleFunc("/sim/reset", s.serveReset)
	mux.HandleFunc("/sim/match", s.serveMatch)
	mux.Handle(pathKVPull, s.diesWhenDown(http.HandlerFunc(s.servePull)))
	mux.Handle("/", s.diesWhenDown(http.HandlerFunc(serveNotFound)))

	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set(HeaderReplica, s.cfg.Name)
		// Echo the caller's request id, as vLLM does, so a router or test
		// can correlate its logs with the replica that served a request.
		if id := r.Header.Get("X-Request-Id"); id != "" {
			h.Set("X-Request-Id", id)
		}
		mux.ServeHTTP(w, r)
	})
}

// allowMethod answers 405 unless r uses one of methods. It is used instead
// of method patterns on the mux because those would let the catch-all 404
// swallow wrong-method requests.
func allowMethod(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	(&apiError{status: http.StatusMethodNotAllowed, message: fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)}).write(w, styleOpenAI)
	return false
}

func onlyMethods(h http.Handler, methods ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if allowMethod(w, r, methods...) {
			h.ServeHTTP(w, r)
		}
	})
}

func serveNotFound(w http.ResponseWriter, r *http.Request) {
	(&apiError{status: http.StatusNotFound, message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)}).write(w, styleOpenAI)
}

// diesWhenDown makes a non-API endpoint behave like the rest of a dead
// process under FaultDown.
func (s *Server) diesWhenDown(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f, _, _ := s.state(); f.Mode == FaultDown {
			s.abort(w, r, ErrDown)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// abort cuts the client connection without a (complete) response. Hijacking
// and closing is what a crashed process looks like on HTTP/1.x; where the
// connection cannot be hijacked (HTTP/2) net/http's ErrAbortHandler panic
// resets the stream instead.
func (s *Server) abort(w http.ResponseWriter, r *http.Request, cause error) {
	s.log.Debug("aborting connection", "path", r.URL.Path, "cause", cause)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close() // the point is to drop it; a close error changes nothing
}

// statusRecorder remembers the status written, for the requests metric.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and Hijack underneath.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// apiServe serves one API request once faults have been applied. It returns
// nil when it wrote a response (successful or not) and the context or write
// error when it stopped because the client left or the replica aborted.
type apiServe func(ctx context.Context, w http.ResponseWriter, r *http.Request) error

// api wraps an API endpoint with method checking, fault injection,
// cancellation plumbing and accounting.
func (s *Server) api(path, method string, style apiStyle, inference bool, serve apiServe) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if inference {
			s.requests.Add(1)
		}
		rec := &statusRecorder{ResponseWriter: w}
		outcome, abortCause := s.runAPI(rec, r, method, style, serve)
		s.metrics.requests.WithLabelValues(path, outcome).Inc()
		if abortCause != nil {
			s.abort(w, r, abortCause)
		}
	})
}

// runAPI returns the outcome label for sim_requests_total and, when the
// connection must be cut, the reason.
func (s *Server) runAPI(w *statusRecorder, r *http.Request, method string, style apiStyle, serve apiServe) (string, error) {
	fault, life, closed := s.state()
	if fault.Mode == FaultDown && !closed {
		return "aborted", ErrDown
	}
	if !allowMethod(w, r, method) {
		return strconv.Itoa(http.StatusMethodNotAllowed), nil
	}
	if closed {
		(&apiError{status: http.StatusServiceUnavailable, message: "replica is shut down"}).write(w, style)
		return strconv.Itoa(http.StatusServiceUnavailable), nil
	}

	// Every wait below watches ctx, which ends when the client hangs up or
	// when the replica goes down or is closed; the cause tells them apart.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer stop()

	// Sleeps watch ctx, but a write to a client that stopped reading blocks
	// in the kernel. Expiring the write deadline when ctx ends unblocks it,
	// so Close and FaultDown take effect even then. The flag keeps a late
	// callback from touching the connection once it serves another request.
	var deadlineMu sync.Mutex
	finished := false
	stopDeadline := context.AfterFunc(ctx, func() {
		deadlineMu.Lock()
		defer deadlineMu.Unlock()
		if !finished {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now()) // unsupported writers just keep blocking
		}
	})
	defer func() {
		stopDeadline()
		deadlineMu.Lock()
		finished = true
		deadlineMu.Unlock()
	}()
	stopped := func(err error) (string, error) {
		cause := context.Cause(ctx)
		if errors.Is(cause, ErrDown) || errors.Is(cause, ErrClosed) {
			return "aborted", cause
		}
		s.log.Debug("request ended early", "path", r.URL.Path, "err", err)
		return "499", nil
	}

	if fault.DelayMS > 0 {
		if err := every.Sleep(ctx, time.Duration(fault.DelayMS)*time.Millisecond); err != nil {
			return stopped(err)
		}
	}
	if fault.Mode == FaultError {
		(&apiError{status: fault.Status, message: "simulated replica failure (injected fault)"}).write(w, style)
		return strconv.Itoa(fault.Status), nil
	}
	if err := serve(ctx, w, r); err != nil {
		return stopped(err)
	}
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return strconv.Itoa(w.status), nil
}

// readJSON reads and decodes a request body into v.
func readJSON(ctx context.Context, w http.ResponseWriter, r *http.Request, v any) (*apiError, error) {
	body, err := readBody(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return &apiError{status: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit)}, nil
		case ctx.Err() != nil:
			return nil, err
		default:
			return badRequest("could not read the request body: "+err.Error(), ""), nil
		}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("We could not parse the JSON body of your request: "+err.Error(), ""), nil
	}
	return nil, nil
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
}

func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodGet) {
		return
	}
	f, _, closed := s.state()
	switch {
	case closed:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "closed"})
	case f.Mode == FaultDown:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "down"})
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	if allowMethod(w, r, http.MethodGet) {
		writeJSON(w, http.StatusOK, s.Stats())
	}
}

func (s *Server) serveFault(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodGet, http.MethodPost) {
		return
	}
	if r.Method == http.MethodPost {
		body, err := readBody(w, r)
		if err != nil {
			badRequest("could not read the request body: "+err.Error(), "").write(w, styleOpenAI)
			return
		}
		var f Fault
		dec := json.NewDecoder(bytes.NewReader(body))
		// A misspelt field (say "delay" for "delay_ms") would otherwise
		// silently inject a different fault than the test meant.
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			badRequest("invalid fault: "+err.Error(), "").write(w, styleOpenAI)
			return
		}
		if err := s.SetFault(f); err != nil {
			badRequest(err.Error(), "").write(w, styleOpenAI)
			return
		}
	}
	writeJSON(w, http.StatusOK, s.Fault())
}

func (s *Server) serveReset(w http.ResponseWriter, r *http.Request) {
	if allowMethod(w, r, http.MethodPost) {
		s.Reset()
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}
