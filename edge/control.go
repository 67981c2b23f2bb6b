package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// The control requests of an agent session: hello, bind, unbind, renew.

// handleControl answers one control request.
func (ss *session) handleControl(st *wire.Stream) {
	// Requests of one session are served a few at a time; the others wait
	// with their bytes unread (each stream buffers at most a window).
	if !ss.enterControl() {
		return
	}
	defer ss.leaveControl()
	var req wire.Request
	if err := wire.ReadMessage(st, &req); err != nil {
		ss.log.Debug("bad control message", "err", err)
		wire.WriteMessage(st, nil, fail(wire.CodeBadRequest, "malformed message"))
		// A peer that cannot frame its hello cannot be trusted to go on.
		if ss.helloState() != helloAccepted {
			ss.refuseHello()
		}
		return
	}
	st.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := ss.serveRequest(ctx, &req)
	if err := wire.WriteMessage(st, nil, resp); err != nil {
		ss.log.Debug("write control response", "err", err)
	}
	if ss.helloState() == helloRefused {
		// Let the agent read why before the session goes.
		st.CloseWrite()
	}
}

// enterControl waits for a turn among the maxControl control requests
// served at once, and reports false if the session ended first.
func (ss *session) enterControl() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for ss.controls >= maxControl {
		if ss.controlFree == nil {
			ss.controlFree = make(chan struct{})
		}
		free := ss.controlFree
		ss.mu.Unlock()
		select {
		case <-free:
		case <-ss.done:
			ss.mu.Lock()
			return false
		}
		ss.mu.Lock()
	}
	ss.controls++
	return true
}

// leaveControl ends a turn that enterControl gave, and wakes the requests
// waiting for one.
func (ss *session) leaveControl() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.controls--
	if ss.controlFree != nil {
		close(ss.controlFree)
		ss.controlFree = nil
	}
}

func fail(code, format string, args ...any) wire.Response {
	return wire.Response{Error: failure(code, format, args...)}
}

