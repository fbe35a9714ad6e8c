package server

import (
	"reflect"

	"github.com/cartrouter/cart/config"
	"github.com/cartrouter/cart/controlplane/kvtruth"
)

// kvEventsChanged reports whether a reload would change which engines' KV
// events are consumed: they are read at start, so such a reload is
// refused (kv_events.* itself is not a worker key and is refused anyway).
func kvEventsChanged(a, b *config.Config) bool {
	return !reflect.DeepEqual(kvtruth.SourcesFrom(a), kvtruth.SourcesFrom(b))
}
