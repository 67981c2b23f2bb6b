package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/sni"
)

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Min, Max int }

// ParsePortRange parses "20000-20100" or a single port "20000".
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, found := cutDash(s)
	min, err1 := strconv.Atoi(lo)
	max := min
	var err2 error
	if found {
		max, err2 = strconv.Atoi(hi)
	}
	r := PortRange{min, max}
	if err1 != nil || err2 != nil || !r.valid() {
		return PortRange{}, fmt.Errorf("edge: bad port range %q: want MIN-MAX within 1-65535", s)
	}
	return r, nil
}

func cutDash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '-' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func (r PortRange) valid() bool { return 1 <= r.Min && r.Min <= r.Max && r.Max <= 65535 }

func (r PortRange) contains(p int) bool { return r.valid() && r.Min <= p && p <= r.Max }

// ServeSNI serves public TLS on ln: each connection's server name is read
// with sni.Peek, without terminating TLS, and the untouched bytes go to an
// agent that bound that name (exact or wildcard) over tls; for a name bound
// over https, the edge terminates TLS itself and serves HTTP/2 or HTTP/1.1
// (see ACME and Certificates). A connection that is not
// TLS is decided on its first byte and handed to NotTLS (closed when nil);
// one whose hello is malformed, late or names no route is closed. It
// returns an error wrapping net.ErrClosed after Close or Shutdown.
func (s *Server) ServeSNI(ln net.Listener) error {
	s.init()
	s.mu.Lock()
	if s.TLSPort == "" {
		if _, port, err := net.SplitHostPort(ln.Addr().String()); err == nil {
			s.TLSPort = port
		}
	}
	s.mu.Unlock()
	if err := s.initECH(); err != nil {
		ln.Close()
		return err
	}
	if s.servesHTTPS() || len(s.ECHKeys) > 0 {
		s.serveTerminated()
	}
	return s.serveL4(s.publicListener(ln), s.handleSNI)
}

// serveL4 serves public TLS or TCP conns on ln with handle, tracking each
// conn so that Close ends it and Shutdown waits for it.
func (s *Server) serveL4(ln net.Listener, handle func(net.Conn)) error {
	return s.serve(ln, "public", func(c net.Conn) {
		if !s.trackConn(c, true) {
			c.Close()
			return
		}
		defer s.trackConn(c, false)
		handle(c)
	})
}

func (s *Server) handleSNI(c net.Conn) {
	hello, pc, err := (&sni.Peeker{Timeout: s.handshakeTimeout()}).Peek(c)
	if errors.Is(err, sni.ErrNotTLS) {
		if s.NotTLS != nil {
			s.NotTLS(pc)
			return
		}
		pc.Close()
		return
	}
	if err != nil {
		s.log().Debug("tls hello", "client", c.RemoteAddr().String(), "err", err)
		pc.Close()
		return
	}
	var ech *sni.ECHResult
	if s.ech.keys != nil && hello.ECH {
		res, err := s.ech.keys.Decrypt(hello)
		switch {
		case err == nil:
			ech = res
		case errors.Is(err, sni.ErrNoECH), errors.Is(err, sni.ErrECHNoKey), errors.Is(err, sni.ErrECHDecrypt):
			// GREASE, or a stale configuration: by the outer name.
			if s.ech.publicNames[hello.ServerName] && s.answersPublicName(hello) {
				s.terminate(pc)
				return
			}
		default:
			s.log().Debug("tls hello: ECH", "client", c.RemoteAddr().String(), "err", err)
			pc.Close()
			return
		}
	}
	route := hello
	if ech != nil {
		route = ech.Inner
	}
	proto, routes, err := s.chooseTLS(context.Background(), route)
	if err != nil {
		s.log().Info("routing unavailable", "proto", "tls", "name", hello.ServerName, "err", err)
		s.obs().Refused("routing_unavailable")
		pc.Close()
		return
	}
	if proto == wire.ProtoHTTPS {
		s.terminate(pc) // crypto/tls decrypts ECH itself, with the same keys
		return
	}
	s.obs().Conn(wire.ProtoTLS)
	if ech != nil {
		// Split mode: the agent's TLS server gets the inner hello; the
		// edge never sees the connection's plaintext.
		s.proxyRoutesWrapped(pc, wire.ProtoTLS, route.ServerName, route.ServerName, routes, ech.Wrap)
		return
	}
	s.proxyRoutes(pc, wire.ProtoTLS, hello.ServerName, hello.ServerName, routes)
}