func failure(code, format string, args ...any) *wire.Error {
	return &wire.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (ss *session) serveRequest(ctx context.Context, req *wire.Request) wire.Response {
	if req.Op == wire.OpHello {
		if req.Hello == nil {
			ss.refuseHello()
			return fail(wire.CodeBadRequest, "hello without body")
		}
		return ss.serveHello(ctx, req.Hello)
	}
	if ss.helloState() != helloAccepted {
		ss.refuseHello()
		return fail(wire.CodeBadRequest, "hello first")
	}
	switch req.Op {
	case wire.OpBind:
		if req.Bind == nil {
			return fail(wire.CodeBadRequest, "bind without body")
		}
		return ss.serveBindGuarded(ctx, req.Bind)
	case wire.OpUnbind:
		if req.Unbind == nil {
			return fail(wire.CodeBadRequest, "unbind without body")
		}
		return ss.serveUnbind(req.Unbind.TunnelID)
	case wire.OpRenew:
		if req.Renew == nil {
			return fail(wire.CodeBadRequest, "renew without body")
		}
		if req.Renew.Session {
			return ss.renewSessionTicket()
		}
		return ss.serveRenew(req.Renew.TunnelID)
	case wire.OpHealth:
		if req.Health == nil {
			return fail(wire.CodeBadRequest, "health without body")
		}
		return ss.serveHealth(req.Health)
	case wire.OpMoved:
		ss.log.Info("agent moved to another edge")
		ss.srv.moves.Done(ss)
		return wire.Response{}
	default:
		return fail(wire.CodeBadRequest, "unknown operation %q", wire.Printable(req.Op, 32))
	}
}

// serveUnbind releases an endpoint of the session: its name is free at
// once.
func (ss *session) serveUnbind(tunnelID string) wire.Response {
	ss.mu.Lock()
	e, ok := ss.routes.Delete(tunnelID)
	for from, to := range ss.replaced {
		if to == tunnelID {
			delete(ss.replaced, from)
		}
	}
	ss.mu.Unlock()
	if !ok {
		return fail(wire.CodeNotFound, "no such tunnel")
	}
	ss.srv.quotas.Give(ss.owner(), 1)
	ss.srv.obs().Endpoint(e.Route.Proto, -1)
	if e.Health() == view.HealthDown {
		ss.srv.countDown(e.Route.Proto, false)
	}
	ss.srv.unbind(e.Route, 0)
	ss.note(e.Event(view.Unbind))
	ss.log.Info("unbound", "url", e.URL)
	return wire.Response{}
}

// serveRenew gives a fresh endpoint ticket for an endpoint of the session.
func (ss *session) serveRenew(tunnelID string) wire.Response {
	ss.mu.Lock()
	e, ok := ss.routes.Get(tunnelID)
	ss.mu.Unlock()
	if !ok {
		return fail(wire.CodeNotFound, "no such tunnel")
	}
	t, err := ss.srv.endpointTicket(e.Route)
	if err != nil {
		return fail(wire.CodeUnavailable, "no ticket")
	}
	return wire.Response{RenewResp: &wire.RenewResp{Ticket: t}}
}

// refuseHello ends a session whose hello failed, once the agent had a
// moment to read why. Only the first decision counts.
func (ss *session) refuseHello() {
	ss.mu.Lock()
	if ss.hello == helloAccepted || ss.hello == helloRefused {
		ss.mu.Unlock()
		return
	}
	ss.hello = helloRefused
	ss.mu.Unlock()
	ss.srv.donePending(ss.pending)
	time.AfterFunc(time.Second, func() { ss.close(0) })
}

// serveHello decides the session's one hello: the protocol version, the
// identity, a takeover of the agent's previous session.
func (ss *session) serveHello(ctx context.Context, h *wire.Hello) wire.Response {
	ss.mu.Lock()
	if ss.hello != helloNone {
		ss.mu.Unlock()
		return fail(wire.CodeBadRequest, "second hello")
	}
	ss.hello = helloDeciding
	ss.mu.Unlock()
	resp, identity := ss.decideHello(ctx, h)
	if resp.Error != nil {
		ss.note(view.Event{Kind: view.Refused, Reason: resp.Error.Code, Message: resp.Error.Message})
		ss.refuseHello()
		return resp
	}
	s := ss.srv
	s.mu.Lock()
	if limit := s.cfg().sessionsPerIdentity; limit > 0 && s.perIdentity[identity] >= limit {
		s.mu.Unlock()
		ss.log.Info("agent refused: too many sessions", "identity", wire.Printable(identity, 64))
		s.obs().Refused(ReasonSessionLimit)
		ss.refuseHello()
		resp = fail(wire.CodeUnavailable, "too many sessions for this identity")
		ss.note(view.Event{Kind: view.Refused, Identity: identity, Reason: resp.Error.Code, Message: resp.Error.Message})
		return resp
	}
	if s.perIdentity == nil {
		s.perIdentity = map[string]int{}
	}
	// Counted under both locks, so that close uncounts exactly once.
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		s.mu.Unlock()
		return fail(wire.CodeUnavailable, "session closed")
	}
	ss.identity = identity
	ss.hello = helloAccepted
	ss.version, ss.agent, ss.since = min(h.Version, wire.Version), wire.Printable(h.Agent, 64), s.now()
	s.perIdentity[identity]++
	s.obs().Session(1)
	ss.note(view.Event{Kind: view.SessionUp})
	ss.mu.Unlock()
	s.mu.Unlock()
	s.donePending(ss.pending)
	ss.stopHelloTimer()
	ss.log.Info("agent connected", "identity", wire.Printable(identity, 64), "agent", wire.Printable(h.Agent, 64))
	ss.keepAlive(min(h.Version, wire.Version))
	return resp
}

// anonymousPrefix starts the identity of an agent of an edge without
// Authenticate: each agent is its own owner.
const anonymousPrefix = "anonymous-"

