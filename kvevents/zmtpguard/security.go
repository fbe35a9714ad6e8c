package zmtpguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/go-zeromq/zmq4"
)

// Security returns the NULL mechanism with a checked handshake, for
// zmq4.WithSecurity.
func Security() zmq4.Security { return nullSecurity{} }

type nullSecurity struct{}

func (nullSecurity) Type() zmq4.SecurityType { return zmq4.NullSecurity }

// Handshake exchanges READY commands. Unlike zmq4's own NULL mechanism it
// checks every length in the peer's metadata, survives a panic, refuses a
// peer whose socket type does not fit, and closes the connection whenever
// it fails (zmq4 leaves it open).
func (nullSecurity) Handshake(conn *zmq4.Conn, _ bool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("zmtp handshake: %v", r)
		}
		if err != nil {
			_ = conn.Close()
		}
	}()
	raw, err := conn.Meta.MarshalZMTP()
	if err != nil {
		return fmt.Errorf("zmtp handshake: own metadata: %w", err)
	}
	if err := conn.SendCmd(zmq4.CmdReady, raw); err != nil {
		return fmt.Errorf("zmtp handshake: sending READY: %w", err)
	}
	cmd, err := conn.RecvCmd()
	if err != nil {
		return fmt.Errorf("zmtp handshake: receiving READY: %w", err)
	}
	if cmd.Name != zmq4.CmdReady {
		return fmt.Errorf("zmtp handshake: %q instead of READY", cmd.Name)
	}
	meta, err := ParseMetadata(cmd.Body)
	if err != nil {
		return fmt.Errorf("zmtp handshake: %w", err)
	}
	for k, v := range meta {
		conn.Peer.Meta[k] = v
	}
	own := zmq4.SocketType(conn.Meta[socketTypeKey])
	if peer := zmq4.SocketType(meta[socketTypeKey]); !peer.IsCompatible(own) {
		return fmt.Errorf("zmtp handshake: a %q peer cannot talk to a %q socket", peer, own)
	}
	return nil
}

func (nullSecurity) Encrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }

func (nullSecurity) Decrypt(w io.Writer, data []byte) (int, error) { return w.Write(data) }

// zmq4's names for the two properties it reads (it title-cases names).
const (
	socketTypeKey = "Socket-Type"
	identityKey   = "Identity"
)

var errShortMetadata = errors.New("metadata property runs past the command")

// ParseMetadata reads ZMTP metadata: properties of a 1-byte name length,
// the name, a 4-byte big-endian value length and the value. Socket-Type and
// Identity are named as zmq4 expects whatever their case; other names are
// kept as sent.
func ParseMetadata(p []byte) (map[string]string, error) {
	out := map[string]string{}
	for len(p) > 0 {
		n := int(p[0])
		p = p[1:]
		if n == 0 || len(p) < n+4 {
			return nil, errShortMetadata
		}
		name := string(p[:n])
		size := binary.BigEndian.Uint32(p[n : n+4])
		p = p[n+4:]
		if uint64(size) > uint64(len(p)) {
			return nil, errShortMetadata
		}
		switch {
		case strings.EqualFold(name, socketTypeKey):
			name = socketTypeKey
		case strings.EqualFold(name, identityKey):
			name = identityKey
		}
		out[name] = string(p[:size])
		p = p[size:]
	}
	return out, nil
}
