package edge

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"

	"github.com/tunnelkit/tunnelkit/edge/acme"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/sni"
)

// Public TLS: the ServeSNI listeners. Each connection's ClientHello is
// peeked at, never consumed, and its server name (the inner one, when the
// edge holds the ECH key that decrypts it) looked up among tls and https
// routes: a tls route gets the bytes untouched (conn.go), an https route
// makes the edge complete the handshake itself (tls.go) and serve HTTP on
// the connection. So one port serves both, chosen by name, and agent
// sessions beside them, chosen by ALPN (tlsagents.go).

// ServeSNI serves public TLS on ln: each connection's server name is read
// with sni.Peek, without terminating TLS, and the untouched bytes go to an
// agent that bound that name (exact or wildcard) over tls; for a name bound
// over https, the edge terminates TLS itself and serves HTTP/2 or HTTP/1.1
// (see ACME and Certificates). A hello that offers the agent protocol
// "tunnelkit/1" by ALPN, for a name not passed through, opens an agent
// session, served as ServeAgents serves one (see NoAgentsOnTLS). A
// connection that is not TLS is decided on its first byte and handed to
// NotTLS (closed when nil); one whose hello is malformed, late or names no
// route is closed, and so is one past Limits.ConnsPerSource (one past
// Limits.HandshakesPerSource waits its turn). It returns ErrServerClosed after Close or
// Shutdown.
func (s *Server) ServeSNI(ln net.Listener) error {
	s.init()
	if s.cfgErr != nil {
		ln.Close()
		return s.cfgErr
	}
	s.notePort(&s.tlsPort, ln)
	if err := s.initECH(); err != nil {
		ln.Close()
		return err
	}
	if s.servesHTTPS() || len(s.ECHKeys) > 0 {
		s.serveTerminated()
	}
	return s.serveL4(s.perSource(s.clientFirstListener(ln)), s.handleSNI)
}

func (s *Server) handleSNI(c net.Conn) {
	hello, pc, err := (&sni.Peeker{Timeout: s.cfg().handshake}).Peek(c)
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
	if ech == nil && s.ech.publicNames[hello.ServerName] {
		// The public names are the operator's (no agent binds them, see
		// operatorName): the edge answers them itself, whatever routes
		// the Router holds, and sends a client whose ECH configuration
		// is stale its retry configurations.
		if s.tlsAgent(route, false) {
			s.serveTLSAgent(c, pc)
			return
		}
		s.terminate(pc)
		return
	}
	if route.ServerName == "" && s.tlsAgent(route, false) {
		// An agent that dialled an IP address: no name, so nothing to
		// pass through (no route has the empty name).
		s.serveTLSAgent(c, pc)
		return
	}
	proto, routes, err := s.chooseTLS(context.Background(), route)
	if err != nil {
		s.log().Info("routing unavailable", "proto", "tls", "name", hello.ServerName, "err", err)
		s.obs().Refused(ReasonRoutingUnavailable)
		pc.Close()
		return
	}
	if s.tlsAgent(route, proto == wire.ProtoTLS && len(routes) > 0) {
		s.serveTLSAgent(c, pc)
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

// chooseTLS decides whether a TLS connection for hello's server name is
// terminated here (an https route) or passed through (a tls route), and
// returns the routes of the one chosen. The more specific pattern wins (an
// exact name over a wildcard, a longer wildcard over a shorter one); when
// the same pattern has both, the connection is passed through, but for an
// ACME challenge, which the edge answers.
func (s *Server) chooseTLS(ctx context.Context, hello *sni.ClientHello) (proto string, routes []router.Route, err error) {
	name := hello.ServerName
	tlsRoutes, err := s.lookup(ctx, wire.ProtoTLS, name)
	if err != nil {
		return "", nil, err
	}
	var httpsRoutes []router.Route
	if s.servesHTTPS() {
		if httpsRoutes, err = s.lookup(ctx, wire.ProtoHTTPS, name); err != nil {
			return "", nil, err
		}
	}
	switch {
	case len(httpsRoutes) == 0:
		return wire.ProtoTLS, tlsRoutes, nil
	case len(tlsRoutes) == 0:
		return wire.ProtoHTTPS, httpsRoutes, nil
	case slices.Contains(hello.ALPN, acme.ALPNProto):
		return wire.ProtoHTTPS, httpsRoutes, nil
	case moreSpecific(httpsRoutes[0].Name, tlsRoutes[0].Name):
		return wire.ProtoHTTPS, httpsRoutes, nil
	}
	return wire.ProtoTLS, tlsRoutes, nil
}

// moreSpecific reports whether pattern a matches fewer names than b, both
// matching the same host: an exact name beats a wildcard, and a longer
// wildcard a shorter one.
func moreSpecific(a, b string) bool {
	aw, bw := strings.HasPrefix(a, "*."), strings.HasPrefix(b, "*.")
	if aw != bw {
		return bw
	}
	return len(a) > len(b)
}