// decideHello checks the version and the token or ticket, takes over the
// agent's previous session, and returns the answer and the identity.
func (ss *session) decideHello(ctx context.Context, h *wire.Hello) (wire.Response, string) {
	s := ss.srv
	if s.Draining() {
		return fail(wire.CodeUnavailable, "this edge is draining: connect to another"), ""
	}
	if h.Version < wire.MinVersion {
		return fail(wire.CodeVersion, "protocol version %d not supported (want %d or later)", h.Version, wire.MinVersion), ""
	}
	prev, err := s.sessionTicket(ctx, h.Ticket, ss.log)
	if err != nil {
		return fail(wire.CodeUnavailable, "%s", err), ""
	}
	var identity string
	if auth := s.Authenticate; auth != nil {
		id, err := auth(ctx, h.Token)
		if err == nil && CheckIdentity(id) != nil {
			// The operator's Authenticate is wrong, or passes on what the
			// agent sent: refused, and counted, as a failed authentication,
			// and logged (AuthGuard.Failed) as the operator's to fix.
			why := names.CheckIdentity(id)
			s.auth.Failed(ss.src.String(), limits.SourceOf(ss.src), fmt.Errorf("an invalid identity %q, which Authenticate answered the token with: %v", wire.Printable(id, 64), why))
			s.obs().Refused(ReasonAuth)
			return fail(wire.CodeUnauthorized, "this edge's authentication answered the token with an identity it cannot use (%v); its operator must fix that", why), ""
		}
		if err != nil {
			s.auth.Failed(ss.src.String(), limits.SourceOf(ss.src), err)
			s.obs().Refused(ReasonAuth)
			ss.log.Debug("agent refused", "err", err)
			if h.Token == "" {
				return fail(wire.CodeUnauthorized, "no token was sent, and this edge admits only agents that present one"), ""
			}
			return fail(wire.CodeUnauthorized, "this edge refused the token"), ""
		}
		identity = id
	} else if prev != nil && strings.HasPrefix(prev.Identity, anonymousPrefix) {
		identity = prev.Identity
	} else {
		var b [12]byte
		rand.Read(b[:])
		identity = anonymousPrefix + hex.EncodeToString(b[:])
	}
	if prev != nil && prev.Identity == identity {
		s.takeOver(prev.Session, identity, ss)
		ss.mu.Lock()
		ss.previous = prev.Session
		ss.mu.Unlock()
	}
	t, err := s.signer.Sign(names.Ticket{Kind: names.TicketSession, Issued: s.now(), Identity: identity, Session: ss.id})
	if err != nil {
		ss.log.Warn("session ticket", "err", err)
	}
	return wire.Response{HelloResp: &wire.HelloResp{
		Version:    min(h.Version, wire.Version),
		SessionID:  ss.id,
		Ticket:     t,
		RenewAfter: int(min(s.cfg().ticketLifetime, s.cfg().sessionTickets) / 2 / time.Second),
	}}, identity
}

// takeOver closes the session an agent had before it reconnected, if it is
// still open here (the edge has not yet seen that it died), so that the new
// session gets its endpoints at once: their names stay reserved for the
// identity meanwhile.
func (s *Server) takeOver(sessionID, identity string, by *session) {
	s.mu.Lock()
	old := s.sessions[sessionID]
	s.mu.Unlock()
	if old == nil || old == by {
		return
	}
	old.mu.Lock()
	same := old.identity == identity && old.hello == helloAccepted
	old.mu.Unlock()
	if !same {
		return
	}
	by.log.Info("agent reconnected; closing its previous session", "previous", old.id)
	old.close(max(s.cfg().grace, s.cfg().handshake))
}

// bindOutcome says how a bind that failed failed (nothing, for one
// granted).
type bindOutcome int

const (
	bindRefused bindOutcome = iota // for what its tenant asked
	bindCounted                    // refused for a quota, counted with its Reason already
	bindTrouble                    // for the edge's own reasons (see serveBindGuarded)
)

// msgStoreFailed is the failure of a bind whose Router failed (etcd did
// not answer in time): the edge's trouble, not a refusal.
const msgStoreFailed = "bind failed"

