package agent

import (
	"context"
	"errors"
	"time"
)

// reconnectLoop opens a new session and binds every open listener again,
// until it succeeds or the client closes. It goes in rounds of one attempt
// per edge, from the edge after the one the session was on: the first
// attempt of a round after the backoff wait, the others at once. A round
// ends early when a session is open but some endpoints are not granted yet.
func (c *Client) reconnectLoop() {
	defer func() {
		c.mu.Lock()
		c.redialing = false
		c.mu.Unlock()
	}()
	bo := c.newBackoff()
	var lastErr error
	attempt := 0
	for {
		delay := bo.next()
		edges, err := c.edges()
		if err != nil {
			edges = []string{""} // rebindAll fails with err, once a round
		}
		for i := range edges {
			attempt++
			if i > 0 {
				delay = 0
			}
			addr := c.nextEdge(edges)
			c.log().Info("reconnecting", "edge", addr, "attempt", attempt, "in", delay.Round(time.Millisecond))
			c.emit(Event{Kind: Reconnecting, Attempt: attempt, Delay: delay, Err: lastErr, Addr: addr})
			if delay > 0 {
				t := time.NewTimer(delay)
				select {
				case <-c.ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			up, err := c.rebindAll()
			if err == nil || c.ctx.Err() != nil {
				return
			}
			lastErr = err
			if up {
				// The session is fine; its endpoints wait for the backoff.
				c.log().Warn("reconnect failed", "edge", addr, "attempt", attempt, "err", err)
				break
			}
			// rebindAll logged the failure; on to the next edge.
		}
	}
}

// rebindAnswer is how long a reconnection's bind waits for the edge's
// answer: past the 30 s an edge gives a request (its Router's calls
// within it), so that a bind the store is slow to grant, as when a dead
// edge's thousands of agents bind at once, is not given up (and its
// session closed, its binds unbound, and all of it done again elsewhere)
// while the edge is still at it. The heartbeat tells a dead edge
// meanwhile.
const rebindAnswer = 35 * time.Second

// rebindTimeout bounds the binds of a reconnection, once its session is
// open.
const rebindTimeout = rebindAnswer + 10*time.Second

// rebindAll opens a session, to the next edge, if none is open (see
// connect: a turn at the TLS handshakes of the process, then edgeTimeout),
// and binds each open listener's endpoint that is not bound on it, within
// rebindTimeout. A listener whose
// endpoint is refused for good (its name taken by another identity, or
// refused) is closed with that error; one the edge cannot grant for now
// stays open and unbound, and rebindAll returns that error, with up true,
// so that it is tried again on the same session. A failure of the session
// itself closes it (up false).
func (c *Client) rebindAll() (up bool, err error) {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	c.mu.Lock()
	mux, edge, closed := c.mux, c.edge, c.closed
	c.mu.Unlock()
	if closed {
		return false, nil
	}
	if mux == nil {
		edges, err := c.edges()
		if err != nil {
			return false, err
		}
		edge = c.takeEdge(edges)
		if mux, err = c.connect(c.ctx, edge); err != nil {
			if c.ctx.Err() == nil {
				c.log().Warn("connecting to edge failed", "edge", edge, "err", err)
			}
			return false, err
		}
	}
	ctx, cancel := context.WithTimeout(c.ctx, rebindTimeout)
	defer cancel()
	c.mu.Lock()
	ls := make([]*Listener, 0, len(c.listeners))
	for l := range c.listeners {
		if _, ok := l.bound(mux); !ok {
			ls = append(ls, l)
		}
	}
	c.mu.Unlock()
	c.binding.RLock()
	defer c.binding.RUnlock()
	var later error
	for _, l := range ls {
		b := l.rebindRequest()
		resp, err := c.bindWithin(ctx, mux, b, rebindAnswer)
		switch {
		case err == nil:
		case errors.Is(err, ErrNameTaken) || errors.Is(err, ErrRefused):
			c.log().Warn("endpoint lost", "url", l.URL(), "err", err)
			c.mu.Lock()
			delete(c.listeners, l)
			c.mu.Unlock()
			l.fail(err)
			continue
		case errors.Is(err, ErrUnavailable):
			c.log().Info("endpoint not granted yet; will try again", "url", l.URL(), "err", err)
			later = err
			continue
		default:
			c.log().Warn("rebinding failed; closing the session", "edge", edge, "url", l.URL(), "err", err)
			mux.Close() // try again with a new session
			return false, err
		}
		if resp.URL != l.URL() {
			c.log().Warn("endpoint came back under another URL", "was", l.URL(), "now", resp.URL, "edge", edge)
		}
		l.setBound(mux, b, resp)
		c.mu.Lock()
		c.byTunnel[resp.TunnelID] = l
		c.mu.Unlock()
	}
	return true, later
}
