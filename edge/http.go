package edge

import (
	"errors"
	"net/http"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"

	"github.com/tunnelkit/tunnelkit/edge/acme"
	"github.com/tunnelkit/tunnelkit/edge/internal/access"
	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// ServeHTTP routes a public HTTP request to the agent that bound its Host:
// the Host minus ".<Domain>", case-insensitive, port ignored.
//
// The request travels to the route looked up for it, over an upstream
// whose stream header names the request's client (see package upstream), so
// the app behind the agent sees the right client as each connection's
// RemoteAddr. The request and response stream through (no whole-body
// buffering). Upgrade requests such as WebSocket are passed through, but
// an upgrade to h2c is not: the request is served as HTTP/1.1 without it
// (see dropH2CUpgrade). "Expect: 100-continue" reaches the app, which may
// refuse the body before it is sent. X-Forwarded-For, -Proto and -Host get
// exactly one hop, the client's, and the Host header is kept. A client
// that leaves cancels the app's request (see exchange.go for how every
// exchange ends).
//
// Of a name whose endpoints have path prefixes, a request goes to the
// endpoint of the longest prefix its cleaned path is under (see
// router.CleanPath and router.PathRouter), else to the name's endpoint
// without one. Its app gets that cleaned path, without the prefix when
// the endpoint strips it (X-Forwarded-Prefix then names the prefix, as
// the edge alone sets it: a client's is removed on every endpoint with a
// path); a request the name's endpoint without a path takes reaches it
// as it came.
//
// Before any stream is opened to the agent, the endpoint's traffic policy
// (the agent's and the operator's, see Server.Policy) checks the request;
// whatever the policy, every request header or trailer named like one the
// edge reserves or sets, as apps read names ('_' and '.' as '-', any
// case: Tunnelkit_Auth_User), is removed, so that the app can trust those
// the edge sets: every Tunnelkit-* header and trailer, and the
// X-Forwarded-* and Forwarded ones but headers spelled canonically (see
// policy.Policy.Check).
//
// When the edge itself answers, the status says why and the plain-text body
// and the Tunnelkit-Error header carry the Reason, a short stable code;
// the body says what happened in words, and carries a request ID, also in
// the Tunnelkit-Request-Id header, under which the edge's log keeps the
// detail (the agent's error, an address: never shown to the public but
// on a route whose agent asked for VerboseErrors, for development). The
// answers of an agent's forwarder for its app (502 app_unreachable and
// app_error) have the same form, their ID and detail in the agent's log;
// the access log takes the ID of either from the answer's header:
//
//	400 bad_request          a malformed request or request body
//	400 missing_host         no Host header
//	401 unauthorized         the policy's login: basic credentials missing or wrong (WWW-Authenticate)
//	403 policy_denied        the policy does not allow the client's address, certificate or account
//	403 webhook_invalid      the policy's webhook signature is missing or wrong
//	403 login_failed         an OIDC login callback that does not complete a login
//	404 no_endpoint          no tunnel has that name (or, of a name with paths, none takes the request's)
//	404 https_only           the name is bound over https only (see RedirectHTTP)
//	408 body_timeout         the request body stopped moving (Timeouts.Body)
//	413 body_too_large       a webhook body larger than the policy verifies
//	421 misdirected          an HTTP/2 connection reused for a name it cannot serve
//	429 client_limit         the client holds its share of the endpoint (Limits.ClientShare)
//	429 rate_limited         the policy's rate limit for the client is spent (Retry-After)
//	502 agent_offline        no agent of the endpoint could be reached
//	502 app_unreachable      the agent could not connect to its app
//	502 app_error            the app closed the connection without a whole response
//	503 agent_busy           the agent's session is at Limits.StreamsPerSession
//	503 routing_unavailable  the Router failed
//	503 policy_unavailable   the policy of another edge's endpoint cannot be set up here now
//	504 app_timeout          the app did not answer in time (Timeouts.ResponseHeader)
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	s.serveHTTP(w, r, false)
}

