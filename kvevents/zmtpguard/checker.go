package zmtpguard

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// ZMTP 3 layout (rfc.zeromq.org/spec/23).
const (
	greetingLen = 64
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	flagsKnown  = flagMore | flagLong | flagCommand
)

// Violation is why a peer's stream was refused. It is a net.Error that is
// not a timeout, so zmq4 treats the connection as closed (its checkIO marks
// a Conn closed on such errors, which removes it from the socket).
type Violation struct{ Reason, Detail string }

func (v *Violation) Error() string   { return "zmtp: " + v.Reason + ": " + v.Detail }
func (v *Violation) Timeout() bool   { return false }
func (v *Violation) Temporary() bool { return false }

func violation(reason, format string, args ...any) *Violation {
	return &Violation{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Reasons a connection is closed, as reported to Limits.OnReject.
const (
	ReasonGreeting   = "bad_greeting"
	ReasonFrame      = "bad_frame"
	ReasonOversize   = "oversize"
	ReasonHandshake  = "handshake"
	ReasonNotAllowed = "not_allowed"
	ReasonTooMany    = "too_many_connections"
)

// checker follows the bytes a peer sends on one ZMTP connection: the
// greeting, then frames (flags, a 1- or 8-byte size, the body). It sees
// each greeting and header whole before any of it is released to zmq4
// (unit), and only counts body bytes. It does no I/O.
type checker struct {
	maxMessage uint64
	maxFrames  int

	greeted bool
	// body is how many bytes of the current frame's body are still to come.
	body uint64
	// Per message: bytes and frames so far; more says a frame announced
	// that another follows.
	msgBytes uint64
	frames   int
	more     bool
	// command: the current frame is a command; commands counts finished
	// ones (the first is the peer's READY, which ends the handshake).
	command  bool
	commands int
}

// need is how many more bytes the current greeting or header needs, given
// the unit bytes collected so far (0 when the unit is complete).
func (c *checker) need(unit []byte) int {
	if !c.greeted {
		return greetingLen - len(unit)
	}
	if len(unit) == 0 {
		return 1
	}
	if unit[0]&flagLong != 0 {
		return 9 - len(unit)
	}
	return 2 - len(unit)
}

// unit checks a complete greeting or frame header. After it, the frame's
// body (if any) is expected.
func (c *checker) unit(u []byte) error {
	if !c.greeted {
		if err := checkGreeting(u); err != nil {
			return err
		}
		c.greeted = true
		return nil
	}
	flags := u[0]
	if flags&^flagsKnown != 0 {
		return violation(ReasonFrame, "reserved flag bits set (%#x)", flags)
	}
	var size uint64
	if flags&flagLong != 0 {
		size = binary.BigEndian.Uint64(u[1:9])
	} else {
		size = uint64(u[1])
	}
	cmd := flags&flagCommand != 0
	if cmd && (flags&flagMore != 0 || c.frames > 0) {
		return violation(ReasonFrame, "a command frame must stand alone")
	}
	if size > c.maxMessage || c.msgBytes+size > c.maxMessage {
		return violation(ReasonOversize, "frame of %d bytes (message %d so far) exceeds the %d-byte message limit", size, c.msgBytes, c.maxMessage)
	}
	if c.frames+1 > c.maxFrames {
		return violation(ReasonOversize, "message of more than %d frames", c.maxFrames)
	}
	c.frames++
	c.msgBytes += size
	c.more = flags&flagMore != 0
	c.command = cmd
	c.body = size
	if size == 0 {
		c.frameDone()
	}
	return nil
}

// consumed counts n body bytes read.
func (c *checker) consumed(n int) {
	c.body -= uint64(n)
	if c.body == 0 {
		c.frameDone()
	}
}

func (c *checker) frameDone() {
	if c.command {
		c.commands++
	}
	if !c.more {
		c.msgBytes, c.frames = 0, 0
	}
}

// handshook reports whether the peer's first command (its READY) has
// been read whole.
func (c *checker) handshook() bool { return c.commands > 0 }

var nullMechanism = append([]byte("NULL"), make([]byte, 16)...)

// checkGreeting accepts what zmq4 accepts, and only the NULL mechanism
// (the only one CART's sockets use): the signature, a version of at least
// 3.0, and an as-server byte of 0 or 1.
func checkGreeting(g []byte) error {
	switch {
	case g[0] != 0xFF || g[9] != 0x7F:
		return violation(ReasonGreeting, "not a ZMTP signature")
	case g[10] < 3:
		return violation(ReasonGreeting, "ZMTP version %d.%d, want 3.0 or later", g[10], g[11])
	case !bytes.Equal(g[12:32], nullMechanism):
		return violation(ReasonGreeting, "security mechanism %q, want NULL", bytes.TrimRight(g[12:32], "\x00"))
	case g[32] > 1:
		return violation(ReasonGreeting, "as-server byte %d", g[32])
	}
	return nil
}
