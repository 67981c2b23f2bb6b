package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Update changes the endpoint in place on the edge, in one step: it takes
// ep's AppProtocol, Pool, Policy, VerboseErrors and HealthCheck, and keeps its name,
// its URL and its conns (those open go on as they are; the next are sent
// under the new settings), and the name is never free meanwhile: no other
// identity can take it, as closing the listener and binding again would
// allow. ep's settings are checked against the endpoint's protocol.
// ep.URL may be empty; otherwise it must name the endpoint's
// protocol and, if it names one, its name or port (a name as given to
// Listen or as granted), and its path (none: the whole name's; an empty
// URL keeps the endpoint's). StripPrefix changes too. ep.Ticket is not
// used. A reconnection binds the endpoint with the new settings.
//
// It fails with ErrUnsupported on an edge older than protocol version 5,
// with ErrUnavailable while the client has no session (a reconnection
// under way), and with the edge's refusal (ErrRefused for a policy it
// cannot enforce; ErrNameTaken when the endpoint's pool holds other
// agents whose pool setting or policy differ); the listener is then as it
// was. ctx bounds the wait for the answer: when it ends first, Update
// returns its cause, and the edge's answer, when it comes, still applies.
func (l *Listener) Update(ctx context.Context, ep Endpoint) error {
	cur := l.rebindRequest()
	if ep.URL == "" {
		// The endpoint's own, so that its settings are checked against
		// its protocol (and its path kept).
		ep.URL = urlOf(cur)
	}
	b, err := bindOf(ep)
	if err != nil {
		return err
	}
	c := l.c
	c.mu.Lock()
	mux, version := c.mux, c.version
	c.mu.Unlock()
	id, ok := l.bound(mux)
	switch {
	case !ok:
		return fmt.Errorf("%w: not connected to an edge now; try again", ErrUnavailable)
	case version < wire.ReplaceVersion:
		return fmt.Errorf("%w: changing an endpoint in place takes an edge of protocol version %d (this one speaks %d)", ErrUnsupported, wire.ReplaceVersion, version)
	case !sameName(b, cur):
		return fmt.Errorf("agent: endpoint %q: Update keeps the endpoint's protocol and name (%s): close the listener, and Listen for another", ep.URL, l.URL())
	case b.Options[wire.OptPath] != cur.Options[wire.OptPath]:
		return fmt.Errorf("agent: endpoint %q: Update keeps the endpoint's path (%s): close the listener, and Listen for another", ep.URL, l.URL())
	}
	b.Proto, b.Name, b.Port, b.Ticket, b.Replaces = cur.Proto, cur.Name, cur.Port, "", id
	answered := make(chan replacement, 1)
	c.wg.Go(func() {
		a := l.replace(mux, b, id)
		if a.err == nil {
			// Once the bind lock is released: stopping the check that
			// runs may wait for one in flight, and its report, which the
			// proxy streams of unknown tunnels must not wait for.
			var hc *HealthCheck
			if ep.HealthCheck != nil {
				resolved, _ := ep.HealthCheck.resolved() // bindOf checked it
				hc = &resolved
			}
			l.startHealth(hc)
		}
		answered <- a
	})
	select {
	case a := <-answered:
		return a.err
	case <-ctx.Done():
		return fmt.Errorf("agent: update: %w", context.Cause(ctx))
	}
}

// replacement is the edge's answer to a bind in the place of a tunnel.
type replacement struct {
	resp wire.Response
	err  error
}

// replace asks the edge, on mux, for the endpoint b in the place of the
// tunnel old, and records it when granted. Proxy streams for the new
// tunnel ID wait for the answer (c.binding).
func (l *Listener) replace(mux *wire.Session, b wire.Bind, old string) (a replacement) {
	c := l.c
	c.binding.RLock()
	defer c.binding.RUnlock()
	callCtx, cancel := context.WithTimeoutCause(c.ctx, edgeTimeout, errEdgeTimeout)
	defer cancel()
	a.err = c.call(callCtx, mux, wire.Request{Op: wire.OpBind, Bind: &b}, &a.resp)
	if a.err == nil && a.resp.BindResp == nil {
		a.err = fmt.Errorf("%w: bind answered without an endpoint", ErrRefused)
	}
	if a.err == nil {
		l.replacedBy(mux, b, a.resp.BindResp, old)
		c.log().Info("endpoint changed in place", "url", a.resp.BindResp.URL)
	}
	return a
}

// urlOf returns the endpoint URL that names b's endpoint, as Update takes
// it: its protocol, its name (or port) and its path.
func urlOf(b wire.Bind) string {
	if b.Proto == wire.ProtoTCP {
		if b.Port == 0 {
			return "tcp://"
		}
		return "tcp://:" + strconv.Itoa(b.Port)
	}
	return b.Proto + "://" + b.Name + b.Options[wire.OptPath]
}

// replacedBy records the endpoint granted on mux in the place of the
// tunnel old: conns sent to old as it changed still reach the listener,
// until it changes again or the session ends.
func (l *Listener) replacedBy(mux *wire.Session, b wire.Bind, resp *wire.BindResp, old string) {
	b.Replaces = ""
	l.setBound(mux, b, resp)
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	l.mu.Lock()
	before := l.replaced
	l.replaced = old
	l.mu.Unlock()
	if c.mux != mux || c.closed {
		return // the session ended meanwhile: the reconnection binds anew
	}
	if _, open := c.listeners[l]; !open {
		return // closed meanwhile: its unbind names the new tunnel
	}
	if before != "" && c.byTunnel[before] == l {
		delete(c.byTunnel, before)
	}
	c.byTunnel[resp.TunnelID] = l
}

// sameName reports whether the bind b, of an endpoint URL given to Update,
// names the endpoint cur: the same protocol, and no name or port, or its
// own (one label under the edge's domain, or the whole name).
func sameName(b, cur wire.Bind) bool {
	if b.Proto != cur.Proto {
		return false
	}
	if b.Proto == wire.ProtoTCP {
		return b.Port == 0 || b.Port == cur.Port
	}
	if b.Name == "" {
		return true
	}
	name := strings.ToLower(strings.TrimSuffix(b.Name, "."))
	granted := strings.ToLower(cur.Name)
	return name == granted || !strings.Contains(name, ".") && strings.HasPrefix(granted, name+".")
}
