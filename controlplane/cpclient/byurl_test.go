package cpclient

import (
	"sync"
	"testing"
)

func TestByURLMakesOneClientPerURL(t *testing.T) {
	made := map[string]int{}
	var mu sync.Mutex
	b := NewByURL(func(url string) *string {
		mu.Lock()
		made[url]++
		mu.Unlock()
		return &url
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			b.Get("http://a")
			b.Get("http://b")
		})
	}
	wg.Wait()
	if made["http://a"] != 1 || made["http://b"] != 1 {
		t.Fatalf("clients made per URL: %v, want one each", made)
	}
	if a := b.Get("http://a"); *a != "http://a" || a != b.Get("http://a") {
		t.Fatalf("Get(a) = %q, or a different client on a second call", *a)
	}
}