// serveHTTPS serves the requests of TLS connections the edge terminated
// for https endpoints.
func (s *Server) serveHTTPS(w http.ResponseWriter, r *http.Request) {
	s.serveHTTP(w, r, true)
}

// serveHTTP routes a request by its Host, and proxies it, counting and
// logging it when the Server has an AccessLog or an Observer.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request, terminated bool) {
	var aw *access.Writer
	if s.AccessLog != nil || s.Observer != nil {
		aw = access.NewWriter(w)
		w = aw
		defer s.endAccess(aw, r)
	}
	routes, ok := s.routeRequest(w, r, terminated)
	if !ok {
		return
	}
	dropH2CUpgrade(r.Header)
	client := clientAddr(r.RemoteAddr)
	pol, ok := s.checkPolicy(w, r, routes, client.Addr())
	if !ok {
		return
	}
	release, ok := s.acquireShare(routes, client)
	if !ok {
		s.refuse(w, r, ReasonClientLimit, "too many requests from your address to this tunnel", nil)
		return
	}
	defer release()
	s.serveExchange(w, pathRequest(r, routes[0]), routes, ConnInfo{Client: client, Host: r.Host}, aw, pol)
}

// dropH2CUpgrade takes an HTTP/1.1 request's ask to switch to h2c off
// its header h: the h2c token of Upgrade (Upgrade itself when no other
// protocol is left), HTTP2-Settings, and the tokens of Connection that
// name what went, so that the request is served as HTTP/1.1. An app that
// switched would speak HTTP/2 on its connection from then on, whose
// requests the edge no longer sees one by one (their policy: rate limits,
// header rules, logins). Other upgrades, such as WebSocket's, stay as they
// came. (An HTTP/2 request carries none of these headers.)
func dropH2CUpgrade(h http.Header) {
	ups, ok := h["Upgrade"]
	if !ok {
		return
	}
	var keep []string
	h2c := false
	for _, v := range ups {
		for p := range strings.SplitSeq(v, ",") {
			switch p = textproto.TrimString(p); {
			case strings.EqualFold(p, "h2c"):
				h2c = true
			case p != "":
				keep = append(keep, p)
			}
		}
	}
	if !h2c {
		return
	}
	delete(h, "Http2-Settings")
	gone := []string{"http2-settings"}
	if len(keep) == 0 {
		delete(h, "Upgrade")
		gone = append(gone, "upgrade")
	} else {
		h["Upgrade"] = []string{strings.Join(keep, ", ")}
	}
	var conn []string
	for _, v := range h["Connection"] {
		for p := range strings.SplitSeq(v, ",") {
			if p = textproto.TrimString(p); p != "" && !slices.ContainsFunc(gone, func(g string) bool { return strings.EqualFold(p, g) }) {
				conn = append(conn, p)
			}
		}
	}
	if len(conn) == 0 {
		delete(h, "Connection")
	} else {
		h["Connection"] = []string{strings.Join(conn, ", ")}
	}
}

// routeRequest returns the routes of a request: https routes when the edge
// terminated its TLS, else http routes (https ones first for a request
// that came over TLS the embedder terminated). When there are none, it
// answers the request itself and reports false.
func (s *Server) routeRequest(w http.ResponseWriter, r *http.Request, terminated bool) ([]router.Route, bool) {
	host, err := s.routeHost(r.Host)
	switch {
	case errors.Is(err, errMissingHost):
		s.refuse(w, r, ReasonMissingHost, "the request has no Host header", nil)
		return nil, false
	case errors.Is(err, errMalformedHost):
		s.refuse(w, r, ReasonBadRequest, "malformed Host header", nil)
		return nil, false
	case err != nil:
		s.refuse(w, r, ReasonNoEndpoint, "no tunnel at this address", nil)
		return nil, false
	}
	var routes []router.Route
	path := requestPath(r) // the routes of its path (see paths.go)
	if terminated || r.TLS != nil && s.servesHTTPS() {
		routes, err = s.lookupPath(r.Context(), wire.ProtoHTTPS, host, path)
	}
	if err == nil && len(routes) == 0 && !terminated {
		routes, err = s.lookupPath(r.Context(), wire.ProtoHTTP, host, path)
	}
	if err != nil {
		s.refuse(w, r, ReasonRoutingUnavailable, "routing is unavailable", err)
		return nil, false
	}
	if len(routes) == 0 {
		s.noRoute(w, r, host, terminated)
		return nil, false
	}
	return routes, true
}

