package proxy

import (
	"bytes"
	"container/list"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/cartrouter/cart/dataplane/apierr"
	"github.com/cartrouter/cart/dataplane/extract"
)

// The Responses API stores each response in the memory of the replica that
// produced it (vLLM, and cart-sim like it), so a request continuing it
// (previous_response_id) and the calls on a stored response (GET, DELETE,
// cancel) work on that replica only. The proxy learns which replica
// produced each response id from the answers themselves and pins those
// requests there, ahead of the prefix rule and of load balancing.

// Defaults for Options left zero (tests build Options by hand).
const (
	defaultResponseAffinityTTL = time.Hour
	defaultResponseAffinityMax = 100000
	// maxResponseIDLen bounds the ids remembered: vLLM's are 37 bytes.
	maxResponseIDLen = 256
	// responseIDSniff is how far into an answer the id is looked for: it is
	// the first field of a Response object and of the response.created
	// event, so a few hundred bytes in practice.
	responseIDSniff = 8 << 10
)

// responseAffinity remembers response id -> worker, bounded (least
// recently used first out) and expiring ttl after an id was last produced
// or used.
type responseAffinity struct {
	ttl time.Duration
	max int

	mu  sync.Mutex
	lru list.List // of *affinityEntry, most recently used at the front
	ids map[string]*list.Element
}

type affinityEntry struct {
	id, worker string
	expires    time.Time
}

func newResponseAffinity(ttl time.Duration, max int) *responseAffinity {
	if ttl <= 0 {
		ttl = defaultResponseAffinityTTL
	}
	if max <= 0 {
		max = defaultResponseAffinityMax
	}
	return &responseAffinity{ttl: ttl, max: max, ids: map[string]*list.Element{}}
}

func (a *responseAffinity) learn(id, worker string, now time.Time) {
	if id == "" || len(id) > maxResponseIDLen {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.ids[id]; ok {
		e := el.Value.(*affinityEntry)
		e.worker, e.expires = worker, now.Add(a.ttl)
		a.lru.MoveToFront(el)
		return
	}
	a.ids[id] = a.lru.PushFront(&affinityEntry{id: id, worker: worker, expires: now.Add(a.ttl)})
	for a.lru.Len() > a.max {
		a.remove(a.lru.Back())
	}
	// Expired entries at the cold end go too, so an idle table shrinks.
	for el := a.lru.Back(); el != nil && !now.Before(el.Value.(*affinityEntry).expires); el = a.lru.Back() {
		a.remove(el)
	}
}

// lookup returns the worker that produced id, refreshing the entry.
func (a *responseAffinity) lookup(id string, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	el, ok := a.ids[id]
	if !ok {
		return "", false
	}
	e := el.Value.(*affinityEntry)
	if !now.Before(e.expires) {
		a.remove(el)
		return "", false
	}
	e.expires = now.Add(a.ttl)
	a.lru.MoveToFront(el)
	return e.worker, true
}

func (a *responseAffinity) remove(el *list.Element) {
	delete(a.ids, el.Value.(*affinityEntry).id)
	a.lru.Remove(el)
}

func (a *responseAffinity) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lru.Len()
}

// pinResponse returns the worker holding response id, "" when this router
// never saw it produced (it is then routed normally: the id may predate a
// restart, and the replica that made it can still answer). A worker that
// left the pool took the response with it: the client is told so rather
// than sent to a replica that never saw it.
func (p *Proxy) pinResponse(id, param string) (string, error) {
	worker, ok := p.affinity.lookup(id, p.o.Now())
	if !ok {
		return "", nil
	}
	for _, ws := range p.o.Router.Workers() {
		if ws.URL == worker {
			return worker, nil
		}
	}
	what := "response " + truncate(id, maxResponseIDLen)
	if param != "" {
		what = param + " " + truncate(id, maxResponseIDLen)
	}
	return "", &apierr.Error{Status: http.StatusNotFound, Type: apierr.TypeInvalidRequest, Code: "previous_response_not_found", Param: param,
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
	w, err := p.pinResponse(req.PreviousResponseID, "previous_response_id")
	c.pin = w
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
	c := &call{id: requestID(r), endpoint: extract.Responses.String(), tenant: tenant, start: p.o.Now()}
	body, err := p.readBody(w, r)
	if err == nil && len(body) > 0 && p.o.RemoteMediaPolicy != 0 {
		var m extract.Media
		if m, err = extract.ScanMedia(body); err == nil {
			err = p.mediaRefusal(m)
		}
	}
	if err == nil {
		c.pin, err = p.pinResponse(r.PathValue("id"), "")
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
	worker := c.final.Worker
	resp.Body = &responseIDSniffer{ReadCloser: resp.Body, learn: func(id string) { p.affinity.learn(id, worker, p.o.Now()) }}
	return resp
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
	if n > 0 && !s.done {
		s.head = append(s.head, b[:min(n, responseIDSniff-len(s.head))]...)
		if id, ok := findResponseID(s.head); ok {
			s.learn(id)
			s.done, s.head = true, nil
		} else if len(s.head) >= responseIDSniff {
			s.done, s.head = true, nil
		}
	}
	return n, err
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
		if bytes.IndexByte(id, '\\') >= 0 || len(id) > maxResponseIDLen {
			continue
		}
		return string(id), true
	}
}
