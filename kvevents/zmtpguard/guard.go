package zmtpguard

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// Defaults of the Limits fields left zero.
const (
	// DefaultMaxMessageBytes bounds one message (and so one frame). A
	// vLLM batch is one scheduler step's events: at 5 bytes a token id and
	// 9 a block hash, a step of 256K new tokens is about 1.4 MB.
	DefaultMaxMessageBytes = 4 << 20
	// DefaultMaxFrames: KV event messages have 3 frames, replay answers up
	// to 4, commands 1.
	DefaultMaxFrames = 16
	// DefaultMaxConns bounds the connections one listening socket keeps
	// at once (engines and data-parallel ranks that dial it).
	DefaultMaxConns = 128
	// DefaultHandshakeTimeout: a peer's greeting and READY take
	// milliseconds; zmq4 handshakes accepted connections one at a time, so
	// a silent peer delays every connection behind it by this much.
	DefaultHandshakeTimeout = 3 * time.Second
)

// Limits bound what the peers of one socket may do. The zero value uses
// the defaults and accepts any source address.
type Limits struct {
	MaxMessageBytes  int64
	MaxFrames        int
	MaxConns         int
	HandshakeTimeout time.Duration
	// Allow, when not empty, lists the source networks an accepted TCP
	// connection must come from.
	Allow []netip.Prefix
	// IPCMode, when not 0, is set on the socket file of a bound ipc://
	// endpoint (who may connect is who may write it).
	IPCMode fs.FileMode
	// Logger receives a line per refused connection (nil: slog.Default).
	Logger *slog.Logger
	// OnReject is called once per refused connection with its reason.
	OnReject func(reason string)
}

func (l *Limits) maxMessage() int64 {
	if l.MaxMessageBytes > 0 {
		return l.MaxMessageBytes
	}
	return DefaultMaxMessageBytes
}

func (l *Limits) maxFrames() int {
	if l.MaxFrames > 0 {
		return l.MaxFrames
	}
	return DefaultMaxFrames
}

func (l *Limits) maxConns() int {
	if l.MaxConns > 0 {
		return l.MaxConns
	}
	return DefaultMaxConns
}

func (l *Limits) handshakeTimeout() time.Duration {
	if l.HandshakeTimeout > 0 {
		return l.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

func (l *Limits) reject(reason string, from net.Addr, detail string) {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	peer := ""
	if from != nil {
		peer = from.String()
	}
	log.Warn("kv events: connection refused", "peer", peer, "reason", reason, "detail", detail)
	if l.OnReject != nil {
		l.OnReject(reason)
	}
}

// allowed reports whether a TCP peer may connect.
func (l *Limits) allowed(a net.Addr) bool {
	if len(l.Allow) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range l.Allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

type limitsKey struct{}

// Context returns ctx carrying lim, for the context a zmq4 socket is
// created with: zmq4 passes its socket context to the transports.
func Context(ctx context.Context, lim Limits) context.Context {
	return context.WithValue(ctx, limitsKey{}, &lim)
}

func limitsOf(ctx context.Context) *Limits {
	if l, ok := ctx.Value(limitsKey{}).(*Limits); ok {
		return l
	}
	return &Limits{}
}

// Scheme prefixes of the guarded transports.
const (
	tcpScheme = "guarded-tcp"
	ipcScheme = "guarded-ipc"
)

// Endpoint maps a tcp:// or ipc:// endpoint to its guarded transport, to
// pass to a zmq4 socket's Listen or Dial. Other endpoints are returned
// unchanged (zmq4 refuses what it does not know).
func Endpoint(ep string) string {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		return tcpScheme + ep[len("tcp"):]
	case strings.HasPrefix(ep, "ipc://"):
		return ipcScheme + ep[len("ipc"):]
	}
	return ep
}

var registerOnce sync.Once

// Register adds the guarded transports to zmq4 (once per process); the
// functions of this package that need them call it.
func Register() {
	registerOnce.Do(func() {
		for name, t := range map[string]transport.Transport{
			tcpScheme: guarded{network: "tcp", base: transport.New("tcp")},
			ipcScheme: guarded{network: "unix", base: transport.New("unix")},
		} {
			if err := zmq4.RegisterTransport(name, t); err != nil {
				panic(fmt.Sprintf("zmtpguard: %v", err)) // only if registered twice: a bug
			}
		}
	})
}

// guarded is a zmq4 transport over net whose connections are checked.
type guarded struct {
	network string
	base    transport.Transport
}

func (t guarded) Addr(ep string) (string, error) { return t.base.Addr(ep) }

func (t guarded) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return wrap(c, limitsOf(ctx), nil), nil
}

func (t guarded) Listen(ctx context.Context, addr string) (net.Listener, error) {
	lim := limitsOf(ctx)
	ln, err := net.Listen(t.network, addr)
	if err != nil {
		return nil, err
	}
	if t.network == "unix" && lim.IPCMode != 0 {
		if err := os.Chmod(addr, lim.IPCMode); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("setting the mode of %s: %w", addr, err)
		}
	}
	return &listener{Listener: ln, lim: lim, tcp: t.network == "tcp", slots: make(chan struct{}, lim.maxConns())}, nil
}

// listener refuses connections beyond the limits before zmq4 sees them.
type listener struct {
	net.Listener
	lim   *Limits
	tcp   bool
	slots chan struct{} // one token per open connection
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.tcp && !l.lim.allowed(c.RemoteAddr()) {
			l.lim.reject(ReasonNotAllowed, c.RemoteAddr(), "source address not in kv_events.allowed_publishers")
			_ = c.Close()
			continue
		}
		select {
		case l.slots <- struct{}{}:
		default:
			l.lim.reject(ReasonTooMany, c.RemoteAddr(), fmt.Sprintf("%d connections open", cap(l.slots)))
			_ = c.Close()
			continue
		}
		return wrap(c, l.lim, func() { <-l.slots }), nil
	}
}
