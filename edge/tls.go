package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/acme"
	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/sni"
)

// TLS the edge terminates: for https:// endpoints (with the operator's
// certificates or ones from ACME, see package acme, serving HTTP/2 or HTTP/1.1
// by ALPN on the connection, through the same reverse proxy as plain
// HTTP), and for the public names of its ECH keys (retry configurations).
// Each client source has at most Limits.HandshakesPerSource handshakes
// under way; its further connections wait their turn.

// terminating is the TLS the edge terminates for https endpoints: its
// configuration and the HTTP server its connections go to.
type terminating struct {
	once   sync.Once
	config *tls.Config
	agents *tls.Config   // of agent sessions on the public TLS port (tlsagents.go)
	acme   *acme.Manager // nil without ACME
	leaves []*tls.Certificate
	queue  *pipe.Queue
	hs     *http.Server
	// handshakes bounds the handshakes under way per client source.
	handshakes limits.Count
	serve      sync.Once
}

// servesHTTPS reports whether the server has any source of certificates,
// which https endpoints need.
func (s *Server) servesHTTPS() bool {
	return len(s.Certificates) > 0 || s.GetCertificate != nil || s.ACME != nil
}

// tlsTerm returns the server's TLS termination, set up on first use.
func (s *Server) tlsTerm() *terminating {
	t := &s.term
	t.once.Do(func() {
		for i := range s.Certificates {
			c := s.Certificates[i]
			if c.Leaf == nil && len(c.Certificate) > 0 {
				c.Leaf, _ = x509.ParseCertificate(c.Certificate[0])
			}
			t.leaves = append(t.leaves, &c)
		}
		protos := []string{"h2", "http/1.1"}
		if a := s.ACME; a != nil {
			m := acme.New(a, acme.Options{
				Names:        acmeNames{s},
				Logger:       s.log(),
				ID:           s.ID,
				Refused:      func() { s.obs().Refused(ReasonACMEBudget) },
				CheckTimeout: s.cfg().handshake,
			})
			s.mu.Lock() // for stopACME, which may run meanwhile
			t.acme = m
			s.mu.Unlock()
			protos = append(protos, acme.ALPNProto)
		}
		t.config = &tls.Config{
			MinVersion:               tls.VersionTLS12,
			NextProtos:               protos,
			GetCertificate:           s.certificate,
			EncryptedClientHelloKeys: s.ECHKeys,
		}
		// Names whose policy asks for client certificates get a
		// configuration of their own; the others this one.
		base := t.config
		t.config.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			return s.policyTLS(hello, base)
		}
		t.agents = s.agentTLSConfig()
		t.queue = pipe.NewQueue(queueAddr{})
		t.handshakes.Stop = s.stopping
		t.handshakes.SetMax(s.cfg().handshakesPerSource)
		t.hs = s.newHTTPServer(http.HandlerFunc(s.serveHTTPS), "https")
		p := new(http.Protocols)
		p.SetHTTP1(true)
		p.SetHTTP2(true)
		t.hs.Protocols = p
	})
	return t
}

// certificate returns the certificate for a terminated handshake:
// GetCertificate's, else the first of Certificates that covers the name,
// else one from ACME.
func (s *Server) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	t := s.tlsTerm()
	if slices.Contains(hello.SupportedProtos, acme.ALPNProto) {
		if t.acme == nil {
			return nil, errors.New("edge: an ACME challenge, and this edge uses no ACME")
		}
		return t.acme.GetCertificate(hello)
	}
	if s.GetCertificate != nil {
		c, err := s.GetCertificate(hello)
		if c != nil || err != nil {
			return c, err
		}
	}
	for _, c := range t.leaves {
		if hello.SupportsCertificate(c) == nil {
			return c, nil
		}
	}
	if t.acme != nil {
		return t.acme.GetCertificate(hello)
	}
	return nil, fmt.Errorf("edge: no certificate for %q", hello.ServerName)
}

