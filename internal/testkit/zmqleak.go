package testkit

import "go.uber.org/goleak"

// IgnoreZMQPubWriter lets goleak pass the one goroutine zmq4 v0.17.0 leaves
// per closed PUB socket: pubSocket.Close does not stop its pubMWriter,
// which idles on a sync.Cond. Everything else must still be gone.
var IgnoreZMQPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

// IdleHTTPConns lets goleak pass the keep-alive connections of HTTP
// clients a test used: their read and write loops outlive the test until
// the idle timeout, which is the transport's business, not a leak. It
// returns a new slice each call so that callers may append their own.
func IdleHTTPConns() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	}
}
