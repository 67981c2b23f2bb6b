package forward

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
)

// Bytes forwards each conn of a listener to a local address: it connects
// to the address and copies the conn's bytes both ways, half-closes kept.
// Its zero value with To set is ready to use; it holds no state, so one
// Bytes may serve several listeners at once.
type Bytes struct {
	// To is the local address each conn is forwarded to, "127.0.0.1:3000",
	// or the path of a Unix socket (see Network).
	To string

	// Network is To's network: "tcp", or "unix" for a Unix socket's
	// path. Empty: "tcp".
	Network string

	// TLSConfig, when not nil, makes each connection to To speak TLS,
	// the app's certificate checked as the config says: against its
	// RootCAs (nil: the system's roots), for its ServerName (empty: To's
	// host, a name or an IP address). The public conn's bytes go inside
	// the TLS; a PROXY protocol header goes before it. Nil: plaintext.
	TLSConfig *tls.Config

	// ProxyProtocol, when 1 or 2, makes Serve send a PROXY protocol header
	// of that version to To first, so that the app sees the public
	// client's address (the conn's RemoteAddr) as the source; the
	// destination is the app's own address. Zero: none.
	ProxyProtocol int

	// DialTimeout bounds each connection to To. Zero: 10 s.
	DialTimeout time.Duration

	// Logger gets one line per connection, when it ends: the client, the
	// bytes each way, the duration. Nil: discarded.
	Logger *slog.Logger
}

// Serve accepts l's conns and forwards each to b.To, copying both ways
// with half-closes kept, until l is closed. It returns nil when l is
// closed (Accept fails with an error wrapping net.ErrClosed), and the
// error of Accept otherwise, after closing the conns it still serves and
// waiting for them; but for ErrHandedOver, after which it returns nil once
// those conns have ended by themselves. A conn whose app cannot be reached is rejected (see
// the package documentation) or closed.
func (b Bytes) Serve(l net.Listener) error {
	if b.ProxyProtocol < 0 || b.ProxyProtocol > 2 {
		return fmt.Errorf("forward: PROXY protocol version %d: want 0, 1 or 2", b.ProxyProtocol)
	}
	d, err := newAppDialer(b.Network, b.To, b.TLSConfig, b.DialTimeout)
	if err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = struct{}{}
		} else {
			delete(conns, c)
		}
	}
	defer func() {
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		c, err := l.Accept()
		if errors.Is(err, ErrHandedOver) {
			wg.Wait() // the conns served end by themselves
			return nil
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		track(c, true)
		wg.Go(func() {
			defer track(c, false)
			b.forwardConn(c, d, track)
		})
	}
}

// appReadBuffer is the socket receive buffer of the forwarders'
// connections to the app: a tunnel stream's window (256 KiB) is all a
// connection may have in flight toward the edge anyway, and a small buffer
// keeps the kernel from pinning megabytes per connection (the app's and
// the agent's socket buffers) when public clients stop reading their
// responses: thousands of them could otherwise exhaust the host's TCP
// memory, which stalls every connection on it, the agent's session to the
// edge too. The kernel doubles it for its bookkeeping.
const appReadBuffer = 128 << 10

// limitAppBuffers sizes the socket buffers of a connection to the app.
func limitAppBuffers(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(appReadBuffer)
	}
}

// forwardConn dials b.To with d for one public conn and copies until both
// are done; track registers the upstream conn so that Serve can close it.
func (b Bytes) forwardConn(c net.Conn, d *appDialer, track func(net.Conn, bool)) {
	logger := orDiscard(b.Logger)
	start := time.Now()
	client := c.RemoteAddr().String()
	var header func(net.Conn) error
	if b.ProxyProtocol != 0 {
		// On the connection itself, before any TLS.
		header = func(up net.Conn) error {
			return proxyproto.Write(up, b.ProxyProtocol, addrPortOf(c.RemoteAddr()), addrPortOf(up.RemoteAddr()))
		}
	}
	up, err := d.dial(context.Background(), header)
	if err != nil {
		logger.Warn("forward", "client", client, "to", b.To, "err", err)
		// Tell the edge why, so that its client hears that the app, not
		// the tunnel, is down.
		if r, ok := c.(interface{ Reject(error) error }); ok {
			r.Reject(err)
		} else {
			c.Close()
		}
		return
	}
	track(up, true)
	defer track(up, false)
	in, out, err := pipe.JoinStreams(c, up, 0)
	attrs := []any{"client", client, "to", b.To, "bytes_in", in, "bytes_out", out, "duration", time.Since(start).Round(time.Millisecond)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	logger.Info("forward", attrs...)
}

// dialTimeout returns the bound of a connection to the app: d, or 10 s
// for zero.
func dialTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return 10 * time.Second
	}
	return d
}

var discard = slog.New(slog.DiscardHandler)

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return discard
	}
	return l
}

// addrPortOf returns a TCP address as a netip.AddrPort; the zero value when
// it is not one.
func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort()
	}
	return netip.AddrPort{}
}