// serveBind grants an endpoint, under the ownership rules of the Router
// and the session's bound on endpoints. A refusal for a quota is counted
// (Observer.Refused) with its Reason (bindCounted).
func (ss *session) serveBind(ctx context.Context, b *wire.Bind) (resp wire.Response, how bindOutcome) {
	s := ss.srv
	if s.Draining() {
		return fail(wire.CodeUnavailable, "this edge is draining: bind on another"), bindTrouble
	}
	if b.Replaces != "" {
		return ss.serveReplace(ctx, b)
	}
	r := router.Route{Proto: b.Proto, SessionID: ss.id, Pool: b.Pool, Edge: s.ID}
	if err := s.endpointOptions(&r, b.Options, b.Policy); err != nil {
		return fail(wire.CodeBadRequest, "%s", err), bindRefused
	}
	names, chosen, err := s.bindNames(b)
	if err != nil {
		return fail(wire.CodeBadRequest, "%s", err), bindRefused
	}
	var name endpointKey // the name asked for, which may be one kept for the agent
	if chosen {
		for n := range names {
			name = endpointKey{Proto: b.Proto, Name: n + r.Path}
		}
	}
	identity, previous, kept, refused := ss.admitBind(name)
	if refused != nil {
		s.obs().Refused(refused.reason)
		return fail(wire.CodeUnavailable, "%s", refused.message), bindCounted
	}
	granted := false
	defer func() { ss.doneBinding(granted, name, kept) }()
	r.Identity = identity
	if b.Proto == wire.ProtoTCP {
		r.Pool = r.Pool && chosen // "any port" never joins a pool
	}
	r.Admits = ss.admits(r.Pool)
	pol, combined, e := s.bindPolicy(ctx, &r, b.Policy)
	if e != nil {
		return wire.Response{Error: e}, policyOutcome(e)
	}
	r, e = ss.bindFirst(ctx, r, names, chosen, previous)
	if e != nil {
		if e.Code == wire.CodeUnavailable && e.Message == msgStoreFailed {
			return wire.Response{Error: e}, bindTrouble
		}
		return wire.Response{Error: e}, bindRefused
	}
	s.holdPolicy(r, pol) // until s.unbind
	ep := &book.Endpoint{Route: r, URL: s.publicURL(r), Kinds: combined.Kinds(), Checked: b.Options[wire.OptHealthCheck] != ""}
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		s.unbind(r, 0)
		return fail(wire.CodeUnavailable, "session closed"), bindTrouble
	}
	ss.routes.Set(r.TunnelID, ep)
	granted = true
	s.obs().Endpoint(r.Proto, 1)
	ss.note(ep.Event(view.Bind))
	ss.mu.Unlock()
	url := ep.URL
	t, err := s.endpointTicket(r)
	if err != nil {
		ss.log.Warn("endpoint ticket", "err", err)
	}
	if !combined.IsZero() {
		ss.log.Info("bound", "url", url, "pool", r.Pool, "policy", combined)
	} else {
		ss.log.Info("bound", "url", url, "pool", r.Pool)
	}
	return wire.Response{BindResp: &wire.BindResp{TunnelID: r.TunnelID, URL: url, Ticket: t}}, bindRefused
}

// policyOutcome says how a bind whose traffic policy failed failed: for
// the edge's trouble when its policy source did not answer
// (policy.ErrUnavailable, see policyFailure).
func policyOutcome(e *wire.Error) bindOutcome {
	if e.Code == wire.CodeUnavailable {
		return bindTrouble
	}
	return bindRefused
}

