package engine

// MaintainStep does one bounded step of index upkeep at now: LRU eviction
// down to maxEntries, then expiry of placements past the TTL, then of idle
// sessions, touching at most chunk entries. Callers hold their lock for
// one step at a time and repeat until it reports done, so routing never
// waits behind a whole pass.
func (e *Engine) MaintainStep(now int64, maxEntries, chunk int) (done bool) {
	if _, done := e.idx.Evict(maxEntries, chunk); !done {
		return false
	}
	if e.pol.TTL > 0 {
		if _, done := e.idx.ExpireBefore(now-e.pol.TTL, chunk); !done {
			return false
		}
	}
	if e.pol.SessionTTL > 0 {
		if _, done := e.ExpireSessions(now, chunk); !done {
			return false
		}
	}
	return true
}
