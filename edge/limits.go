package edge

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/router"
)

// The edge's defences against strangers, kept in package limits: a bound
// on agent connections that have not said hello, a throttle on failed
// authentication per source, a fair share of each endpoint per public
// client, bounds per source on public connections and TLS handshakes, and
// quotas of endpoints. Here is what the edge makes of them: the Reasons it
// counts, and what it logs and tells an agent.

// SetLimits changes the Server's Limits while it runs: each bound holds
// from the next time it is asked (a hello, a bind, a connection, a
// handshake, a failed authentication or bind), and what is held already
// stays, above a lowered bound too. The budgets of failed authentications
// and refused binds start anew. Two bounds hold only for what starts
// after: SessionUnread for the sessions that say hello after, and
// ConnsPerSource for listeners served after when it was off (zero or
// negative) at theirs; StreamWindow does not change (sessions settle it
// once). The Limits field keeps what the Server started with. It fails,
// changing nothing, once the Server is closed.
func (s *Server) SetLimits(l Limits) error {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	c := *s.cfg()
	c.setLimits(l)
	s.conf.Store(&c)
	s.pending.SetBounds(c.pendingSessions, c.pendingPerSource)
	s.quotas.SetBounds(c.endpoints, c.endpointsPerID, c.endpointsPerSource)
	s.auth.SetPerMinute(c.authFailures)
	s.binds.Set(bindsPerSecond(c.refusedBinds), c.refusedBinds)
	for _, n := range s.connCounts {
		n.SetMax(c.connsPerSource)
	}
	s.term.handshakes.SetMax(c.handshakesPerSource)
	return nil
}

// bindsPerSecond is the rate of refused binds of an owner once
// Limits.RefusedBinds is spent: one a second, or none for no bound.
func bindsPerSecond(refusedBinds int) float64 {
	if refusedBinds <= 0 {
		return 0
	}
	return 1
}

// endpointKey is an endpoint: a protocol and a name pattern, with its
// path after it (the path starts with "/", which no pattern holds).
type endpointKey = names.Endpoint

// endpointOf returns the endpoint of r.
func endpointOf(r router.Route) endpointKey {
	return endpointKey{Proto: r.Proto, Name: r.Name + r.Path}
}

// addPending registers an agent conn that has not said hello yet (see
// limits.Pending.Add), and closes the one that makes room for it, if any.
func (s *Server) addPending(c net.Conn) *limits.PendingConn {
	pc, victim, from, perSource := s.pending.Add(c, limits.SourceOf(c.RemoteAddr()))
	if victim == nil {
		return pc
	}
	s.obs().Refused(ReasonPendingLimit) // before the close: whoever sees the close sees the count
	victim.Close()
	if n := s.evicted.Add(1); n == 1 || n%1000 == 0 {
		why := "too many agent connections waiting for their hello; closing the oldest of the source that has the most"
		if perSource {
			why = "too many agent connections of one source waiting for their hello; closing its oldest"
		}
		s.log().Warn(why, "source", from.String(), "max", s.cfg().pendingSessions, "max_per_source", s.cfg().pendingPerSource, "closed_so_far", n)
	}
	return pc
}

// donePending forgets a conn once it said hello or ended. Removing it twice
// is harmless.
func (s *Server) donePending(pc *limits.PendingConn) { s.pending.Done(pc) }

// perSource wraps ln, a public listener, to bound the connections each
// client source holds on it, unless that bound is off. The connections
// refused are logged at the Debug level only: a stranger chooses how many
// it opens.
func (s *Server) perSource(ln net.Listener) net.Listener {
	if s.cfg().connsPerSource <= 0 {
		return ln
	}
	l := &limits.Listener{Listener: ln, Conns: limits.Count{Max: s.cfg().connsPerSource}}
	s.mu.Lock()
	s.connCounts = append(s.connCounts, &l.Conns) // for SetLimits
	s.mu.Unlock()
	l.Refused = func(c net.Conn) {
		s.obs().Refused(ReasonConnLimit)
		s.log().Debug("public connection refused: its source holds its share of the listener", "client", c.RemoteAddr().String(), "listener", ln.Addr().String(), "max", s.cfg().connsPerSource)
	}
	return l
}

// clientCap returns how many streams of the endpoint of routes one client
// may hold: ClientShare of the streams of its sessions; zero for no bound.
func (s *Server) clientCap(routes []router.Route) int {
	share, perSession := s.cfg().clientShare, s.cfg().streamsPerSession
	if share == 0 || perSession == 0 {
		return 0
	}
	sessions := map[string]struct{}{}
	for _, r := range routes {
		sessions[r.Edge+"/"+r.SessionID] = struct{}{}
	}
	return max(1, int(share*float64(len(sessions)*perSession)))
}

// acquireShare takes one of client's share of the endpoint of routes, or
// reports false when the client holds all of it. release gives it back.
func (s *Server) acquireShare(routes []router.Route, client netip.AddrPort) (release func(), ok bool) {
	if len(routes) == 0 {
		return func() {}, true
	}
	e := endpointOf(routes[0])
	return s.shares.Acquire(e, limits.Source(client.Addr()), s.clientCap(routes))
}

// quotaRefusal is a bind refused for a bound on endpoints: the reason, and
// what the agent is told.
type quotaRefusal struct {
	reason  Reason
	message string
}

// takeEndpoint counts one more endpoint of o, unless that breaks a quota,
// which it then returns (see limits.Quotas.Take).
func (s *Server) takeEndpoint(o limits.Owner, name endpointKey) (*limits.Kept, *quotaRefusal) {
	took, broken, max := s.quotas.Take(o, name, s.now())
	switch broken {
	case limits.QuotaEdge:
		return nil, &quotaRefusal{ReasonEdgeEndpointLimit, fmt.Sprintf("this edge holds as many endpoints as it takes (%d, every agent's together); try again later", max)}
	case limits.QuotaIdentity:
		return nil, &quotaRefusal{ReasonIdentityEndpointLimit, fmt.Sprintf("too many endpoints for this identity on this edge (at most %d, over all its sessions)", max)}
	case limits.QuotaSource:
		return nil, &quotaRefusal{ReasonSourceEndpointLimit, fmt.Sprintf("too many endpoints for anonymous agents from %s on this edge (at most %d)", o.Source, max)}
	}
	return took, nil
}

// keepEndpoint ends the count of an endpoint of o whose session ended,
// its name kept for o's identity until until (see limits.Quotas.Keep).
func (s *Server) keepEndpoint(o limits.Owner, name endpointKey, until time.Time) {
	s.quotas.Keep(o, name, until, s.now())
}