// routeHost returns the normalised host name of a Host header that lies
// under the server's domain: errMissingHost for none, errMalformedHost
// for a Host that is no host name at all, and errOtherHost for one that
// names no tunnel (an IP literal, a name outside the domain, the domain
// itself).
func (s *Server) routeHost(hostport string) (string, error) {
	h := hostport
	if h == "" {
		return "", errMissingHost
	}
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", errMalformedHost
		}
		if _, err := netip.ParseAddr(h[1:end]); err != nil {
			return "", errMalformedHost
		}
		return "", errOtherHost
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		port := h[i+1:]
		for j := 0; j < len(port); j++ {
			if port[j] < '0' || port[j] > '9' {
				return "", errMalformedHost
			}
		}
		h = h[:i]
	}
	h, ok := router.Normalise(h)
	if !ok {
		return "", errMalformedHost
	}
	domain := s.domain()
	if !strings.HasSuffix(h, "."+domain) && !s.ownDomain(h, domain) {
		return "", errOtherHost
	}
	return h, nil
}

var (
	errMissingHost   = errors.New("edge: missing host")
	errMalformedHost = errors.New("edge: malformed host")
	errOtherHost     = errors.New("edge: host names no tunnel")
)

// clientAddr parses an http.Request's RemoteAddr.
func clientAddr(remote string) netip.AddrPort {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// noRoute answers a request whose host has no route for its scheme: a name
// bound over https only gets redirected there (or told so), an ACME HTTP-01
// challenge for it is answered, and an HTTP/2 connection reused for a name
// its TLS was not for gets 421, so that the client opens one of its own.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, host string, terminated bool) {
	if terminated {
		if r.TLS != nil && r.TLS.ServerName != "" && !strings.EqualFold(r.TLS.ServerName, host) {
			s.refuse(w, r, ReasonMisdirected, "this connection does not serve "+host+"; open a new one", nil)
			return
		}
		s.refuse(w, r, ReasonNoEndpoint, "tunnel not found: "+host, nil)
		return
	}
	if r.TLS == nil && s.servesHTTPS() {
		routes, err := s.lookup(r.Context(), wire.ProtoHTTPS, host)
		if err == nil && len(routes) > 0 {
			s.httpsOnly(w, r, host)
			return
		}
	}
	s.refuse(w, r, ReasonNoEndpoint, "tunnel not found: "+host, nil)
}

// httpsOnly answers a plain-HTTP request for a name bound over https only.
func (s *Server) httpsOnly(w http.ResponseWriter, r *http.Request, host string) {
	t := s.tlsTerm()
	if t.acme != nil && strings.HasPrefix(r.URL.Path, acme.ChallengePath) {
		t.acme.ServeHTTP(w, r)
		return
	}
	s.mu.Lock()
	port := s.tlsPort
	s.mu.Unlock()
	target := "https://" + names.WithPort(host, port, "443") + r.URL.RequestURI()
	if !s.RedirectHTTP {
		s.refuse(w, r, ReasonHTTPSOnly, "this tunnel is served over https only: "+target, nil)
		return
	}
	if r.ContentLength != 0 && r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	http.Redirect(w, r, target, http.StatusPermanentRedirect)
}
