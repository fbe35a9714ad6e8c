// Package epptest drives an endpoint picker the way Envoy's ext_proc
// filter does, for tests and benches where neither Envoy nor a Kubernetes
// gateway can run: the messages are go-control-plane's generated types,
// sent in Envoy's order (request headers, then the body in several chunks
// without waiting for answers, FULL_DUPLEX_STREAMED; the response's
// headers and body chunks the same way), with the metadata Envoy sends
// (protocol_config on the first message, the subset hint, the served
// endpoint) and reads (the destination header and dynamic metadata).
//
// Gateway is an HTTP server in front of the workers that asks the picker
// about every request and forwards it to the endpoint the answer names, as
// an InferencePool's gateway does; Stream is one raw ext_proc stream for
// tests that check the protocol message by message.
package epptest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// The protocol's names (dataplane/epp repeats them; these are the
// gateway's side, written out so that a test compares two spellings).
const (
	headerDestination = "x-gateway-destination-endpoint"
	namespaceLB       = "envoy.lb"
	keyServed         = "x-gateway-destination-endpoint-served"
	namespaceSubset   = "envoy.lb.subset_hint"
	keySubset         = "x-gateway-destination-endpoint-subset"
)

// Dial connects to a picker at addr: h2c, or TLS with tc.
func Dial(addr string, tc *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
}

// Stream is one ext_proc stream (one HTTP request).
type Stream struct {
	extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

// Open starts a stream on conn.
func Open(ctx context.Context, conn *grpc.ClientConn) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	c, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return &Stream{ExternalProcessor_ProcessClient: c, cancel: cancel}, nil
}

// Reset breaks the stream off as Envoy does when its client goes away
// (RST_STREAM, the picker sees the call cancelled).
func (s *Stream) Reset() { s.cancel() }

// Close half-closes the stream and waits for the picker to end it.
func (s *Stream) Close() error {
	defer s.cancel()
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// FullDuplex is the protocol_config Envoy sends on a stream's first
// message when both bodies are FULL_DUPLEX_STREAMED.
func FullDuplex() *extprocv3.ProtocolConfiguration {
	return &extprocv3.ProtocolConfiguration{
		RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	}
}

// HeaderMap writes pseudo-headers first, then h in lower case, every
// value as raw_value (what Envoy sends).
func HeaderMap(pseudo [][2]string, h http.Header) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for _, kv := range pseudo {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	for k, vv := range h {
		for _, v := range vv {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)})
		}
	}
	return m
}

// RequestHeaders is a request's first message.
func RequestHeaders(method, path, authority string, h http.Header, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     HeaderMap([][2]string{{":method", method}, {":path", path}, {":authority", authority}, {":scheme", "http"}}, h),
			EndOfStream: eos,
		}},
		ProtocolConfig: FullDuplex(),
	}
}

// RequestBody is one chunk of the request body.
func RequestBody(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// ResponseHeaders starts the response phase, reporting the endpoint that
// served ("" for none).
func ResponseHeaders(status int, h http.Header, eos bool, served string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers:     HeaderMap([][2]string{{":status", strconv.Itoa(status)}}, h),
			EndOfStream: eos,
		}},
		MetadataContext: Served(served),
	}
}

// ResponseBody is one chunk of the response body.
func ResponseBody(b []byte, eos bool, served string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: Served(served),
	}
}

// Subset is the subset hint's metadata: the endpoints the picker must
// choose from.
func Subset(endpoints ...string) *corev3.Metadata {
	vals := make([]any, len(endpoints))
	for i, e := range endpoints {
		vals[i] = e
	}
	s, err := structpb.NewStruct(map[string]any{keySubset: vals})
	if err != nil {
		panic(err) // strings always convert
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{namespaceSubset: s}}
}

// Served is the served-endpoint report's metadata (nil for "").
func Served(endpoint string) *corev3.Metadata {
	if endpoint == "" {
		return nil
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{namespaceLB: {Fields: map[string]*structpb.Value{
		keyServed: structpb.NewStringValue(endpoint),
	}}}}
}

// Destination reads the answer of a request-headers response: the header
// value and the dynamic metadata value, which the protocol requires to be
// equal.
func Destination(r *extprocv3.ProcessingResponse) (header, metadata string) {
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), headerDestination) {
			header = string(h.GetHeader().GetRawValue())
		}
	}
	metadata = r.GetDynamicMetadata().GetFields()[namespaceLB].GetStructValue().GetFields()[headerDestination].GetStringValue()
	return header, metadata
}

// ApplyMutation applies a header mutation to h: set_headers by their
// append (the deprecated flag when present, else append_action), then
// remove_headers.
func ApplyMutation(h http.Header, m *extprocv3.HeaderMutation) {
	for _, o := range m.GetSetHeaders() {
		k, v := http.CanonicalHeaderKey(o.GetHeader().GetKey()), string(o.GetHeader().GetRawValue())
		if o.GetHeader().GetRawValue() == nil {
			v = o.GetHeader().GetValue()
		}
		_, exists := h[k]
		action := o.GetAppendAction()
		//lint:ignore SA1019 Envoy still honours the deprecated flag, and before append_action
		if ap := o.GetAppend(); ap != nil {
			action = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
			if ap.GetValue() {
				action = corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD
			}
		}
		switch action {
		case corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD:
			h.Add(k, v)
		case corev3.HeaderValueOption_ADD_IF_ABSENT:
			if !exists {
				h.Set(k, v)
			}
		case corev3.HeaderValueOption_OVERWRITE_IF_EXISTS:
			if exists {
				h.Set(k, v)
			}
		default:
			h.Set(k, v)
		}
	}
	for _, k := range m.GetRemoveHeaders() {
		h.Del(k)
	}
}

// StreamedBody returns the body chunk of a body response, and whether it
// is the last.
func StreamedBody(c *extprocv3.CommonResponse) ([]byte, bool, error) {
	sr := c.GetBodyMutation().GetStreamedResponse()
	if sr == nil {
		return nil, false, fmt.Errorf("body response without a streamed_response (FULL_DUPLEX_STREAMED needs one)")
	}
	return sr.GetBody(), sr.GetEndOfStream(), nil
}

// SendAll sends msgs in order, without waiting for answers (as Envoy
// streams a request).
func (s *Stream) SendAll(msgs ...*extprocv3.ProcessingRequest) error {
	for _, m := range msgs {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// Ready asks the picker's gRPC readiness check, as a gateway's health
// checker does; it says whether it is SERVING, and the status seen.
func Ready(ctx context.Context, conn *grpc.ClientConn) (bool, string) {
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		return false, err.Error()
	}
	return r.GetStatus() == healthpb.HealthCheckResponse_SERVING, r.GetStatus().String()
}
