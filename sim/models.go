package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// models is the set of names a replica answers to: its base model names and
// the LoRA adapters loaded on it. It mirrors vLLM's OpenAIServingModels,
// which is what a router learns a worker's models from.
type models struct {
	// base lists the served base names, the default first; anyBase means
	// the replica was given no list and accepts every name as its base
	// model, the simulator's historical behaviour.
	base    []string
	anyBase bool

	mu sync.RWMutex
	// adapters in load order, so /v1/models lists them stably.
	adapters []LoRAModule
}

func newModels(cfg Config) *models {
	m := &models{base: []string{cfg.Model}, anyBase: len(cfg.Models) == 0}
	if !m.anyBase {
		m.base = slices.Clone(cfg.Models)
	}
	m.adapters = slices.Clone(cfg.LoRAModules)
	return m
}

// resolve maps a request's model name to the adapter it selects ("" for the
// base model) and reports whether the replica serves that name. An empty
// name means the default base model, as in vLLM.
func (m *models) resolve(name string) (adapter string, ok bool) {
	if name == "" {
		return "", true
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if i := m.adapterIndex(name); i >= 0 {
		return name, true
	}
	return "", m.anyBase || slices.Contains(m.base, name)
}

func (m *models) adapterIndex(name string) int {
	return slices.IndexFunc(m.adapters, func(l LoRAModule) bool { return l.Name == name })
}

// modelCard is one entry of /v1/models in vLLM's shape. max_model_len is
// null because the simulator enforces no context length.
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        *string `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
	Permission  []any   `json:"permission"`
}

func (m *models) cards(created int64) []modelCard {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]modelCard, 0, len(m.base)+len(m.adapters))
	for _, b := range m.base {
		out = append(out, modelCard{ID: b, Object: "model", Created: created, OwnedBy: "cart-sim", Root: &b, Permission: []any{}})
	}
	parent := m.base[0]
	for _, a := range m.adapters {
		out = append(out, modelCard{ID: a.Name, Object: "model", Created: created, OwnedBy: "cart-sim", Root: &a.Path, Parent: &parent, Permission: []any{}})
	}
	return out
}

// modelNotFound is vLLM's answer for a model the replica does not serve.
func modelNotFound(name string) *apiError {
	return notFound(fmt.Sprintf("The model `%s` does not exist.", name), "NotFoundError", "model")
}

func (s *Server) serveModels(_ context.Context, w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": s.models.cards(s.started.Unix())})
	return nil
}

// loraRequest is the body of vLLM's /v1/load_lora_adapter and
// /v1/unload_lora_adapter.
type loraRequest struct {
	Name        string `json:"lora_name"`
	Path        string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

// invalidUserInput is the 400 vLLM answers to a bad adapter request.
func invalidUserInput(message string) *apiError {
	return &apiError{status: http.StatusBadRequest, message: message, typ: "InvalidUserInput", code: http.StatusBadRequest}
}

func (s *Server) serveLoadLoRA(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	return s.serveLoRAChange(ctx, w, r, func(req loraRequest) (string, *apiError) {
		if aerr := s.models.load(req); aerr != nil {
			return "", aerr
		}
		s.log.Info("loaded LoRA adapter", "name", req.Name, "path", req.Path)
		return "added", nil
	})
}

func (s *Server) serveUnloadLoRA(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	return s.serveLoRAChange(ctx, w, r, func(req loraRequest) (string, *apiError) {
		if aerr := s.models.unload(req.Name); aerr != nil {
			return "", aerr
		}
		s.log.Info("unloaded LoRA adapter", "name", req.Name)
		return "removed", nil
	})
}

// serveLoRAChange decodes an adapter request, applies change and answers
// with vLLM's plain-text success line, naming what change did.
func (s *Server) serveLoRAChange(ctx context.Context, w http.ResponseWriter, r *http.Request, change func(loraRequest) (string, *apiError)) error {
	var req loraRequest
	if ok, err := decodeRequest(ctx, w, r, styleOpenAI, &req); !ok {
		return err
	}
	done, aerr := change(req)
	if aerr != nil {
		aerr.write(w, styleOpenAI)
		return nil
	}
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' %s successfully.", req.Name, done))
	return nil
}

// load adds an adapter with vLLM's checks: both fields are required, and a
// loaded name is refused unless load_inplace asks to replace it.
func (m *models) load(req loraRequest) *apiError {
	if req.Name == "" || req.Path == "" {
		return invalidUserInput("Both 'lora_name' and 'lora_path' must be provided.")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := m.adapterIndex(req.Name); i >= 0 {
		if !req.LoadInplace {
			return invalidUserInput(fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.Name))
		}
		m.adapters[i].Path = req.Path
		return nil
	}
	if slices.Contains(m.base, req.Name) {
		// vLLM would let the adapter shadow the base name; refusing keeps
		// "which model did this request get" unambiguous in tests.
		return invalidUserInput(fmt.Sprintf("'%s' is a base model name of this replica.", req.Name))
	}
	m.adapters = append(m.adapters, LoRAModule{Name: req.Name, Path: req.Path})
	return nil
}

func (m *models) unload(name string) *apiError {
	if name == "" {
		return invalidUserInput("'lora_name' needs to be provided to unload a LoRA adapter.")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.adapterIndex(name)
	if i < 0 {
		return notFound(fmt.Sprintf("The lora adapter '%s' cannot be found.", name), "NotFoundError", "")
	}
	m.adapters = slices.Delete(m.adapters, i, i+1)
	return nil
}

// writeText sends a plain-text 200, as vLLM answers adapter changes.
func writeText(w http.ResponseWriter, text string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(text)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(text))
}

// mustJSON is json.Marshal for values built by this package.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sim: encoding: " + err.Error())
	}
	return b
}
