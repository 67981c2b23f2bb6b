package edge

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/policies"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// Traffic policy at the edge. The spec an agent declares with an endpoint
// (wire.Bind.Policy, package policy) is combined with the operator's
// (Server.Policy), compiled, and checked before a stream is opened to the
// agent: on each request of an http or https endpoint (checkPolicy, from
// http.go), on each connection of a tls or tcp one (acceptPolicy, from
// conn.go). Its response headers are applied in the exchange (exchange.go),
// and its client CAs asked for in the TLS handshake (tls.go).
//
// The agent's spec travels with its route (router.Route.Policy), so that
// every edge of a cluster enforces it on the public traffic it takes. Each
// edge compiles it once per endpoint: the edge that takes the bind at the
// bind, the others on first use, and keeps it (package policies) until
// its routes go (for a route of another edge, when the Router's watch says
// so).

const (
	// maxCachedPolicies bounds the compiled policies kept for endpoints
	// this edge holds no route of.
	maxCachedPolicies = 1024

	// policyRetry is how long a policy that could not be compiled on
	// first use is refused before the next request tries again.
	policyRetry = 5 * time.Second

	// policyCompileTimeout bounds compiling a policy on first use (an
	// OIDC provider's discovery), as the control requests of a bind are.
	policyCompileTimeout = 30 * time.Second
)

// cookieKeyLabel derives the key of OIDC login cookies from the ticket key.
const cookieKeyLabel = "tunnelkit edge policy cookie key v1"

// deriveCookieKey returns the key of OIDC login cookies for a ticket key:
// edges that share the ticket key share it, and it says nothing of the
// ticket key.
func deriveCookieKey(ticketKey []byte) []byte {
	k, err := hkdf.Key(sha256.New, ticketKey, nil, cookieKeyLabel, 32)
	if err != nil {
		panic("edge: cookie key: " + err.Error()) // only for lengths past 255*32
	}
	return k
}

// PolicyChanged tells the edge that Policy answers otherwise from now on
// (the operator changed their policy): the traffic policy of every
// endpoint is compiled again, with the operator's new one, at its next
// request or connection, and holds from then on; an endpoint whose
// agent's policy the new one refuses has its traffic refused
// (ReasonPolicyUnavailable) until its agent binds it again. Rate limits
// start their counts anew. Binds after it combine with the new one.
// Policy must not go from nil to a func, or back, while the Server runs.
func (s *Server) PolicyChanged() {
	s.init()
	s.policies.Renew()
}

// keyOfRoute returns what the compiled policy of r is kept by.
func keyOfRoute(r router.Route) policies.Key {
	return policies.Key{Endpoint: endpointOf(r), Identity: r.Identity, Spec: r.Policy}
}

// hasPolicy reports whether traffic of r is checked by a policy: the
// agent declared one, or the operator has one.
func (s *Server) hasPolicy(r router.Route) bool {
	return r.Policy != "" || s.Policy != nil
}

// policyOptions are the options every policy of the Server is compiled
// with.
func (s *Server) policyOptions() policy.Options {
	return policy.Options{
		OIDC:      s.OIDC,
		CookieKey: s.cookieKey,
		Refuse:    s.refusePolicy,
		Now:       s.Clock,
		Logger:    s.log(),
		Engine:    s.PolicyEngine,
	}
}

// compilePolicy combines the agent's spec for an endpoint of proto owned
// by identity with the operator's policy, and compiles the result (nil for
// a combination that checks nothing); it returns the combination too.
func (s *Server) compilePolicy(ctx context.Context, r router.Route, spec policy.Spec) (*policy.Policy, policy.Spec, error) {
	var op policy.Operator
	if s.Policy != nil {
		op = s.Policy(r.Identity)
	}
	combined, err := policy.Combine(r.Proto, op, spec)
	if err != nil || combined.IsZero() {
		return nil, combined, err
	}
	opts := s.policyOptions()
	opts.Endpoint = policy.Endpoint{URL: r.Proto + "://" + r.Name + r.Path, Host: r.Name, Protocol: r.Proto}
	pol, err := policy.Compile(ctx, r.Proto, combined, opts)
	if own := spec.Rules(); err != nil && !own.IsZero() {
		// In the combination the operator's rules come first: the
		// agent's alone say which of its own is at fault, if one is.
		if _, ownErr := policy.Compile(ctx, r.Proto, own, opts); ownErr != nil {
			err = ownErr
		}
	}
	return pol, combined, err
}

