package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"

	"github.com/cartrouter/cart/controlplane/affinity"
	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
	"github.com/cartrouter/cart/dataplane/router"
)

// The Responses API stores each response in the memory of the replica that
// produced it (vLLM, and cart-sim like it), so a request continuing it
// (previous_response_id) and the calls on a stored response (GET, DELETE,
// cancel, input_items) work on that replica only. The proxy learns which
// replica produced each response id, and for which tenant, from the
// answers themselves and pins those requests there, ahead of the prefix
// rule and of load balancing. The engine has no notion of tenants: any
// client holding an id could read, cancel or continue the response, so a
// tenant other than the one that made it is answered as the engine answers
// an id it does not know, and its request never reaches a replica.

const (
	// maxResponseIDLen bounds the ids remembered: vLLM's are 37 bytes.
	maxResponseIDLen = 256
	// responseIDSniff is how far into an answer the id is looked for: it is
	// the first field of a Response object and of the response.created
	// event, so a few hundred bytes in practice.
	responseIDSniff = 8 << 10
)

// validResponseID reports whether id can be a response id: letters,
// digits, '_' and '-' (vLLM's are "resp_" and 32 hex digits, OpenAI's
// "resp_" and more alphanumerics), at most maxResponseIDLen bytes. The id
// of /v1/responses/{id} is one escaped path segment: anything else ("%2F",
// "..", a NUL) is refused before an outbound path is built from it.
func validResponseID[T string | []byte](id T) bool {
	if len(id) == 0 || len(id) > maxResponseIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// responseNotFound is vLLM's answer for a response id its store does not
// hold (serving.py, _make_not_found_error), byte for byte in shape: CART
// gives it for another tenant's response and for an id that cannot be
// one, so that neither is told apart from an id nobody made.
func responseNotFound(id string) *apierr.Error {
	return &apierr.Error{Status: http.StatusNotFound, Type: apierr.TypeInvalidRequest, Code: "response_not_found", Param: "response_id", NumericCode: true,
		Message: "Response with id '" + truncate(id, maxResponseIDLen) + "' not found."}
}

// pinResponse returns the worker holding response id, "" when this router
// never saw it produced (it is then routed normally: the id may predate a
// restart, and the replica that made it can still answer). A response of
// another tenant is not found; a worker that left the pool took the
// response with it: the client is told so rather than sent to a replica
// that never saw it.
func (p *Proxy) pinResponse(id, param, tenant string) (string, error) {
	if len(id) > maxResponseIDLen {
		// Longer than any engine's ids (and than any learned from an
		// answer): never pinned, nor remembered below.
		return "", nil
	}
	th := affinity.HashTenant(tenant)
	o, ok := p.affinity.Lookup(id, th, p.o.Now())
	if !ok {
		return "", nil
	}
	if o.Foreign(th) {
		return "", responseNotFound(id)
	}
	for _, ws := range p.o.Router.Workers() {
		if ws.URL == o.Worker {
			return o.Worker, nil
		}
	}
	return "", responseGone(id, param)
}

func responseGone(id, param string) error {
	what := "response " + truncate(id, maxResponseIDLen)
	if param != "" {
		what = param + " " + truncate(id, maxResponseIDLen)
	}
	return &apierr.Error{Status: http.StatusNotFound, Type: apierr.TypeInvalidRequest, Code: "previous_response_not_found", Param: param,
		Message: what + " was produced by a replica that is no longer in the pool; start the conversation again with its full input"}
}

// pinExclude returns the workers a request pinned to c.pin must not go to:
// every other one, read afresh for each attempt so that a worker added
// meanwhile is not a way around the pin.
func (p *Proxy) pinExclude(c *call) []string {
	ws := p.o.Router.Workers()
	out := make([]string, 0, len(ws)+len(c.failed))
	for _, w := range ws {
		if w.URL != c.pin {
			out = append(out, w.URL)
		}
	}
	return append(out, c.failed...)
}

// prepareResponses pins a request continuing a stored response and marks
// the call so that the id of the response it produces is learned.
func (p *Proxy) prepareResponses(c *call, req *extract.Request) error {
	c.learnResponseID = true
	if req.PreviousResponseID == "" {
		return nil
	}
	w, err := p.pinResponse(req.PreviousResponseID, "previous_response_id", c.tenant)
	c.pin = w
	c.responseID, c.responseParam = req.PreviousResponseID, "previous_response_id"
	return err
}

// storedResponse serves GET and DELETE /v1/responses/{id}, its
// input_items and POST /v1/responses/{id}/cancel on the replica that
// produced the response.
func (p *Proxy) storedResponse(w http.ResponseWriter, r *http.Request) {
	tenant, ok := p.authenticate(w, r, extract.Responses.String())
	if !ok {
		return
	}
	c := p.newCall(r, extract.Responses.String(), tenant)
	defer c.hold.free()
	body, err := p.readBody(w, r, c)
	if err == nil && len(body) > 0 && p.o.RemoteMediaPolicy != 0 {
		var m extract.Media
		if m, err = extract.ScanMedia(body); err == nil {
			err = p.mediaRefusal(m)
		}
	}
	if err == nil {
		c.responseID = r.PathValue("id")
		if !validResponseID(c.responseID) {
			// Not an id any engine makes, and the outbound path would
			// carry whatever it decodes to ("../../sim/stats").
			err = responseNotFound(c.responseID)
		} else {
			c.pin, err = p.pinResponse(c.responseID, "", tenant)
		}
	}
	if err != nil {
		p.fail(w, c, err)
		return
	}
	c.body = body
	c.noResend = !p.resendable(r)
	p.forward(w, r, c)
}

// sniffResponseID makes a successful Responses answer teach the affinity
// table its id on the way to the client.
func (p *Proxy) sniffResponseID(c *call, resp *http.Response) *http.Response {
	if !c.learnResponseID || resp.StatusCode/100 != 2 {
		return resp
	}
	resp.Body = &responseIDSniffer{ReadCloser: resp.Body, learn: p.learnResponseID(c, context.WithoutCancel(resp.Request.Context()))}
	return resp
}

// learnResponseID returns what records the id of the response c's final
// worker produced, here and, through a sharing router, everywhere.
func (p *Proxy) learnResponseID(c *call, ctx context.Context) func(string) {
	worker, tenant := c.final.Worker, c.tenant
	return func(id string) {
		p.affinity.Learn(id, affinity.Origin{Worker: worker, Tenant: affinity.HashTenant(tenant)}, p.o.Now())
		if l, ok := p.o.Router.(router.ResponseLearner); ok {
			// Waited for: a client may send the follow-up to another
			// data plane as soon as it holds the id.
			l.LearnResponse(ctx, id, worker, tenant)
		}
	}
}

// pinFromRouter adopts the pin a shared-affinity router found for the
// call's response id, so that retries stay on that worker too. The router
// pins only a response of the call's own tenant (router.Request.Tenant).
func (p *Proxy) pinFromRouter(c *call, d router.Decision) {
	if d.Pinned && c.pin == "" && c.responseID != "" && len(c.responseID) <= maxResponseIDLen {
		c.pin = d.Worker
		p.affinity.Learn(c.responseID, affinity.Origin{Worker: d.Worker, Tenant: affinity.HashTenant(c.tenant)}, p.o.Now())
	}
}

// responseIDSniffer passes a body through unbuffered, keeping a copy of its
// first bytes until the response id shows up. The id is learned before the
// bytes carrying it are handed on, so no client can hold an id that the
// table does not know yet.
type responseIDSniffer struct {
	io.ReadCloser
	learn func(string)
	head  []byte
	done  bool
}

func (s *responseIDSniffer) Read(b []byte) (int, error) {
	n, err := s.ReadCloser.Read(b)
	if n > 0 {
		s.observe(b[:n])
	}
	return n, err
}

// observe looks for the id in the answer's bytes so far, b the next ones.
func (s *responseIDSniffer) observe(b []byte) {
	if s.done {
		return
	}
	s.head = append(s.head, b[:min(len(b), responseIDSniff-len(s.head))]...)
	if id, ok := findResponseID(s.head); ok {
		s.learn(id)
		s.done, s.head = true, nil
	} else if len(s.head) >= responseIDSniff {
		s.done, s.head = true, nil
	}
}

var idKey = []byte(`"id"`)

// findResponseID finds the first "id" member whose value starts with
// "resp_": the Response object's own id (nested output items have msg_,
// rs_, fc_... ids). A quote inside a JSON string is escaped, so text the
// model generated cannot forge the member. The id must be complete.
func findResponseID(b []byte) (string, bool) {
	for {
		i := bytes.Index(b, idKey)
		if i < 0 {
			return "", false
		}
		b = b[i+len(idKey):]
		v := bytes.TrimLeft(b, " \t\r\n")
		if len(v) == 0 || v[0] != ':' {
			continue
		}
		v = bytes.TrimLeft(v[1:], " \t\r\n")
		if len(v) == 0 || v[0] != '"' || !bytes.HasPrefix(v[1:], []byte("resp_")) {
			continue
		}
		end := bytes.IndexByte(v[1:], '"')
		if end < 0 {
			return "", false // not all here yet
		}
		id := v[1 : 1+end]
		if !validResponseID(id) {
			continue
		}
		return string(id), true
	}
}
