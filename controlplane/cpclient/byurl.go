package cpclient

import "sync"

// ByURL keeps one Connect client per control-plane URL, made on first use:
// callers follow the leader from node to node, and building a client per
// call would redo its interceptor setup for every request.
type ByURL[T any] struct {
	mu        sync.Mutex
	clients   map[string]T
	newClient func(url string) T
}

// NewByURL returns an empty set whose clients newClient builds.
func NewByURL[T any](newClient func(url string) T) *ByURL[T] {
	return &ByURL[T]{clients: map[string]T{}, newClient: newClient}
}

// Get returns url's client, making it the first time.
func (b *ByURL[T]) Get(url string) T {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.clients[url]
	if !ok {
		c = b.newClient(url)
		b.clients[url] = c
	}
	return c
}
