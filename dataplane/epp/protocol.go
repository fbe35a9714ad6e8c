package epp

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// The Endpoint Picker Protocol's names (gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol, v1.0.0), with the default
// namespaces.
const (
	// HeaderDestination carries the answer: "ip:port[,ip:port...]", the
	// primary first, then the fallbacks in the order to try them. The
	// same value goes into the dynamic metadata under NamespaceLB.
	HeaderDestination = "x-gateway-destination-endpoint"
	// NamespaceLB holds the answer in the response's dynamic metadata
	// and, in the gateway's response-phase metadata, KeyServed.
	NamespaceLB = "envoy.lb"
	// KeyServed is the endpoint that served the request, as the gateway
	// reports it.
	KeyServed = "x-gateway-destination-endpoint-served"
	// NamespaceSubset and KeySubset carry the gateway's subset hint: the
	// endpoints the answer must come from.
	NamespaceSubset = "envoy.lb.subset_hint"
	KeySubset       = "x-gateway-destination-endpoint-subset"
	// ServiceName is the ext_proc service, also a health-check name.
	ServiceName = "envoy.service.ext_proc.v3.ExternalProcessor"
	// MaxChunk bounds the body chunks sent back: some Envoy builds cap
	// a streamed chunk at 64 KiB (llm-d and the reference EPP use 62,000).
	MaxChunk = 62000
)

// headerValue reads an Envoy header: raw_value (what Envoy sends since
// 1.27) or value.
func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// maxHeaders bounds the headers of one message turned into a request.
const maxHeaders = 512

// inbound is the request a RequestHeaders message describes.
type inbound struct {
	method, path, authority, scheme string
	header                          http.Header
	contentLength                   int64 // -1 unknown
}

// parseHeaders reads the pseudo-headers and headers Envoy sends. Header
// names arrive in lower case (HTTP/2 rules); net/http's map wants them
// canonical.
func parseHeaders(hm *corev3.HeaderMap) (*inbound, error) {
	in := &inbound{header: http.Header{}, contentLength: -1}
	hs := hm.GetHeaders()
	if len(hs) > maxHeaders {
		return nil, errf("request has %d headers, over the %d this picker reads", len(hs), maxHeaders)
	}
	for _, h := range hs {
		k, v := h.GetKey(), headerValue(h)
		switch k {
		case ":method":
			in.method = v
		case ":path":
			in.path = v
		case ":authority":
			in.authority = v
		case ":scheme":
			in.scheme = v
		default:
			if strings.HasPrefix(k, ":") || k == "" {
				continue
			}
			in.header.Add(k, v) // canonical, as net/http keys its map
		}
	}
	if in.method == "" || in.path == "" || in.path[0] != '/' {
		return nil, errf("request headers lack :method or an origin-form :path")
	}
	if cl := in.header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 {
			return nil, errf("content-length %q is not a length", truncate(cl, 32))
		}
		in.contentLength = n
	}
	return in, nil
}

// url splits :path into the request's URL.
func (in *inbound) url() (*url.URL, error) {
	u, err := url.ParseRequestURI(in.path)
	if err != nil {
		return nil, errf(":path %q: %v", truncate(in.path, 64), err)
	}
	return u, nil
}

// subsetHint returns the gateway's subset, nil when it sent none (every
// endpoint allowed). A present but malformed hint allows nothing, as an
// empty one does: the protocol's answer to either is 503.
func subsetHint(md *corev3.Metadata) (subset []string, present bool) {
	ns, ok := md.GetFilterMetadata()[NamespaceSubset]
	if !ok {
		return nil, false
	}
	v, ok := ns.GetFields()[KeySubset]
	if !ok {
		return nil, false
	}
	list := v.GetListValue()
	out := make([]string, 0, len(list.GetValues()))
	for _, e := range list.GetValues() {
		if s, ok := e.GetKind().(*structpb.Value_StringValue); ok {
			out = append(out, s.StringValue)
		}
	}
	return out, true
}

// served returns the endpoint the gateway reports as having served the
// request, "" when the message carries no report.
func served(md *corev3.Metadata) string {
	return md.GetFilterMetadata()[NamespaceLB].GetFields()[KeyServed].GetStringValue()
}

// destinationMetadata is the answer in the dynamic metadata.
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		NamespaceLB: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

// set is a header replaced (or added): set_headers replace by default in
// ext_proc, and saying so keeps a gateway that reads append_action from
// appending to a value the client sent.
func set(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// bodyChunks cuts body into StreamedBodyResponse chunks of at most
// MaxChunk bytes; eos marks the last. An empty body is one empty chunk,
// which still carries eos.
func bodyChunks(body []byte, eos bool) []*extprocv3.StreamedBodyResponse {
	if len(body) == 0 {
		return []*extprocv3.StreamedBodyResponse{{EndOfStream: eos}}
	}
	out := make([]*extprocv3.StreamedBodyResponse, 0, (len(body)+MaxChunk-1)/MaxChunk)
	for len(body) > 0 {
		n := min(len(body), MaxChunk)
		out = append(out, &extprocv3.StreamedBodyResponse{Body: body[:n]})
		body = body[n:]
	}
	out[len(out)-1].EndOfStream = eos
	return out
}

func requestBody(c *extprocv3.StreamedBodyResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: c}}},
	}}}
}

func responseBody(c *extprocv3.StreamedBodyResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
		Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: c}}},
	}}}
}

// immediate is an answer the picker gives the client itself: an error
// (status 4xx/5xx with CART's JSON body) or a response CART serves
// without a worker (GET /v1/models, /health).
func immediate(status int, h http.Header, body []byte) *extprocv3.ProcessingResponse {
	var hs []*corev3.HeaderValueOption
	for k, vv := range h {
		for _, v := range vv {
			hs = append(hs, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: strings.ToLower(k), RawValue: []byte(v)},
				AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
		}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
		Body:    body,
		Details: "cart_epp_" + strconv.Itoa(status),
	}}}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