// terminate completes the TLS handshake of a public connection for an
// https endpoint and hands it to the https HTTP server, once the client's
// source has fewer than Limits.HandshakesPerSource handshakes under way
// (it is closed if that takes longer than Timeouts.Handshake).
func (s *Server) terminate(c net.Conn) {
	t := s.tlsTerm()
	src := limits.SourceOf(c.RemoteAddr())
	if !t.handshakes.Acquire(src, time.Now().Add(s.cfg().handshake)) {
		s.log().Debug("tls handshake refused: its source had its handshakes under way until the handshake timeout", "client", c.RemoteAddr().String(), "max", s.cfg().handshakesPerSource)
		s.obs().Refused(ReasonHandshakeLimit)
		c.Close()
		return
	}
	tc := tls.Server(c, t.config)
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
	c.SetDeadline(time.Now().Add(s.cfg().handshake))
	err := tc.HandshakeContext(ctx)
	cancel()
	t.handshakes.Release(src)
	if err != nil {
		s.log().Debug("tls handshake", "client", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == acme.ALPNProto {
		// A CA validating a TLS-ALPN-01 challenge: the handshake was all.
		tc.Close()
		return
	}
	if !t.queue.Push(tc) {
		tc.Close()
	}
}

// serveTerminated serves the HTTP of terminated TLS connections until the
// server closes. ServeSNI starts it.
func (s *Server) serveTerminated() {
	t := s.tlsTerm()
	t.serve.Do(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			t.queue.Close()
			return
		}
		if s.servers == nil {
			s.servers = map[*http.Server]struct{}{}
		}
		s.servers[t.hs] = struct{}{}
		s.wg.Go(func() { t.hs.Serve(t.queue) })
		if t.acme != nil {
			// Closing the server closes the queue (t.hs serves it),
			// which stops the certificates' upkeep (Close stops the
			// orders).
			s.wg.Go(func() { t.acme.Run(t.queue.Done()) })
		}
	})
}

// ACME is how an edge gets certificates from an ACME CA (see Server.ACME):
// package acme's Config.
type ACME = acme.Config

// stopACME stops the orders of the ACME manager, if it was made, and
// waits for them.
func (s *Server) stopACME() {
	s.mu.Lock()
	m := s.term.acme
	s.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// acmeNames tells the ACME manager who holds a name: the identity of the
// https route bound to it exactly. The names of anonymous agents (see
// anonymousPrefix), which any client can have as many of as it likes,
// have one owner between them, and so one identity's budget of orders; an
// identity that this edge's Authenticate gave is its own even if it looks
// anonymous, and another edge's anonymous agents (a route of another
// edge, see Relay) are anonymous here too.
type acmeNames struct{ s *Server }

func (n acmeNames) Holder(ctx context.Context, name string) (acme.Holder, bool, error) {
	s := n.s
	routes, err := s.lookup(ctx, wire.ProtoHTTPS, name)
	for _, r := range routes {
		if r.Name != name {
			continue
		}
		owner := r.Identity
		if strings.HasPrefix(r.Identity, anonymousPrefix) && (s.Authenticate == nil || r.Edge != s.ID) {
			owner = anonymousOwner
		}
		return acme.Holder{Identity: r.Identity, Owner: owner}, true, nil
	}
	return acme.Holder{}, false, err
}

// anonymousOwner is the owner of every anonymous agent's names, in the
// ACME order budget: one identity's budget for them all.
const anonymousOwner = "anonymous agents"

// queueAddr is the address of the queue of TLS conns terminated here.
type queueAddr struct{}

func (queueAddr) Network() string { return "tls" }
func (queueAddr) String() string  { return "terminated-tls" }

// echState is the Server's ECH keys, ready to decrypt hellos.
type echState struct {
	once        sync.Once
	err         error
	keys        *sni.ECHKeys    // nil without ECHKeys
	publicNames map[string]bool // of the keys' configurations
}

// initECH readies ECHKeys, once, and reports whether they are valid. The
// public names are known even when they are not, for the binds of agents
// (which the agent listener serves whatever the keys) to be checked.
func (s *Server) initECH() error {
	e := &s.ech
	e.once.Do(func() {
		if len(s.ECHKeys) == 0 {
			return
		}
		e.publicNames = map[string]bool{}
		for _, k := range s.ECHKeys {
			if name, ok := sni.ECHPublicName(k.Config); ok {
				if n, ok := router.Normalise(name); ok {
					e.publicNames[n] = true
				}
			}
		}
		if e.keys, e.err = sni.NewECHKeys(s.ECHKeys); e.err != nil {
			e.err = fmt.Errorf("edge: ECHKeys: %w", e.err)
			return
		}
		if domain, ok := router.Normalise(s.Domain); ok {
			for name := range e.publicNames {
				if name == domain || strings.HasSuffix(domain, "."+name) {
					e.err = fmt.Errorf("edge: ECHKeys: the public name %s is the Domain or above it: it is the operator's, with every name under it, so no agent could bind any name; give the keys a public name of their own", name)
					return
				}
			}
		}
	})
	return e.err
}

// agentTLSConfig is the configuration of the TLS the edge terminates for
// agents on its public TLS port: its own certificates, as for https
// endpoints, and wire.ALPN alone, which a hello must offer to get here.
func (s *Server) agentTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:               tls.VersionTLS12,
		NextProtos:               []string{wire.ALPN},
		GetCertificate:           s.certificate,
		EncryptedClientHelloKeys: s.ECHKeys,
	}
}
