package agent

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
)

// Forward accepts l's conns and connects each to addr, copying both ways
// with half-closes kept: the common "expose localhost:3000" case. It
// returns when l is closed (nil) or fails, after closing the conns it still
// copies and waiting for them. logger gets one line per connection; nil
// discards.
func Forward(l net.Listener, addr string, logger *slog.Logger) error {
	if logger == nil {
		logger = discard
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
			forwardConn(c, addr, logger, track)
		})
	}
}

// forwardConn dials addr for one public conn and copies until both are done.
// track registers the upstream conn so that Forward can close it on return.
func forwardConn(c net.Conn, addr string, logger *slog.Logger, track func(net.Conn, bool)) {
	start := time.Now()
	up, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		logger.Warn("forward", "client", c.RemoteAddr().String(), "to", addr, "err", err)
		c.Close()
		return
	}
	track(up, true)
	defer track(up, false)
	in, out, err := pipe.Join(c, up)
	attrs := []any{"client", c.RemoteAddr().String(), "to", addr, "bytes_in", in, "bytes_out", out, "duration", time.Since(start).Round(time.Millisecond)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	logger.Info("forward", attrs...)
}