// serveBindGuarded serves a bind once its owner's refused binds allow
// it (Limits.RefusedBinds), and counts a refusal against them: a tenant
// looping binds it cannot have waits, at no cost to the edge, rather than
// take its CPU and its chances at a name that goes free. A bind that
// failed for the edge's own reasons (it drains, the session closed, its
// Router or a policy source did not answer) is no refusal: a tenant
// cannot loop on those, and counted, a moment of a slow store would make
// a fleet that shares one token wait a second an agent for long after,
// all binding again at once when an edge died.
func (ss *session) serveBindGuarded(ctx context.Context, b *wire.Bind) wire.Response {
	s := ss.srv
	owner := ss.bindOwner()
	pass, waited, err := s.binds.Wait(ctx, owner)
	if waited {
		s.obs().Refused(ReasonBindThrottled)
	}
	if err != nil {
		resp := fail(wire.CodeUnavailable, "too many refused binds: each refusal makes this identity's next binds wait a second; try again later")
		ss.bindRefused(b, resp.Error)
		return resp
	}
	resp, how := ss.serveBind(ctx, b)
	pass.Done(resp.Error != nil && how != bindTrouble)
	if resp.Error != nil {
		if how == bindRefused {
			s.obs().Refused(ReasonBindRefused)
		}
		ss.bindRefused(b, resp.Error)
	}
	return resp
}

// bindRefused logs a refused bind: who asked for what, and why, within
// the edge's budget of lines for the agent's address (Debug past it).
func (ss *session) bindRefused(b *wire.Bind, e *wire.Error) {
	name := wire.Printable(b.Name, 253)
	switch {
	case b.Proto == wire.ProtoTCP && b.Port != 0:
		name = strconv.Itoa(b.Port)
	case b.Proto == wire.ProtoTCP || b.Name == "":
		name = "(any)"
	}
	level := slog.LevelDebug
	if ss.srv.bindLog.Allow(limits.SourceOf(ss.src)) {
		level = slog.LevelInfo
	}
	ss.log.Log(context.Background(), level, "bind refused", "identity", wire.Printable(ss.identity, 64), "proto", wire.Printable(b.Proto, 16), "name", name, "code", e.Code, "reason", e.Message)
	ss.note(view.Event{Kind: view.Refused, Proto: wire.Printable(b.Proto, 16), Name: name, Reason: e.Code, Message: e.Message})
}

// admitBind counts a bind under way of name (the zero key when the edge
// chooses the name) against the session's bound on endpoints and the
// edge's quotas, and returns who binds, and the name kept for them that
// the bind takes the place of, if any (see takeEndpoint); or the bound
// the bind would break. doneBinding uncounts it.
func (ss *session) admitBind(name endpointKey) (identity, previous string, kept *limits.Kept, refused *quotaRefusal) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if max := ss.srv.cfg().endpointsPerSession; max > 0 && ss.routes.Len()+ss.binding >= max {
		return "", "", nil, &quotaRefusal{ReasonEndpointLimit, fmt.Sprintf("too many endpoints on this session (at most %d)", max)}
	}
	kept, refused = ss.srv.takeEndpoint(ss.owner(), name)
	if refused != nil {
		return "", "", nil, refused
	}
	ss.binding++
	return ss.identity, ss.previous, kept, nil
}

// doneBinding ends a bind of name that admitBind counted; unless it was
// granted (the endpoint is in ss.routes, counted until it goes), the
// edge's quotas get it back, and the name kept that it took the place of
// is kept again.
func (ss *session) doneBinding(granted bool, name endpointKey, kept *limits.Kept) {
	ss.mu.Lock()
	ss.binding--
	if ss.binding == 0 && ss.bindsDone != nil {
		close(ss.bindsDone)
		ss.bindsDone = nil
	}
	ss.mu.Unlock()
	if granted {
		return
	}
	ss.srv.quotas.Give(ss.owner(), 1)
	if kept != nil {
		ss.srv.quotas.KeepAgain(name, *kept, ss.srv.now())
	}
}

// owner is whom the session's endpoints count against in the edge's
// quotas: its identity, and for an anonymous agent its source address.
// The hello must have been accepted.
func (ss *session) owner() limits.Owner {
	o := limits.Owner{Identity: ss.identity}
	if ss.srv.Authenticate == nil {
		o.Source = limits.SourceOf(ss.src)
	}
	return o
}

