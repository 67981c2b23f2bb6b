package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Forward accepts l's conns and connects each to addr, copying both ways
// with half-closes kept: the common "expose localhost:3000" case. It is
// Forwarder{To: addr, Logger: logger}.Serve(l).
func Forward(l net.Listener, addr string, logger *slog.Logger) error {
	f := &Forwarder{To: addr, Logger: logger}
	return f.Serve(l)
}

// Forwarder connects the conns of a listener to a local address: it
// copies their bytes, or with HTTP forwards the HTTP requests they carry.
type Forwarder struct {
	// To is the local address each conn is forwarded to, "127.0.0.1:3000".
	To string

	// HTTP makes Serve speak HTTP on the conns rather than copy their
	// bytes: an http.Server reads their requests (HTTP/1.1, and HTTP/2
	// with prior knowledge when AppProtocol is h2c) and an
	// httputil.ReverseProxy forwards each to To over pooled connections,
	// so that Logger gets one line per request, with its method, path,
	// status, bytes and duration. The app gets each request as the edge
	// sent it, less the hop-by-hop headers (and with header names in
	// canonical case): Host, X-Forwarded-For, -Proto and -Host unchanged,
	// no header added. Bodies and trailers stream both ways, as do
	// upgraded connections (WebSocket), whose line comes when they end.
	// When To cannot be reached, the client gets 502 with Tunnelkit-Error
	// app_unreachable, as from the edge; 502 app_error when the app closes
	// without a whole response. Serve refuses HTTP with ProxyProtocol: the
	// connections to To are not one client's. False: the conns' bytes are
	// copied, and the line is per connection.
	HTTP bool

	// AppProtocol is what the conns carry and the app at To speaks when
	// HTTP is set: "http1" for HTTP/1.1, "h2c" for HTTP/2 without TLS
	// (prior knowledge; the server still takes HTTP/1.1 too). Empty: what
	// the listener's AppProtocol method says when it has one (a
	// *Listener; "" there means http1), else http1.
	AppProtocol string

	// ProxyProtocol, when 1 or 2, makes the forwarder send a PROXY
	// protocol header of that version to the upstream first, so that it
	// sees the public client's address (the conn's RemoteAddr) as the
	// source; the destination is the upstream's own address. Zero: none.
	ProxyProtocol int

	// DialTimeout bounds each connection to To. Zero: 10 s.
	DialTimeout time.Duration

	// Logger gets one line per connection, or with HTTP per request.
	// Nil: discarded.
	Logger *slog.Logger

	// Inspector, with HTTP, records each request and its response, for
	// its page and API, and replays them to To on request: see
	// [Inspector]. Nil: none. Without HTTP it is not used: the conns
	// carry bytes, not requests.
	Inspector *Inspector
}

// Serve accepts l's conns and forwards each to f.To, copying both ways with
// half-closes kept, or with f.HTTP request by request. It returns nil when
// l is closed and the error of Accept otherwise, after closing the conns
// it still serves and waiting for them.
func (f *Forwarder) Serve(l net.Listener) error {
	if f.ProxyProtocol < 0 || f.ProxyProtocol > 2 {
		return fmt.Errorf("agent: PROXY protocol version %d: want 0, 1 or 2", f.ProxyProtocol)
	}
	switch f.AppProtocol {
	case "", wire.AppProtocolHTTP1, wire.AppProtocolH2C:
	default:
		return fmt.Errorf("agent: app protocol %q: want http1 or h2c", f.AppProtocol)
	}
	if f.HTTP {
		return f.serveHTTP(l)
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
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		track(c, true)
		wg.Go(func() {
			defer track(c, false)
			f.forwardConn(c, track)
		})
	}
}

// appReadBuffer is the socket receive buffer of the agent's connections
// to its app: the stream's window (256 KiB) is all a connection may have
// in flight toward the edge anyway, and a small buffer keeps the kernel
// from pinning megabytes per connection (the app's and the agent's socket
// buffers) when public clients stop reading their responses: thousands of
// them could otherwise exhaust the host's TCP memory, which stalls every
// connection on it, the agent's session to the edge too. The kernel
// doubles it for its bookkeeping.
const appReadBuffer = 128 << 10

// limitAppBuffers sizes the socket buffers of a connection to the app.
func limitAppBuffers(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(appReadBuffer)
	}
}

// forwardConn dials f.To for one public conn and copies until both are
// done; track registers the upstream conn so that Serve can close it.
func (f *Forwarder) forwardConn(c net.Conn, track func(net.Conn, bool)) {
	logger := f.Logger
	if logger == nil {
		logger = discard
	}
	start := time.Now()
	timeout := f.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	client := c.RemoteAddr().String()
	up, err := net.DialTimeout("tcp", f.To, timeout)
	if err == nil {
		limitAppBuffers(up)
	}
	if err != nil {
		logger.Warn("forward", "client", client, "to", f.To, "err", err)
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
	if f.ProxyProtocol != 0 {
		err := proxyproto.Write(up, f.ProxyProtocol, addrPortOf(c.RemoteAddr()), addrPortOf(up.RemoteAddr()))
		if err != nil {
			logger.Warn("forward: PROXY header", "client", client, "to", f.To, "err", err)
			c.Close()
			up.Close()
			return
		}
	}
	in, out, err := pipe.JoinStreams(c, up, 0)
	attrs := []any{"client", client, "to", f.To, "bytes_in", in, "bytes_out", out, "duration", time.Since(start).Round(time.Millisecond)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	logger.Info("forward", attrs...)
}
