//go:build unix

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// connOpen peeks at the socket without blocking: EAGAIN means nothing has
// come from the peer, which is what an idle connection should look like;
// EOF (a close), data or an error mean it cannot carry a new request. A
// read deadline cannot do this: net only reads once it is sure the
// deadline has not passed.
func connOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		open = errors.Is(rerr, syscall.EAGAIN) || errors.Is(rerr, syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && open
}