// proxyL4 routes a public TLS or TCP conn to an agent and copies both ways
// until both sides are done.
func (s *Server) proxyL4(c net.Conn, proto, name, host string) {
	s.obs().Conn(proto)
	routes, err := s.router().Lookup(context.Background(), proto, name)
	if err != nil {
		s.log().Info("routing unavailable", "proto", proto, "name", name, "err", err)
		s.obs().Refused("routing_unavailable")
		c.Close()
		return
	}
	s.proxyRoutes(c, proto, name, host, routes)
}

// proxyRoutes routes a public TLS or TCP conn to the first reachable of
// routes and copies both ways until both sides are done.
func (s *Server) proxyRoutes(c net.Conn, proto, name, host string, routes []router.Route) {
	s.proxyRoutesWrapped(c, proto, name, host, routes, nil)
}

// proxyRoutesWrapped is proxyRoutes, with both conns wrapped by wrap (when
// not nil) once the agent's is open.
func (s *Server) proxyRoutesWrapped(c net.Conn, proto, name, host string, routes []router.Route, wrap func(client, backend net.Conn) (net.Conn, net.Conn)) {
	defer c.Close()
	if len(routes) == 0 {
		s.log().Debug("no route", "proto", proto, "name", name)
		s.obs().Refused("no_route")
		return
	}
	info := ConnInfo{Client: addrPort(c.RemoteAddr()), Host: host}
	release, ok := s.acquireShare(routes, info.Client)
	if !ok {
		s.log().Debug("client over its share of the endpoint", "proto", proto, "name", name, "client", info.Client.String())
		s.obs().Refused("client_limit")
		return
	}
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), s.handshakeTimeout())
	up, _, err := s.dialRoutes(ctx, routes, info)
	cancel()
	if err != nil {
		s.log().Info("agent unreachable", "proto", proto, "name", name, "client", info.Client.String(), "err", err)
		s.obs().Refused("agent_offline")
		return
	}
	if !s.trackConn(up, true) {
		up.Close()
		return
	}
	defer s.trackConn(up, false)
	if wrap != nil {
		c, up = wrap(c, up)
		defer up.Close()
	}
	in, out, err := pipe.JoinStreams(c, up, s.idleTimeout(10*time.Minute))
	s.obs().Bytes(proto, in, out)
	level := slog.LevelDebug
	if errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint) {
		level = slog.LevelInfo
	}
	s.log().Log(context.Background(), level, "conn", "proto", proto, "name", name, "client", info.Client.String(), "bytes_in", in, "bytes_out", out, "err", err)
}

// addrPort returns a conn address as a netip.AddrPort, IPv4 unmapped.
func addrPort(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// tcpEndpoint is a public TCP listener the edge opened for bound routes.
type tcpEndpoint struct {
	ln   net.Listener
	refs int // bound routes on this port
}

// tcpPorts returns the ports to try for a TCP bind: the one requested, or
// each port of the allowed range once, from a random start.
func (s *Server) tcpPorts(req int) (func() (string, bool), error) {
	r := s.TCPPorts
	if !r.valid() {
		return nil, errors.New("this edge serves no TCP endpoints")
	}
	if req != 0 {
		if !r.contains(req) {
			return nil, fmt.Errorf("port %d outside %d-%d", req, r.Min, r.Max)
		}
		done := false
		return func() (string, bool) {
			if done {
				return "", false
			}
			done = true
			return strconv.Itoa(req), false
		}, nil
	}
	n := r.Max - r.Min + 1
	start, i := rand.IntN(n), 0
	return func() (string, bool) {
		if i >= n {
			return "", false
		}
		p := r.Min + (start+i)%n
		i++
		return strconv.Itoa(p), true
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
// shared).
func (s *Server) watchRoutes() {
	rw, ok := s.Router.(router.RouteWatcher)
	if !ok {
		return
	}
	s.watchOnce.Do(func() {
		opened := map[router.RouteKey]string{} // remote tcp routes this edge listens for, and their port
		stop := rw.WatchRoutes(func(r router.Route, bound bool) {
			if r.Proto != "tcp" || r.Edge == s.ID {
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
