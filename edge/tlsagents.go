package edge

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/sni"
)

// Agent sessions on the public TLS port (docs/PROTOCOL.md, "Transport"), so
// that an agent whose network lets out port 443 alone reaches the edge
// there. An agent offers the ALPN protocol wire.ALPN in its ClientHello;
// handleSNI decides by the hello, as for any client: a hello whose name
// is passed through (a tls endpoint's) goes to that endpoint untouched,
// whatever it offers, and any other hello that offers wire.ALPN is an
// agent's (tlsAgent says which). The edge completes its handshake with
// its own certificate and serves the session as ServeAgents does.

// agentsOnTLS reports whether the ServeSNI listeners take agent sessions:
// unless NoAgentsOnTLS, whenever the edge has a source of certificates.
func (s *Server) agentsOnTLS() bool {
	return !s.NoAgentsOnTLS && s.servesHTTPS()
}

// tlsAgent reports whether a hello on a ServeSNI listener opens an agent
// session, given route, the hello the edge routes by (the inner one when
// it decrypted ECH), and whether the edge would pass it through (a tls
// endpoint has its name). A hello for a name passed through is never an
// agent's: it is the endpoint's, whatever it offers.
func (s *Server) tlsAgent(route *sni.ClientHello, passThrough bool) bool {
	return !passThrough && s.agentsOnTLS() && slices.Contains(route.ALPN, wire.ALPN)
}

// serveTLSAgent serves the session of an agent that came to a ServeSNI
// listener as serveSession serves one from an agent port, once the edge
// completed its TLS handshake: c is the conn with its hello still to be
// read, and public the conn as the listener tracks it, which the
// session's own tracking replaces once the handshake is done (a session
// is not a public connection that Shutdown waits for). The handshake
// counts against Limits.HandshakesPerSource, as any the edge terminates,
// and against Limits.PendingSessions, as any agent connection before its
// hello.
func (s *Server) serveTLSAgent(public, c net.Conn) {
	t := s.tlsTerm()
	src := limits.SourceOf(c.RemoteAddr())
	if !t.handshakes.Acquire(src, time.Now().Add(s.cfg().handshake)) {
		s.log().Debug("agent handshake refused: its source had its handshakes under way until the handshake timeout", "agent_addr", c.RemoteAddr().String(), "max", s.cfg().handshakesPerSource)
		s.obs().Refused(ReasonHandshakeLimit)
		c.Close()
		return
	}
	held := true
	release := func() {
		if held {
			held = false
			t.handshakes.Release(src)
		}
	}
	defer release() // when the session is refused before its handshake
	s.serveAgent(c, func(c net.Conn) (net.Conn, error) {
		defer release()
		defer s.trackConn(public, false)
		return s.agentHandshake(c)
	})
}

// agentHandshake completes the TLS handshake of an agent on the public
// TLS port, within the handshake timeout, and checks that it selected
// wire.ALPN: a client that did not offer it gets nothing of the agent
// protocol.
func (s *Server) agentHandshake(c net.Conn) (net.Conn, error) {
	turn, cfg := s.turnTLS(c, s.tlsTerm().agents)
	tc := tls.Server(wire.BatchWrites(turn), cfg)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
	defer cancel()
	c.SetDeadline(time.Now().Add(s.cfg().handshake))
	err := tc.HandshakeContext(ctx)
	turn.done()
	if err != nil {
		return nil, fmt.Errorf("edge: agent TLS handshake: %w", err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != wire.ALPN {
		return nil, fmt.Errorf("edge: agent TLS handshake selected %q, not %s", p, wire.ALPN)
	}
	return tc, nil
}
