package edge

import (
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// TCP endpoints: a public port each, opened while a route is bound on it
// (on every edge of a cluster, see watchRoutes), whose connections are
// joined to the agent byte for byte (conn.go).

// tcpPorts returns the ports to try for a TCP bind: the one requested, or
// each port of the allowed range once, from a random start.
func (s *Server) tcpPorts(req int) (iter.Seq[string], error) {
	r := s.TCPPorts
	if !r.valid() {
		return nil, errors.New("this edge serves no TCP endpoints")
	}
	if req != 0 {
		if !r.contains(req) {
			return nil, fmt.Errorf("port %d outside %d-%d", req, r.Min, r.Max)
		}
		return func(yield func(string) bool) { yield(strconv.Itoa(req)) }, nil
	}
	n := r.Max - r.Min + 1
	start := rand.IntN(n)
	return func(yield func(string) bool) {
		for i := range n {
			if !yield(strconv.Itoa(r.Min + (start+i)%n)) {
				return
			}
		}
	}, nil
}

// openTCP makes sure the edge listens on port, counting one more route.
func (s *Server) openTCP(port string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	if ep := s.tcp[port]; ep != nil {
		ep.refs++
		return nil
	}
	raw, err := net.Listen("tcp", net.JoinHostPort(s.tcpListenHost(), port))
	if err != nil {
		return err
	}
	ln := s.publicListener(raw)
	if s.tcp == nil {
		s.tcp = map[string]*tcpEndpoint{}
	}
	s.tcp[port] = &tcpEndpoint{ln: ln, refs: 1}
	s.wg.Go(func() {
		s.serveL4(ln, func(c net.Conn) { s.proxyL4(c, wire.ProtoTCP, port, "") })
	})
	return nil
}

// closeTCP counts one route less on port and stops listening at zero.
func (s *Server) closeTCP(port string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ep := s.tcp[port]
	if ep == nil {
		return
	}
	if ep.refs--; ep.refs <= 0 {
		ep.ln.Close()
		delete(s.tcp, port)
	}
}

func (s *Server) tcpListenHost() string {
	if s.TCPListenHost == "" {
		return "127.0.0.1"
	}
	return s.TCPListenHost
}

// tcpURLHost is the host written in TCP endpoints' URLs.
func (s *Server) tcpURLHost() string {
	h := s.tcpListenHost()
	if a, err := netip.ParseAddr(h); err == nil && a.IsUnspecified() && s.Domain != "" {
		return s.Domain
	}
	return h
}

// watchRoutes makes the edge listen on the ports of TCP endpoints other
// edges hold, while they exist, when its router.Router can be shared (a router.Router
// set, which is a router.RouteWatcher; the Server's own in-memory one is not
// shared), and drop the traffic policies it compiled for routes of other
// edges that went, and close the upstreams to them once idle (a route
// moved: the agent's edge waits for them to drain).
func (s *Server) watchRoutes() {
	rw, ok := s.Router.(router.RouteWatcher)
	if !ok {
		return
	}
	s.watchOnce.Do(func() {
		opened := map[router.RouteKey]string{} // remote tcp routes this edge listens for, and their port
		stop := rw.WatchRoutes(func(r router.Route, bound bool) {
			if r.Edge == s.ID {
				return
			}
			if !bound {
				s.forgetPolicy(r)   // compiled on first use here, if it was
				s.ups.CloseRoute(r) // the relayed upstreams of public conns that sent no request since
			}
			if r.Proto != "tcp" {
				return
			}
			k := r.Key()
			switch _, had := opened[k]; {
			case bound && !had:
				if err := s.openTCP(r.Name); err != nil {
					s.log().Warn("tcp endpoint of another edge", "port", r.Name, "edge", r.Edge, "err", err)
					return
				}
				opened[k] = r.Name
			case !bound && had:
				delete(opened, k)
				s.closeTCP(r.Name)
			}
		})
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			stop()
			return
		}
		s.stopWatch = stop
		s.mu.Unlock()
	})
}

// stopWatching stops watching the Router's routes.
func (s *Server) stopWatching() {
	s.mu.Lock()
	stop := s.stopWatch
	s.stopWatch = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
}
