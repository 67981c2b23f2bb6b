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
)

// Forward accepts l's conns and connects each to addr, copying both ways
// with half-closes kept: the common "expose localhost:3000" case. It is
// Forwarder{To: addr, Logger: logger}.Serve(l).
func Forward(l net.Listener, addr string, logger *slog.Logger) error {
	f := &Forwarder{To: addr, Logger: logger}
	return f.Serve(l)
}

// Forwarder connects the conns of a listener to a local address.
type Forwarder struct {
	// To is the local address each conn is forwarded to, "127.0.0.1:3000".
	To string

	// ProxyProtocol, when 1 or 2, makes the forwarder send a PROXY
	// protocol header of that version to the upstream first, so that it
	// sees the public client's address (the conn's RemoteAddr) as the
	// source; the destination is the upstream's own address. Zero: none.
	ProxyProtocol int

	// DialTimeout bounds each connection to To. Zero: 10 s.
	DialTimeout time.Duration

	// Logger gets one line per connection. Nil: discarded.
	Logger *slog.Logger
}

// Serve accepts l's conns and forwards each to f.To, copying both ways with
// half-closes kept. It returns nil when l is closed and the error of
// Accept otherwise, after closing the conns it still copies and waiting
// for them.
func (f *Forwarder) Serve(l net.Listener) error {
	if f.ProxyProtocol < 0 || f.ProxyProtocol > 2 {
		return fmt.Errorf("agent: PROXY protocol version %d: want 0, 1 or 2", f.ProxyProtocol)
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