// specJSON is the form of spec that routes carry: "" for none, else its
// JSON as package policy writes it, so that two agents of a pool that
// declare the same spec send the same bytes, whatever their spacing.
func specJSON(spec policy.Spec) (string, error) {
	if spec.IsZero() {
		return "", nil
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // as compact as the agent may send it
	if err := enc.Encode(spec); err != nil {
		return "", fmt.Errorf("%w: %v", policy.ErrInvalid, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// holdPolicy keeps the policy of r, a route this edge bound, compiled as
// pol, until releasePolicy (see policies.Cache.Hold).
func (s *Server) holdPolicy(r router.Route, pol *policy.Policy) {
	if s.hasPolicy(r) {
		s.policies.Hold(keyOfRoute(r), pol)
	}
}

// releasePolicy ends a holdPolicy of r, dropping the compiled policy with
// its last route on this edge.
func (s *Server) releasePolicy(r router.Route) {
	if s.hasPolicy(r) {
		s.policies.Release(keyOfRoute(r))
	}
}

// forgetPolicy drops the policy compiled on first use for r, a route of
// another edge that went, unless this edge holds a route of it.
func (s *Server) forgetPolicy(r router.Route) {
	if s.hasPolicy(r) {
		s.policies.Forget(keyOfRoute(r))
	}
}

// routePolicy returns the compiled policy of r's endpoint: nil for none;
// the one kept, whatever ctx, or else one compiled now (other requests
// for it wait for that, within ctx; the compiling is bounded by
// policyCompileTimeout alone). A policy that could not be compiled is
// refused for policyRetry, then tried again.
func (s *Server) routePolicy(ctx context.Context, r router.Route) (*policies.Compiled, error) {
	if !s.hasPolicy(r) {
		return nil, nil
	}
	return s.policies.Get(ctx, keyOfRoute(r), func(ctx context.Context) (*policy.Policy, error) {
		raw := []byte(r.Policy)
		if len(raw) == 0 {
			raw = []byte("null")
		}
		spec, err := policy.Parse(raw)
		var pol *policy.Policy
		if err == nil {
			pol, _, err = s.compilePolicy(ctx, r, spec)
		}
		if err != nil {
			s.log().Warn("traffic policy of an endpoint refused", "proto", r.Proto, "name", r.Name, "edge", r.Edge, "err", err)
			return nil, fmt.Errorf("edge: the policy of %s %s: %w", r.Proto, r.Name, err)
		}
		return pol, nil
	})
}

// checkPolicy runs the traffic policy of routes (all alike: a pool has one
// policy) on a request, before any stream is opened to the agent, and
// returns it. It reports false when the request was answered: refused, or
// a step of a login. A policy that reads the request body (a webhook's)
// has Timeouts.Body for all of it.
func (s *Server) checkPolicy(w http.ResponseWriter, r *http.Request, routes []router.Route, client netip.Addr) (*policy.Policy, bool) {
	// net/http cancels a request's context when its HTTP/1.1 client
	// half-closes, which a client still waiting for its answer does too
	// (see exchange): a policy compiled on first use is waited for as long
	// as its compiling takes (policyCompileTimeout), whatever the client.
	cp, err := s.routePolicy(context.WithoutCancel(r.Context()), routes[0])
	if err != nil {
		s.answer(w, r, ReasonPolicyUnavailable, "the traffic policy of this tunnel cannot be enforced now", err, routes[0].VerboseErrors)
		return nil, false
	}
	pol := cp.Policy()
	if pol.ClientCAs() != nil && r.TLS != nil && !s.sameHost(r.TLS.ServerName, r.Host) {
		// An HTTP/2 connection opened for another name (browsers reuse
		// one for every name its certificate covers) was not asked for
		// this name's client certificate: the client opens one of its
		// own on 421.
		s.refuse(w, r, ReasonMisdirected, "this name needs a connection of its own, with a client certificate; open a new one", nil)
		return nil, false
	}
	if pol.ReadsBody() && s.cfg().body > 0 && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		b := &policyBody{ReadCloser: r.Body, rc: http.NewResponseController(w)}
		r.Body = b
		b.rc.SetReadDeadline(time.Now().Add(s.cfg().body))
		defer b.clearDeadline()
	}
	if pol.Check(w, r, client) {
		return nil, false
	}
	return pol, true
}

// sameHost reports whether the server name of a TLS connection is the host
// of a request's Host header.
func (s *Server) sameHost(serverName, hostport string) bool {
	host, err := s.routeHost(hostport)
	return err == nil && strings.EqualFold(serverName, host)
}

// refusePolicy writes a policy's refusal as the edge's own, logged and
// counted.
func (s *Server) refusePolicy(w http.ResponseWriter, r *http.Request, ref policy.Refusal) {
	reason, status, msg := Reason(ref.Code), ref.Status, ref.Message
	if b, ok := r.Body.(*policyBody); ok && b.timedOut() {
		reason, status, msg = ReasonBodyTimeout, 0, "the request body stopped arriving"
	}
	s.answerStatus(w, r, reason, status, msg, nil, false)
}

// acceptPolicy runs the traffic policy of routes on a tls or tcp
// connection from client, before the agent is dialled, and reports
// whether it may go on; a refusal is counted and logged at the Debug
// level (clients choose how many there are).
func (s *Server) acceptPolicy(proto, name string, routes []router.Route, conn policy.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
	cp, err := s.routePolicy(ctx, routes[0])
	cancel()
	if err != nil {
		s.log().Info("traffic policy unavailable; connection closed", "proto", proto, "name", name, "err", err)
		s.obs().Refused(ReasonPolicyUnavailable)
		return false
	}
	ref, ok := cp.Policy().Accept(conn)
	if !ok {
		s.log().Debug("connection refused by the endpoint's policy", "proto", proto, "name", name, "client", conn.Client.String(), "code", ref.Code)
		s.obs().Refused(Reason(ref.Code))
	}
	return ok
}

// policyTLS returns the TLS configuration of a handshake for an https
// endpoint whose policy asks clients for a certificate (mutual_tls): base
// with ClientAuth VerifyClientCertIfGiven and the policy's CAs, so that a
// client without a certificate still gets a readable refusal from Check.
// Nil for every other name. Of a name with paths, whose policies may
// differ, the handshake (which knows no path) asks for the CAs of the
// first route that asks for any: the name's own, else its first path's.
func (s *Server) policyTLS(hello *tls.ClientHelloInfo, base *tls.Config) (*tls.Config, error) {
	name, ok := router.Normalise(hello.ServerName)
	if !ok {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg().handshake)
	defer cancel()
	routes, err := s.lookup(ctx, wire.ProtoHTTPS, name)
	if err != nil || len(routes) == 0 {
		return nil, nil
	}
	var cp *policies.Compiled
	var cas *x509.CertPool
	for i, r := range routes {
		if i > 0 && r.Path == routes[i-1].Path {
			continue // a pool's routes have one policy
		}
		if c, err := s.routePolicy(ctx, r); err == nil && c.Policy().ClientCAs() != nil {
			cp, cas = c, c.Policy().ClientCAs()
			break
		}
		// One whose policy failed: Check refuses its requests, no need
		// to fail the handshake.
	}
	if cas == nil {
		return nil, nil
	}
	return cp.TLS(func() *tls.Config {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientAuth = tls.VerifyClientCertIfGiven
		c.ClientCAs = cas
		return c
	}), nil
}

// policyBody is the body of a request whose policy reads it: it notes a
// read that timed out, and ends the read deadline at its end (net/http's
// reader goes on reading the connection in the background then).
type policyBody struct {
	io.ReadCloser
	rc *http.ResponseController

	mu      sync.Mutex
	err     error
	cleared bool
}

func (b *policyBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
		if err == io.EOF {
			b.clearDeadline()
		}
	}
	return n, err
}

func (b *policyBody) clearDeadline() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.cleared {
		b.cleared = true
		b.rc.SetReadDeadline(time.Time{})
	}
}

// timedOut reports whether a read of the body timed out.
func (b *policyBody) timedOut() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ne net.Error
	return errors.As(b.err, &ne) && ne.Timeout()
}
