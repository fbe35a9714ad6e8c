package sim

import (
	"encoding/json"
	"net/http"
)

// peek returns how many leading blocks of hashes are cached, without
// marking them used (an observer must not change the LRU order).
func (c *prefixCache) peek(hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.prefixLocked(hashes)
}

// MatchReport is what POST /sim/match answers: how much of a chat
// request's prompt this replica has cached right now, and how busy it is.
// It is the replica-side truth a precise, engine-event-fed router would
// see, used by the benchmark's reference ("oracle") router.
type MatchReport struct {
	PromptTokens int   `json:"prompt_tokens"`
	CachedTokens int   `json:"cached_tokens"`
	Running      int64 `json:"running"`
	Queued       int64 `json:"queued"`
}

// serveMatch answers POST /sim/match with a chat-completions body. It
// changes nothing: no request is counted and no cache block is touched.
func (s *Server) serveMatch(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodPost) {
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		badRequest("could not read the request body: "+err.Error(), "").write(w, styleOpenAI)
		return
	}
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		badRequest("want a chat completions body with messages", "messages").write(w, styleOpenAI)
		return
	}
	prompt, err := renderChat(req.Tools, req.Messages)
	if err != nil {
		badRequest(err.Error(), "messages").write(w, styleOpenAI)
		return
	}
	tokens := tokenCount(prompt)
	// An unknown model cannot be served, so nothing of it is cached; a
	// probe answers 0 rather than an error so oracles stay simple.
	adapter, ok := s.models.resolve(req.Model)
	blocks := 0
	if ok {
		blocks = s.cache.peek(blockHashes(prompt, s.cfg.BlockTokens, adapter, deref(req.CacheSalt)))
	}
	writeJSON(w, http.StatusOK, MatchReport{
		PromptTokens: tokens,
		CachedTokens: min(blocks*s.cfg.BlockTokens, tokens),
		Running:      s.running.Load(),
		Queued:       s.queued.Load(),
	})
}
