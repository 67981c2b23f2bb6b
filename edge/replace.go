package edge

import (
	"context"
	"errors"
	"strings"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// An agent's endpoint changed in place (wire.Bind.Replaces): its settings
// change, its name and conns stay.

// serveReplace changes the endpoint b.Replaces of the session in place:
// a route of the same protocol and name, with b's pool setting, options
// and policy, takes its place in the Router in one step (router.Move from
// the session itself), so that the name is never free meanwhile and no
// other identity can take it; the old endpoint's conns go on, and conns
// sent to it as it changed reach the new one. A refusal leaves the old
// endpoint as it was, and how says how (see bindOutcome).
func (ss *session) serveReplace(ctx context.Context, b *wire.Bind) (wire.Response, bindOutcome) {
	s := ss.srv
	ss.mu.Lock()
	old, ok := ss.routes.Get(b.Replaces)
	twins := 0 // the session's endpoints of the same protocol and name
	if ok {
		for _, e := range ss.routes.All() {
			if e.Route.Proto == old.Route.Proto && e.Route.Name == old.Route.Name && e.Route.Path == old.Route.Path {
				twins++
			}
		}
		ss.binding++ // a relay stream for the new route waits for it
	}
	ss.mu.Unlock()
	if !ok {
		return fail(wire.CodeNotFound, "no such tunnel to replace"), bindRefused
	}
	defer ss.doneBinding(true, endpointKey{}, nil)
	if twins > 1 {
		return fail(wire.CodeBadRequest, "this session holds %s %s more than once: unbind and bind it instead", old.Route.Proto, old.Route.Name), bindRefused
	}
	if b.Proto != old.Route.Proto {
		return fail(wire.CodeBadRequest, "a replace keeps the protocol: the endpoint is %s, not %s", old.Route.Proto, wire.Printable(b.Proto, 16)), bindRefused
	}
	if name, err := s.replacedName(b); err != nil || name != old.Route.Name {
		return fail(wire.CodeBadRequest, "a replace keeps the name: the endpoint is %s", old.URL), bindRefused
	}
	r := old.Route
	r.TunnelID, r.Pool, r.AppProtocol, r.Policy, r.VerboseErrors = newID(), b.Pool, "", "", false // as b says
	r.Admits = ss.admits(r.Pool)
	if err := s.endpointOptions(&r, b.Options, b.Policy); err != nil {
		return fail(wire.CodeBadRequest, "%s", err), bindRefused
	}
	if r.Path != old.Route.Path {
		return fail(wire.CodeBadRequest, "a replace keeps the path: the endpoint is %s", old.URL), bindRefused
	}
	pol, combined, e := s.bindPolicy(ctx, &r, b.Policy)
	if e != nil {
		return wire.Response{Error: e}, policyOutcome(e)
	}
	if err := router.Move(ctx, s.router(), r, ss.id); err != nil {
		if errors.Is(err, router.ErrNameTaken) {
			return fail(wire.CodeNameTaken, "%s", strings.TrimPrefix(err.Error(), router.ErrNameTaken.Error()+": ")), bindRefused
		}
		ss.log.Warn("replace", "err", err)
		return fail(wire.CodeUnavailable, msgStoreFailed), bindTrouble
	}
	s.holdPolicy(r, pol)
	ep := &book.Endpoint{Route: r, URL: old.URL, Kinds: combined.Kinds(), Checked: b.Options[wire.OptHealthCheck] != ""}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		s.unbind(r, 0)
		return fail(wire.CodeUnavailable, "session closed"), bindTrouble
	}
	ep.Follow(old) // under ss.mu, as serveHealth changes old's health
	// Down no more: the new endpoint has no check.
	upNow := old.Health() == view.HealthDown && ep.Health() != view.HealthDown
	ss.routes.Delete(old.Route.TunnelID)
	ss.routes.Set(r.TunnelID, ep)
	for from, to := range ss.replaced {
		if to == old.Route.TunnelID {
			delete(ss.replaced, from) // one alias for each endpoint
		}
	}
	if ss.replaced == nil {
		ss.replaced = map[string]string{}
	}
	ss.replaced[old.Route.TunnelID] = r.TunnelID
	ss.note(ep.Event(view.Update))
	ss.mu.Unlock()
	if upNow {
		s.countDown(r.Proto, false)
	}
	// What the old route held on this edge alone: the Router moved it.
	s.releasePolicy(old.Route)
	s.ups.CloseRoute(old.Route) // its idle upstreams; those busy end after their request
	t, err := s.endpointTicket(r)
	if err != nil {
		ss.log.Warn("endpoint ticket", "err", err)
	}
	ss.log.Info("changed in place", "url", ep.URL, "pool", r.Pool, "policy", combined)
	return wire.Response{BindResp: &wire.BindResp{TunnelID: r.TunnelID, URL: ep.URL, Ticket: t}}, bindRefused
}

// replacedName returns the normalised name (or port) of a bind that
// replaces an endpoint: the one name it asks for.
func (s *Server) replacedName(b *wire.Bind) (string, error) {
	names, chosen, err := s.bindNames(b)
	if err != nil {
		return "", err
	}
	if !chosen {
		return "", errors.New("no name")
	}
	for n := range names {
		return n, nil
	}
	return "", errors.New("no name")
}

// endpointLocked returns the endpoint of tunnelID on the session, or of
// the one that took its place when it changed in place. The caller holds
// ss.mu.
func (ss *session) endpointLocked(tunnelID string) (*book.Endpoint, bool) {
	e, ok := ss.routes.Get(tunnelID)
	if !ok {
		if to, replaced := ss.replaced[tunnelID]; replaced {
			e, ok = ss.routes.Get(to)
		}
	}
	return e, ok
}
