package sim

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
)

// reply is how one API shapes a generated answer. Admission, the usage
// headers and the pacing of tokens are the same for every API and live in
// serveGeneration.
type reply struct {
	// whole is the body of a non-streamed answer holding all of out.
	whole func(out string) any
	// open sends what a stream carries before its first token; nil when
	// nothing does.
	open func(sw *sseWriter) error
	// token sends one generated token.
	token func(sw *sseWriter, tok string) error
	// close sends what follows the last token.
	close func(sw *sseWriter) error
}

// serveGeneration serves one generation request: it decodes the body into
// req, lets prepare check it and make the job, admits the job and answers
// in the shape answer gives. answer runs once the job is admitted, so ids
// and creation times date from the start of generation, not from arrival.
func (s *Server) serveGeneration(ctx context.Context, w http.ResponseWriter, r *http.Request, style apiStyle, req any,
	prepare func() (*job, *apiError), answer func(j *job) reply) error {
	if ok, err := decodeRequest(ctx, w, r, style, req); !ok {
		return err
	}
	j, aerr := prepare()
	if aerr == nil {
		if k, ok := req.(interface{ kvParams() json.RawMessage }); ok {
			aerr = s.readKV(j, k.kvParams())
		}
	}
	if aerr != nil {
		aerr.write(w, style)
		return nil
	}

	admit := s.admit
	if j.pull != nil {
		admit = s.admitRemote
	}
	release, err := admit(ctx, j)
	if err != nil {
		return err
	}
	// The sequence ends with its last token, before the answer's closing
	// bytes are written, as in vLLM, whose scheduler frees a finished
	// request before its output reaches the client: a router that sends
	// the next request the moment it sees an answer end must find the
	// slot free, not wait in this queue for the handler to return.
	var once sync.Once
	done := func() {
		once.Do(release)
		if s.hooks.answerEnd != nil {
			s.hooks.answerEnd(j)
		}
	}
	defer once.Do(release)
	setUsageHeaders(w, j)

	rp := answer(j)
	text := newFillerText(s.textSeed(j))
	dec := s.newDecoder(ctx)
	if !j.stream {
		out, err := dec.generate(text, j.maxTokens)
		if err != nil {
			return err
		}
		done()
		if j.remoteDecode {
			b, _ := json.Marshal(rp.whole(out)) // our own types
			writeRawJSON(w, http.StatusOK, withKV(b, s.holdTransfer(j, r.Host)))
			return nil
		}
		writeJSON(w, http.StatusOK, rp.whole(out))
		return nil
	}

	sw, err := startSSE(w)
	if err != nil {
		return err
	}
	if rp.open != nil {
		if err := rp.open(sw); err != nil {
			return err
		}
	}
	for range j.maxTokens {
		if err := dec.step(); err != nil {
			return err
		}
		if err := rp.token(sw, text.next()); err != nil {
			return err
		}
	}
	done()
	return rp.close(sw)
}

// decodeRequest decodes the request body into v. When the body is not
// acceptable it answers the client in style and returns false with a nil
// error; a non-nil error means the client left or the replica stopped.
func decodeRequest(ctx context.Context, w http.ResponseWriter, r *http.Request, style apiStyle, v any) (bool, error) {
	aerr, err := readJSON(ctx, w, r, v)
	if err != nil {
		return false, err
	}
	if aerr != nil {
		aerr.write(w, style)
		return false, nil
	}
	return true, nil
}