// serveHealth records the agent's report of an endpoint's app: up, or
// down (nothing is routed to it then), for the view, the events and the
// Observer; an app up again ends the Router's cooldown of its route.
func (ss *session) serveHealth(h *wire.Health) wire.Response {
	s := ss.srv
	// Under ss.mu, as an unbind's or a replace's look at the endpoint's
	// health is: each change of it is counted once (countDown).
	ss.mu.Lock()
	e, ok := ss.routes.Get(h.TunnelID)
	var before, after string
	if ok && e.Checked {
		before = e.Health()
		e.SetUp(h.Up, h.RetryAfter)
		after = e.Health()
	}
	ss.mu.Unlock()
	switch {
	case !ok:
		return fail(wire.CodeNotFound, "no such tunnel")
	case !e.Checked:
		return fail(wire.CodeBadRequest, "the endpoint was bound without option %s", wire.OptHealthCheck)
	}
	if before == after {
		return wire.Response{}
	}
	if (before == view.HealthDown) != (after == view.HealthDown) {
		s.countDown(e.Route.Proto, after == view.HealthDown)
	}
	if h.Up {
		s.reached(e.Route)
		ss.log.Info("the agent says its app is up", "url", e.URL)
		ss.note(view.Event{Kind: view.Health, Proto: e.Route.Proto, Name: e.Route.Name, URL: e.URL, Message: "up"})
	} else {
		why := wire.Printable(h.Reason, 200)
		ss.log.Info("the agent says its app is down", "url", e.URL, "reason", why)
		ss.note(view.Event{Kind: view.Health, Proto: e.Route.Proto, Name: e.Route.Name, URL: e.URL, Message: "down: " + why})
	}
	return wire.Response{}
}

// countDown tells a HealthObserver that an endpoint's app went down, or
// is no longer down.
func (s *Server) countDown(proto string, down bool) {
	if ho, ok := s.obs().(HealthObserver); ok {
		ho.EndpointDown(proto, down)
	}
}

// admits reports whether the agent tells a route's streams' verdict as
// soon as its app took them (router.Route.Admits): for a pool's member, on
// a session of wire.AdmitVersion or later.
func (ss *session) admits(pool bool) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return pool && ss.version >= wire.AdmitVersion
}

// bindOwner is whom the session's refused binds count against: its
// identity, or for an anonymous agent (each an identity of its own) its
// source address.
func (ss *session) bindOwner() string {
	if ss.srv.Authenticate == nil {
		return "source " + limits.SourceOf(ss.src).String()
	}
	return "identity " + ss.identity
}

// bindNames returns the names or ports to try for a bind, in order, and
// whether the agent chose them (one name or port) rather than the edge (a
// random name or a free port: a taken one is skipped).
func (s *Server) bindNames(b *wire.Bind) (names iter.Seq[string], chosen bool, err error) {
	switch b.Proto {
	case wire.ProtoHTTPS:
		if !s.servesHTTPS() {
			return nil, false, errors.New("this edge serves no https endpoints (it has no certificates); bind http or tls")
		}
		return s.hostNames(b.Name)
	case wire.ProtoHTTP, wire.ProtoTLS:
		return s.hostNames(b.Name)
	case wire.ProtoTCP:
		names, err := s.tcpPorts(b.Port)
		return names, b.Port != 0, err
	}
	return nil, false, fmt.Errorf("unsupported protocol %q", wire.Printable(b.Proto, 16))
}

