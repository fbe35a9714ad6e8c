//go:build !unix

package proxy

import "net"

// connOpen cannot peek without blocking here: the connection is assumed
// open, and a request written into one the worker closed fails as it
// would with net/http's Transport in the same race.
func connOpen(net.Conn) bool { return true }
