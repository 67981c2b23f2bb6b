package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// The control requests of a session: hello, bind, renew, unbind.

// bind asks the edge on mux for the endpoint b. ctx bounds the wait for
// the answer, not the request: when ctx ends first, bind returns its
// cause, and an endpoint the edge grants all the same is unbound by a
// goroutine of the client's, so that giving up on one bind neither leaves
// an endpoint the agent knows nothing of nor costs the session its other
// endpoints.
func (c *Client) bind(ctx context.Context, mux *wire.Session, b wire.Bind) (*wire.BindResp, error) {
	return c.bindWithin(ctx, mux, b, edgeTimeout)
}

// bindWithin is bind, waiting at most wait for the edge's answer.
func (c *Client) bindWithin(ctx context.Context, mux *wire.Session, b wire.Bind, wait time.Duration) (*wire.BindResp, error) {
	type answer struct {
		resp wire.Response
		err  error
	}
	answered := make(chan answer, 1)
	// The request is bounded by wait and Close, not by ctx: when ctx ends
	// first, the edge may grant the endpoint all the same.
	callCtx, cancel := context.WithTimeoutCause(c.ctx, wait, errEdgeTimeout)
	go func() {
		defer cancel()
		var a answer
		a.err = c.call(callCtx, mux, wire.Request{Op: wire.OpBind, Bind: &b}, &a.resp)
		answered <- a
	}()
	select {
	case a := <-answered:
		if a.err != nil {
			return nil, a.err
		}
		if a.resp.BindResp == nil {
			return nil, fmt.Errorf("%w: bind answered without an endpoint", ErrRefused)
		}
		return a.resp.BindResp, nil
	case <-ctx.Done():
	}
	// The caller gave up: an endpoint granted after all is unbound, so
	// that the edge holds none the agent knows nothing of, and the
	// session, with its other endpoints, stays.
	go func() {
		a := <-answered
		if a.err != nil || a.resp.BindResp == nil {
			return
		}
		ctx, cancel := context.WithTimeout(c.ctx, edgeTimeout)
		defer cancel()
		err := c.unbindTunnel(ctx, mux, a.resp.BindResp.TunnelID)
		c.log().Debug("endpoint granted after its Listen gave up: unbound", "url", a.resp.BindResp.URL, "err", err)
	}()
	return nil, fmt.Errorf("agent: bind: %w", context.Cause(ctx))
}

// call sends one control request on its own stream and reads the answer.
// ctx bounds it: when ctx ends first, the stream is closed.
func (c *Client) call(ctx context.Context, mux *wire.Session, req wire.Request, resp *wire.Response) error {
	st, err := mux.OpenStream()
	if err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, err)
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	if err := wire.WriteMessage(st, []byte{byte(wire.StreamControl)}, req); err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, ctxErr(ctx, err))
	}
	if err := wire.ReadMessage(st, resp); err != nil {
		return fmt.Errorf("agent: %s: %w", req.Op, ctxErr(ctx, err))
	}
	if e := resp.Error; e != nil {
		r := &sentinelError{kind: ErrRefused, msg: wire.Printable(e.Message, 300)}
		switch e.Code {
		case wire.CodeUnauthorized:
			r.kind = ErrUnauthorized
			if req.Hello != nil && req.Hello.Token == "" {
				r.also = ErrNoToken
			}
		case wire.CodeNameTaken:
			r.kind, r.until = ErrNameTaken, e.Until
		case wire.CodeUnavailable:
			r.kind = ErrUnavailable
		}
		return r
	}
	return nil
}

// renewTickets renews the endpoint tickets of the listeners bound on mux
// every interval, and with session the session ticket too (an edge of
// version wire.SessionTicketVersion or later), from a timer: no goroutine
// waits between renewals. stop ends them; Close waits for a renewal under
// way.
func (c *Client) renewTickets(mux *wire.Session, interval time.Duration, session bool) (stop func()) {
	var (
		mu      sync.Mutex
		t       *time.Timer
		stopped bool
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(interval, func() {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		c.wg.Add(1)
		c.mu.Unlock()
		defer c.wg.Done()
		c.renewAll(mux)
		if session {
			c.renewSession(mux)
		}
		mu.Lock()
		if !stopped {
			t.Reset(interval)
		}
		mu.Unlock()
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// renewAll renews the endpoint tickets of the listeners bound on mux.
func (c *Client) renewAll(mux *wire.Session) {
	c.mu.Lock()
	ls := make([]*Listener, 0, len(c.listeners))
	for l := range c.listeners {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	for _, l := range ls {
		id, ok := l.bound(mux)
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
		var resp wire.Response
		err := c.call(ctx, mux, wire.Request{Op: wire.OpRenew, Renew: &wire.Renew{TunnelID: id}}, &resp)
		cancel()
		if err == nil && resp.RenewResp != nil {
			l.setTicket(resp.RenewResp.Ticket)
		} else if err != nil {
			c.log().Debug("renew endpoint ticket", "url", l.URL(), "err", err)
		}
	}
}

// renewSession renews the session ticket on mux, which the next hello
// presents, so that it does not expire while the session lasts, and tells
// it as a TicketRenewed event.
func (c *Client) renewSession(mux *wire.Session) {
	ctx, cancel := context.WithTimeout(c.ctx, 15*time.Second)
	defer cancel()
	var resp wire.Response
	err := c.call(ctx, mux, wire.Request{Op: wire.OpRenew, Renew: &wire.Renew{Session: true}}, &resp)
	if err != nil || resp.RenewResp == nil || resp.RenewResp.Ticket == "" {
		c.log().Debug("renew session ticket", "err", err)
		return
	}
	c.mu.Lock()
	current := c.mux == mux
	if current {
		c.ticket = resp.RenewResp.Ticket
	}
	addr := c.edge
	c.mu.Unlock()
	if current {
		c.emit(Event{Kind: TicketRenewed, Addr: addr})
	}
}

// unbind releases a listener's endpoint on the edge, if the session is up.
func (c *Client) unbind(l *Listener) {
	c.mu.Lock()
	mux := c.mux
	delete(c.listeners, l)
	l.mu.Lock()
	id, replaced := l.tunnelID, l.replaced
	l.mu.Unlock()
	for _, t := range []string{id, replaced} {
		if c.byTunnel[t] == l {
			delete(c.byTunnel, t)
		}
	}
	c.mu.Unlock()
	if mux == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.unbindTunnel(ctx, mux, id); err != nil {
		c.log().Debug("unbind", "url", l.URL(), "err", err)
	}
}

// unbindTunnel asks the edge on mux to unbind the endpoint of tunnel id.
func (c *Client) unbindTunnel(ctx context.Context, mux *wire.Session, id string) error {
	var resp wire.Response
	return c.call(ctx, mux, wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: id}}, &resp)
}