// bindFirst binds r under the first of names that is free (the only one,
// when the agent chose it), and returns it, or why it could not.
func (ss *session) bindFirst(ctx context.Context, r router.Route, names iter.Seq[string], chosen bool, previous string) (router.Route, *wire.Error) {
	s := ss.srv
	for name := range names {
		r.Name, r.TunnelID = name, newID()
		if r.Proto != wire.ProtoTCP {
			if e := s.customerName(ctx, name, r.Identity); e != nil {
				return r, e
			}
			if err := s.operatorName(name); err != nil {
				if !chosen {
					continue // a random name: the next
				}
				return r, failure(wire.CodeNameTaken, "%s", err)
			}
		}
		err := ss.bindRoute(ctx, r, previous)
		switch {
		case err == nil:
			return r, nil
		case !chosen && (errors.Is(err, errPortUnavailable) || errors.Is(err, router.ErrNameTaken)):
			continue // a random name or port that is taken: the next
		case errors.Is(err, errPortUnavailable):
			return r, failure(wire.CodeUnavailable, "port unavailable: %s", name)
		case errors.Is(err, router.ErrNameTaken):
			msg := strings.TrimPrefix(err.Error(), router.ErrNameTaken.Error()+": ")
			until := s.heldUntil(r)
			hint := ""
			if !until.IsZero() && !strings.Contains(msg, " until ") {
				hint = fmt.Sprintf("; its owner's session ended, and the name is kept for them until %s UTC", until.UTC().Format(time.TimeOnly))
			}
			e := failure(wire.CodeNameTaken, "%s%s%s", msg, hint, s.anonymousHint(ctx, r))
			e.Until = until
			return r, e
		default:
			ss.log.Warn("bind", "err", err)
			return r, failure(wire.CodeUnavailable, msgStoreFailed)
		}
	}
	return r, failure(wire.CodeUnavailable, "no free name or port")
}

// anonymousHint explains a name taken between two agents without a
// token, which people take for one owner: for an anonymous r whose exact
// name another anonymous identity holds, it returns the hint to append
// to the refusal; "" otherwise.
func (s *Server) anonymousHint(ctx context.Context, r router.Route) string {
	if !strings.HasPrefix(r.Identity, anonymousPrefix) {
		return ""
	}
	routes, _ := s.lookup(ctx, r.Proto, strings.TrimPrefix(r.Name, "*."))
	for _, o := range routes {
		if o.Name == r.Name && o.Identity != r.Identity && strings.HasPrefix(o.Identity, anonymousPrefix) {
			return "; agents without a token are each an identity of their own: to share a pool, give them the same token"
		}
	}
	return ""
}

// heldUntil tells, for r's name taken while a reservation keeps it for
// another identity (the grace after that identity's session ended, or
// after a restart: rule 4 of router.Router), until when: unless its owner
// comes back, it is free then. Zero otherwise, and for a Router that does
// not tell (router.MemoryRouter and the record do).
func (s *Server) heldUntil(r router.Route) time.Time {
	h, ok := s.router().(interface {
		Holder(proto, name string) (string, time.Time, bool)
	})
	if !ok {
		return time.Time{}
	}
	protos := []string{r.Proto}
	if r.Proto != wire.ProtoTCP {
		protos = []string{wire.ProtoHTTP, wire.ProtoHTTPS, wire.ProtoTLS} // one namespace
	}
	for _, p := range protos {
		if identity, until, held := h.Holder(p, r.Name); held && identity != r.Identity && !until.IsZero() {
			return until
		}
	}
	return time.Time{}
}

// errPortUnavailable is a TCP port the edge could not listen on.
var errPortUnavailable = errors.New("edge: port unavailable")

// bindRoute binds r in the Router: for a TCP route, once the edge listens
// on its port. A name held by the agent's own previous session (its ticket
// said which) is taken over.
func (ss *session) bindRoute(ctx context.Context, r router.Route, previous string) error {
	s := ss.srv
	if r.Proto == wire.ProtoTCP {
		// The port must be ours to listen on before it is routed.
		if err := s.openTCP(r.Name); err != nil {
			ss.log.Debug("tcp endpoint", "port", r.Name, "err", err)
			return fmt.Errorf("%w: %w", errPortUnavailable, err)
		}
	}
	// The agent's own routes of its previous session give way: held by
	// an edge that has not noticed (or cannot: it died) that the agent
	// left it, or one that asked it to move.
	err := router.Move(ctx, s.router(), r, previous)
	if err != nil && r.Proto == wire.ProtoTCP {
		s.closeTCP(r.Name)
	}
	return err
}

