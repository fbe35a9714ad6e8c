package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cartrouter/cart/dataplane/router"
)

// Options configure a Server.
type Options struct {
	// Handler is the proxy's handler (dataplane/proxy, under tracing if
	// on): the picker runs it on every request, under proxy.WithPicker.
	Handler http.Handler
	// Workers is the router's worker set, to map the gateway's endpoints
	// (ip:port) to workers and to choose fallbacks.
	Workers func() []router.WorkerStatus
	// WorkerKey is the key a worker expects (proxy.Proxy.WorkerKey): a
	// fallback must take the credentials sent for the primary.
	WorkerKey func(worker string) string
	// Fallbacks is how many endpoints may follow the primary in an answer.
	Fallbacks int
	// MaxBodyBytes bounds what a request body may hold in the picker
	// before the handler refuses it (proxy.max_body_bytes).
	MaxBodyBytes int64
	Metrics      *Metrics
	Logger       *slog.Logger
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor as the
// Gateway API Inference Extension's Endpoint Picker: one gRPC stream per
// HTTP request, FULL_DUPLEX_STREAMED bodies both ways.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	o Options

	// readers are the goroutines reading the streams: a stream's Recv
	// returns only after Process has returned, so Wait (after the gRPC
	// server has stopped) is what makes sure none is left.
	readers sync.WaitGroup
}

// New builds a Server.
func New(o Options) *Server {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	return &Server{o: o}
}

// Wait returns once every stream's reader has ended; call it after the
// gRPC server stopped.
func (s *Server) Wait() { s.readers.Wait() }

// protoError is a stream the gateway broke the protocol on.
type protoError struct{ msg string }

func (e *protoError) Error() string { return e.msg }

func errf(format string, args ...any) error { return &protoError{fmt.Sprintf(format, args...)} }

type recvResult struct {
	req *extprocv3.ProcessingRequest
	err error
}

// Process serves one HTTP request's stream.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	ctx, cancel := context.WithCancel(srv.Context())
	st := &stream{s: s, srv: srv, ctx: ctx, picked: make(chan pickResult, 1)}
	s.o.Metrics.Active.Inc()
	defer s.o.Metrics.Active.Dec()
	defer func() {
		cancel()
		st.end()
	}()
	recv := make(chan recvResult)
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		for {
			req, err := srv.Recv()
			select {
			case recv <- recvResult{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case r := <-recv:
			if r.err != nil {
				return st.recvError(r.err)
			}
			if err := st.message(r.req); err != nil {
				return st.fail(err)
			}
		case pr := <-st.picked:
			if err := st.onPick(pr); err != nil {
				return st.fail(err)
			}
		case <-st.handled:
			st.handled = nil
			if st.pick == nil {
				// The handler answered itself: an error, or a response
				// CART serves without a worker.
				return st.fail(st.sendImmediate())
			}
		case <-ctx.Done():
			// The gateway cancelled the call (a reset), seen before the
			// reader's error.
			return st.recvError(status.FromContextError(ctx.Err()).Err())
		}
	}
}

// recvError ends the stream on the gateway's side: a clean end (EOF, the
// gateway half-closed it) or a reset (a client that hung up, Envoy
// cancelling the call). Either way the request's load goes (stream.end).
func (st *stream) recvError(err error) error {
	clean := errors.Is(err, io.EOF)
	if st.in != nil && !st.respDone {
		st.s.o.Metrics.EndedEarly.Inc()
	}
	st.gone = !clean
	if clean || status.Code(err) == codes.Canceled {
		return nil
	}
	return status.Errorf(codes.Unknown, "receive: %v", err)
}

// fail turns a protocol error into the stream's gRPC status.
func (st *stream) fail(err error) error {
	if err == nil {
		return nil
	}
	var pe *protoError
	if errors.As(err, &pe) {
		st.s.o.Metrics.ProtocolErrors.Inc()
		st.s.o.Logger.Warn("ext_proc protocol error", "error", pe.msg)
		return status.Error(codes.InvalidArgument, pe.msg)
	}
	return err
}

// checkMode refuses a gateway configured for body modes this picker does
// not speak (it only streams FULL_DUPLEX_STREAMED request bodies back).
func checkMode(pc *extprocv3.ProtocolConfiguration, observe bool) error {
	if observe {
		return errf("observability_mode: an endpoint picker must answer every request")
	}
	if pc == nil {
		return nil
	}
	if m := pc.GetRequestBodyMode(); m != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		return errf("request_body_mode %v: this endpoint picker needs FULL_DUPLEX_STREAMED (it routes by the body, and sends it back)", m)
	}
	if m := pc.GetResponseBodyMode(); m != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && m != filterv3.ProcessingMode_NONE {
		return errf("response_body_mode %v: this endpoint picker needs FULL_DUPLEX_STREAMED (or NONE, when it reads no usage)", m)
	}
	return nil
}
