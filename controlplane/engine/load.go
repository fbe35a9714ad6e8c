package engine

// AdjustLoad changes a worker's load by delta, never below zero. The
// control plane uses it to fold data-plane load reports (absolute counts
// turned into deltas) into the load view; an adjustment that would go
// negative is clamped and counted in Underflows.
func (e *Engine) AdjustLoad(url string, delta int) {
	w, ok := e.byURL[url]
	if !ok {
		return
	}
	w.load += delta
	if delta < 0 {
		e.freed++
	}
	if w.load < 0 {
		e.Underflows++
		w.load = 0
	}
}

// ResetLoads zeroes every load: a new leader starts from nothing and
// rebuilds the view from data-plane reports.
func (e *Engine) ResetLoads() {
	for _, w := range e.workers {
		w.load = 0
	}
	e.freed++
}

// WorkerURL returns the URL of the worker with index id id.
func (e *Engine) WorkerURL(id uint32) (string, bool) {
	for _, w := range e.workers {
		if uint32(w.id) == id {
			return w.spec.URL, true
		}
	}
	return "", false
}

// WorkerIDOf returns the index id of url.
func (e *Engine) WorkerIDOf(url string) (uint32, bool) {
	w, ok := e.byURL[url]
	if !ok {
		return 0, false
	}
	return uint32(w.id), true
}
