package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The edge's side of a relay stream (package relay): a stream that another
// edge of the cluster opened for a route this edge holds.

// ServeRelayStream serves a stream that another edge of the cluster
// opened over a relay session (package relay), and closes it: it reads the
// stream's header, which names an agent session, an endpoint of it, the
// client and the host, and connects the stream to the agent, within
// Timeouts.Handshake, only if this edge holds that session now, with that
// endpoint bound (or bound by a bind under way), of the stream's
// protocol, answering for the stream's host: the route a peer could have
// looked up. Otherwise it closes the stream (ReasonRelayRefused, logged
// at the Debug level). peer names the other edge, for the log. It
// returns when the connection ends.
func (s *Server) ServeRelayStream(st net.Conn, peer string) {
	defer st.Close()
	s.init()
	st.SetReadDeadline(time.Now().Add(s.cfg().handshake))
	session, h, err := wire.ReadRelayHeader(st)
	if err != nil {
		s.log().Debug("relay stream header", "edge", peer, "err", err)
		return
	}
	st.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
	defer cancel()
	r, err := s.heldRoute(ctx, session, h)
	if err != nil {
		// A route that went while the stream was on its way, or a forged
		// one: the other edge hears it as a stream ending before the
		// agent's reply.
		s.obs().Refused(ReasonRelayRefused)
		s.log().Debug("relay stream refused", "edge", peer, "err", err)
		return
	}
	up, err := s.dialRaw(ctx, r, ConnInfo{Client: h.Client, Host: h.Host})
	cancel()
	if errors.Is(err, ErrAppDown) {
		// Said for the agent: the other edge tries the pool's other
		// members, and answers app_unhealthy when they are down too.
		st.Write(wire.AppendReply(nil, wire.Reply{Status: wire.ReplyAppDown, Message: "the app is down"}))
		return
	}
	if err != nil {
		// The other edge hears it as a stream ending before the agent's
		// reply, and tries the route's other agents.
		s.log().Info("relay: agent unreachable", "edge", peer, "session", wire.Printable(session, 64), "err", err)
		return
	}
	if !s.trackConn(up, true) {
		up.Close()
		return
	}
	defer s.trackConn(up, false)
	pipe.JoinStreams(st, up, s.cfg().connIdle)
}

// heldRoute returns the route a relay stream names, if this edge holds it
// now: the stream's session is an agent session of this Server, its
// tunnel an endpoint bound on that session, of the stream's protocol, and
// its host one that the endpoint's name answers for. A tunnel the session
// does not hold while binds are under way on it is looked for again once
// they are done (within ctx): the Router shows a bind to the other edges
// (etcd's watchers may hear of it first) before the bind is done here.
func (s *Server) heldRoute(ctx context.Context, session string, h wire.ProxyHeader) (router.Route, error) {
	s.mu.Lock()
	ss := s.sessions[session]
	s.mu.Unlock()
	if ss == nil {
		return router.Route{}, fmt.Errorf("%w: %s", ErrNoSession, wire.Printable(session, 64))
	}
	e, ok := ss.endpoint(ctx, h.TunnelID)
	var r router.Route
	if ok {
		r = e.Route
	}
	switch {
	case !ok:
		return router.Route{}, fmt.Errorf("edge: session %s holds no endpoint %s", wire.Printable(session, 64), wire.Printable(h.TunnelID, 64))
	case r.Proto != h.Proto:
		return router.Route{}, fmt.Errorf("edge: endpoint %s is %s, not %s", r.Name, r.Proto, wire.Printable(h.Proto, 16))
	case !names.AnswersFor(r, h.Host):
		return router.Route{}, fmt.Errorf("edge: endpoint %s %s does not answer for host %q", r.Proto, r.Name, wire.Printable(h.Host, 256))
	}
	return r, nil
}

// endpoint returns the endpoint of tunnelID bound on the session; while
// binds are under way on it, once they are done, within ctx.
func (ss *session) endpoint(ctx context.Context, tunnelID string) (*book.Endpoint, bool) {
	for {
		ss.mu.Lock()
		e, ok := ss.endpointLocked(tunnelID)
		if ok || ss.binding == 0 || ss.closed {
			ss.mu.Unlock()
			return e, ok
		}
		if ss.bindsDone == nil {
			ss.bindsDone = make(chan struct{})
		}
		done := ss.bindsDone
		ss.mu.Unlock()
		ss.log.Debug("relay stream waits for the binds under way", "tunnel", wire.Printable(tunnelID, 64))
		select {
		case <-done:
		case <-ctx.Done():
			return nil, false
		}
	}
}
