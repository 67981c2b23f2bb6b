package agent

import (
	"context"
	"errors"
	"slices"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Moving to another edge when the edge drains (docs/PROTOCOL.md: the goaway
// stream's move): make before break.

// startMove moves the client off the session mux to the edge at addr, in
// a goroutine of the client's, unless the client is closed or the edge
// asked already: one attempt per session, however often it asks.
func (c *Client) startMove(mux *wire.Session, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, asked := c.leaving[mux]; asked || c.closed {
		return
	}
	if c.leaving == nil {
		c.leaving = map[*wire.Session][]string{}
	}
	c.leaving[mux] = nil // its tunnels that moved, once they did
	c.wg.Go(func() { c.move(mux, addr) })
}

// move moves the client's session off old, the session to the edge at
// from, which asked it to: it opens a session to another edge of Addrs
// (the next ones after from, in turn; with Addrs holding from alone, from
// again, a few times), with the session ticket of old, and
// binds there every endpoint bound on old; the edge takes each over from
// old at once. With at least one endpoint moved, the new session becomes
// the client's (a Connected event tells it) and the agent tells old's edge
// that it moved (OpMoved); old then carries the connections in flight
// until its edge ends it. Endpoints that did not move stay on old, and are
// bound again on the client's session when old ends. When no other edge
// takes them, the client stays on old, and reconnects once it ends. With
// no endpoint on old, it tells the edge that it moved at once.
func (c *Client) move(old *wire.Session, from string) {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	edges, err := c.edges()
	c.mu.Lock()
	current := c.mux == old && !c.closed
	c.mu.Unlock()
	if err != nil || !current {
		return
	}
	// The binds in flight register their listeners first.
	c.binding.Lock()
	nothing := len(c.boundOn(old)) == 0
	c.binding.Unlock()
	if nothing {
		c.moved(old, from) // nothing to move
		return
	}
	// The other edges, from the one after from; with none, from again: an
	// address behind a load balancer (or DNS) reaches other edges too,
	// since the draining one takes no agent.
	i := slices.Index(edges, from)
	others := slices.Concat(edges[i+1:], edges[:max(i, 0)])
	if i < 0 {
		others = edges
	}
	if len(others) == 0 {
		others = []string{from, from, from}
	}
	for _, addr := range others {
		// A session's time, then its binds' (see rebindAnswer).
		ctx, cancel := context.WithTimeout(c.ctx, edgeTimeout+rebindTimeout)
		err := c.moveTo(ctx, old, from, addr)
		cancel()
		if err == nil || c.ctx.Err() != nil {
			return
		}
		c.log().Warn("moving to another edge failed", "from", from, "edge", addr, "err", err)
	}
	c.log().Warn("no other edge took the endpoints; staying on the edge until it ends the session", "edge", from)
}

// errNothingMoved is a move whose binds all failed.
var errNothingMoved = errors.New("agent: no endpoint moved")

// moveTo moves the endpoints bound on old, the session to from, to the
// edge at addr (see move).
func (c *Client) moveTo(ctx context.Context, old *wire.Session, from, addr string) error {
	h, err := c.handshake(ctx, addr)
	if err != nil {
		return err
	}
	ls := c.boundOn(old)
	// Proxy streams for the new tunnels wait for the binds in flight, and
	// then for install.
	c.binding.RLock()
	tunnels := map[string]*Listener{}
	var left []string // the tunnels of old that moved
	for _, l := range ls {
		b := l.rebindRequest()
		resp, err := c.bindWithin(ctx, h.mux, b, rebindAnswer)
		if err != nil {
			c.log().Warn("endpoint not moved; it stays on the edge it was on until that edge ends the session", "url", l.URL(), "edge", addr, "err", err)
			continue
		}
		id, _ := l.bound(old)
		left = append(left, id)
		if resp.URL != l.URL() {
			c.log().Info("endpoint moved under another URL", "was", l.URL(), "now", resp.URL, "edge", addr)
		}
		l.setBound(h.mux, b, resp)
		tunnels[resp.TunnelID] = l
	}
	c.binding.RUnlock()
	if len(tunnels) == 0 {
		close(h.accepting)
		h.mux.Close()
		return errNothingMoved
	}
	if err := c.install(h, old, tunnels); err != nil {
		return err
	}
	c.mu.Lock()
	c.leaving[old] = left
	var closed []string // listeners closed while their endpoint moved
	for id, l := range tunnels {
		if _, open := c.listeners[l]; !open {
			delete(c.byTunnel, id)
			closed = append(closed, id)
		}
	}
	c.mu.Unlock()
	for _, id := range closed {
		c.unbindTunnel(ctx, h.mux, id)
	}
	if old.Over() {
		// It ended while the endpoints moved: its tunnels go now.
		c.sessionEnded(old)
	}
	c.log().Info("moved to another edge", "from", from, "edge", addr, "endpoints", len(tunnels), "of", len(ls))
	c.moved(old, from)
	return nil
}

// boundOn returns the listeners bound on mux.
func (c *Client) boundOn(mux *wire.Session) []*Listener {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ls []*Listener
	for l := range c.listeners {
		if _, ok := l.bound(mux); ok {
			ls = append(ls, l)
		}
	}
	return ls
}

// moved tells the edge of old, at from, that the client moved off it
// (OpMoved): it ends the session once what is in flight on it is done.
func (c *Client) moved(old *wire.Session, from string) {
	ctx, cancel := context.WithTimeout(c.ctx, edgeTimeout)
	defer cancel()
	var resp wire.Response
	if err := c.call(ctx, old, wire.Request{Op: wire.OpMoved}, &resp); err != nil {
		c.log().Debug("telling the edge moved from", "edge", from, "err", err)
	}
}