// endpointOptions applies a bind's options to r, refusing any it does not
// know, and checks that a policy comes with its option and the option
// with a policy.
func (s *Server) endpointOptions(r *router.Route, opts map[string]string, rawPolicy []byte) error {
	withPolicy := false
	for k, v := range opts {
		switch k {
		case wire.OptPolicy:
			if v != wire.PolicyVersion {
				return fmt.Errorf("option %s: version %q: this edge reads version %s", k, wire.Printable(v, 32), wire.PolicyVersion)
			}
			withPolicy = true
		case wire.OptHealthCheck:
			if v != "1" {
				return fmt.Errorf("option %s: %q: want 1", k, wire.Printable(v, 32))
			}
		case wire.OptAppProtocol:
			if r.Proto != wire.ProtoHTTP && r.Proto != wire.ProtoHTTPS {
				return fmt.Errorf("option %s is for http and https endpoints", k)
			}
			switch v {
			case wire.AppProtocolHTTP1:
			case wire.AppProtocolH2C:
				r.AppProtocol = v
			default:
				return fmt.Errorf("option %s: %q: want %s or %s", k, wire.Printable(v, 32), wire.AppProtocolHTTP1, wire.AppProtocolH2C)
			}
		case wire.OptVerboseErrors:
			if r.Proto != wire.ProtoHTTP && r.Proto != wire.ProtoHTTPS {
				return fmt.Errorf("option %s is for http and https endpoints", k)
			}
			switch v {
			case "true":
				r.VerboseErrors = true
			case "false":
			default:
				return fmt.Errorf("option %s: %q: want true or false", k, wire.Printable(v, 32))
			}
		case wire.OptPath, wire.OptStripPrefix: // pathOptions, below
		default:
			return fmt.Errorf("unknown option %q", wire.Printable(k, 32))
		}
	}
	switch {
	case withPolicy && len(rawPolicy) == 0:
		return fmt.Errorf("option %s without a policy", wire.OptPolicy)
	case !withPolicy && len(rawPolicy) > 0:
		return fmt.Errorf("a policy without option %s=%s", wire.OptPolicy, wire.PolicyVersion)
	}
	return s.pathOptions(r, opts, rawPolicy)
}

// endpointTicket returns a fresh ticket saying that r's identity holds its
// name.
func (s *Server) endpointTicket(r router.Route) (string, error) {
	return s.signer.Sign(names.Ticket{Kind: names.TicketEndpoint, Issued: s.now(), Identity: r.Identity, Proto: r.Proto, Name: r.Name})
}

// bindPolicy reads a bind's policy (raw, its JSON; empty for none), sets
// r.Policy to the form routes carry, and compiles it with the operator's
// for r's protocol and identity; it returns the combined spec too (safe to
// log: it prints no secret). A policy the edge cannot read or enforce is
// bad_request; one it cannot set up now (an OIDC provider out of reach)
// is unavailable; the message is package policy's.
func (s *Server) bindPolicy(ctx context.Context, r *router.Route, raw []byte) (*policy.Policy, policy.Spec, *wire.Error) {
	if len(raw) == 0 {
		raw = []byte("null")
	}
	spec, err := policy.Parse(raw)
	if err == nil {
		r.Policy, err = specJSON(spec)
	}
	if err == nil && r.Policy != "" {
		// Compiled from the route's form, as the other edges compile it.
		spec, err = policy.Parse([]byte(r.Policy))
	}
	if err != nil {
		return nil, policy.Spec{}, policyFailure(err)
	}
	pol, combined, err := s.compilePolicy(ctx, *r, spec)
	if err != nil {
		return nil, policy.Spec{}, policyFailure(err)
	}
	return pol, combined, nil
}

func policyFailure(err error) *wire.Error {
	if errors.Is(err, policy.ErrUnavailable) {
		return failure(wire.CodeUnavailable, "%s", err)
	}
	return failure(wire.CodeBadRequest, "%s", err)
}
