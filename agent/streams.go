package agent

import (
	"io"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// handleStream reads the header of a stream the edge opened and hands it to
// its listener.
// A stream waiting for Accept is dropped when dead is closed.
func (c *Client) handleStream(st *wire.Stream, mux *wire.Session, addr string, accepting, dead <-chan struct{}) {
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	var t [1]byte
	if _, err := io.ReadFull(st, t[:]); err != nil {
		st.Close()
		return
	}
	switch wire.StreamType(t[0]) {
	case wire.StreamHeartbeat:
		st.SetReadDeadline(time.Time{})
		wire.Echo(st)
		st.Close()
	case wire.StreamPing: // the edge's: it came, which is all it is for
		wire.ReadPing(st)
		st.Close()
	case wire.StreamGoAway:
		var g wire.GoAway
		err := wire.ReadMessage(st, &g)
		st.Close()
		switch {
		case err == nil && g.Move:
			c.log().Info("edge is going away, and asks the agent to move to another edge", "edge", addr, "reason", wire.Printable(g.Message, 200))
			c.startMove(mux, addr)
		case err == nil:
			c.log().Info("edge is going away; will reconnect when the session ends", "edge", addr, "reason", wire.Printable(g.Message, 200))
			c.mu.Lock()
			if c.farewells == nil {
				c.farewells = map[*wire.Session]string{}
			}
			c.farewells[mux] = wire.Printable(g.Message, 200)
			c.mu.Unlock()
		}
	case wire.StreamProxy:
		h, err := wire.ReadProxyHeader(st)
		st.SetReadDeadline(time.Time{})
		if err != nil {
			c.log().Warn("bad proxy header from edge", "err", err)
			st.Close()
			return
		}
		select {
		case <-accepting:
		case <-c.ctx.Done():
			st.Close()
			return
		}
		conn := newConn(st, h, c.Observer)
		l := c.listener(h.TunnelID)
		if l == nil {
			// Perhaps its bind is still in flight: wait for the binds
			// under way, then look again.
			c.binding.Lock()
			l = c.listener(h.TunnelID)
			c.binding.Unlock()
		}
		if l == nil {
			conn.refuse(wire.ReplyNoEndpoint, "no listener for this endpoint")
			return
		}
		conn.pooled = l.pooledOn(mux)
		l.deliver(conn, dead)
	default:
		c.log().Warn("unexpected stream type from edge", "type", t[0])
		st.Close()
	}
}

func (c *Client) listener(tunnelID string) *Listener {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byTunnel[tunnelID]
}
