package testkit

import "go.uber.org/goleak"

// IgnoreZMQPubWriter lets goleak pass the one goroutine zmq4 v0.17.0 leaves
// per closed PUB socket: pubSocket.Close does not stop its pubMWriter,
// which idles on a sync.Cond. Everything else must still be gone.
var IgnoreZMQPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")
