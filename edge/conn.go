package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// Public TLS and TCP connections joined to an agent: once the endpoint's
// traffic policy let the client in, the first reachable route's stream
// gets the client's bytes untouched, both ways, half-closes kept, until
// both sides are done or the connection is idle for Timeouts.ConnIdle.

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

// proxyL4 routes a public TLS or TCP conn to an agent and copies both ways
// until both sides are done.
func (s *Server) proxyL4(c net.Conn, proto, name, host string) {
	s.obs().Conn(proto)
	routes, err := s.lookup(context.Background(), proto, name)
	if err != nil {
		s.log().Info("routing unavailable", "proto", proto, "name", name, "err", err)
		s.obs().Refused(ReasonRoutingUnavailable)
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
		s.obs().Refused(ReasonNoRoute)
		return
	}
	info := ConnInfo{Client: addrPort(c.RemoteAddr()), Host: host}
	conn := policy.Conn{Client: info.Client}
	if la, ok := c.LocalAddr().(*net.TCPAddr); ok {
		conn.ServerPort = la.Port
	}
	if proto == wire.ProtoTLS {
		conn.ServerName = name
	}
	if !s.acceptPolicy(proto, name, routes, conn) {
		return
	}
	release, ok := s.acquireShare(routes, info.Client)
	if !ok {
		s.log().Debug("client over its share of the endpoint", "proto", proto, "name", name, "client", info.Client.String())
		s.obs().Refused(ReasonClientLimit)
		return
	}
	defer release()
	up, err := s.dialL4(routes, info)
	if err != nil {
		reason := ReasonAgentOffline
		switch {
		case errors.Is(err, errAllDown):
			reason = ReasonAppUnhealthy
		case errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint):
			reason = ReasonAppUnreachable
		}
		s.log().Info("agent unreachable", "proto", proto, "name", name, "client", info.Client.String(), "err", err)
		s.obs().Refused(reason)
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
	in, out, err := pipe.JoinStreams(c, up, s.cfg().connIdle)
	s.obs().Bytes(proto, in, out)
	level := slog.LevelDebug
	if errors.Is(err, ErrAppUnreachable) || errors.Is(err, ErrNoEndpoint) {
		level = slog.LevelInfo
	}
	s.log().Log(context.Background(), level, "conn", "proto", proto, "name", name, "client", info.Client.String(), "bytes_in", in, "bytes_out", out, "err", err)
}

// dialL4 dials a stream for a public TLS or TCP conn to the first of
// routes that takes it: a route whose agent says when its app took a conn
// (router.Route.Admits) is waited for, before any of the client's bytes
// are read, and when its agent refuses the conn (its app cannot be
// reached) the pool's next member is tried, each once, so that the
// client's first bytes reach a member whose app took them. When every
// member's app is down, the error wraps errAllDown.
func (s *Server) dialL4(routes []router.Route, info ConnInfo) (net.Conn, error) {
	down := true           // every member that failed so far is down
	var out []router.Route // the members that could not be dialled
	failed := func(r router.Route, err error) {
		out = append(out, r)
		down = down && errors.Is(err, ErrAppDown)
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
		up, r, err := s.dialRoutes(ctx, routes, info, failed)
		cancel()
		if err != nil {
			if down && everyDown(err) {
				err = fmt.Errorf("%w: %w", errAllDown, err)
			}
			return nil, err
		}
		rep, ok := up.(replier)
		if !r.Admits || !ok {
			return up, nil
		}
		up.SetReadDeadline(time.Now().Add(s.cfg().handshake))
		err = rep.ReadReply()
		up.SetReadDeadline(time.Time{})
		if err == nil {
			s.reached(r)
			return up, nil
		}
		up.Close()
		if !errors.Is(err, ErrAppUnreachable) && !errors.Is(err, ErrNoEndpoint) {
			return nil, err
		}
		s.unreached(r)
		down = down && errors.Is(err, ErrAppDown)
		// The next round leaves out this member, and those that could not
		// be dialled in this one.
		out = append(out, r)
		routes = slices.DeleteFunc(slices.Clone(routes), func(o router.Route) bool {
			return slices.ContainsFunc(out, func(f router.Route) bool { return f.Key() == o.Key() })
		})
		if len(routes) == 0 {
			if down {
				err = fmt.Errorf("%w: %w", errAllDown, err)
			}
			return nil, err
		}
	}
}

// errAllDown is a conn of a pool whose members' apps are all down.
var errAllDown = errors.New("edge: the app of every member is down")
