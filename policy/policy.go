package policy

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Headers the edge sets on requests to the app. Every request header and
// trailer whose name reads as one starting with ReservedPrefix is removed
// first, whatever the policy, so the app can trust these (see Check).
const (
	// HeaderAuthUser is the basic_auth user a request logged in as.
	HeaderAuthUser = "Tunnelkit-Auth-User"
	// HeaderAuthEmail is the verified e-mail address of the oidc login.
	HeaderAuthEmail = "Tunnelkit-Auth-Email"
	// HeaderAuthSubject is the oidc login's subject (the provider's
	// stable user id).
	HeaderAuthSubject = "Tunnelkit-Auth-Subject"
	// HeaderClientCertSubject is the subject of the mutual_tls client
	// certificate, in RFC 2253 form, bytes outside printable ASCII as '?'.
	HeaderClientCertSubject = "Tunnelkit-Client-Cert-Subject"
)

// Refusal codes: the Tunnelkit-Error header and the first word of the body
// of a refusal, as for the edge's own refusals.
const (
	CodePolicyDenied   = "policy_denied"   // 403: an address, certificate or account not allowed
	CodeUnauthorized   = "unauthorized"    // 401: basic credentials missing or wrong; an oidc login needed
	CodeRateLimited    = "rate_limited"    // 429: the client's rate limit is spent (Retry-After says when to come back)
	CodeWebhookInvalid = "webhook_invalid" // 403: no valid webhook signature
	CodeBodyTooLarge   = "body_too_large"  // 413: a webhook body over Options.MaxWebhookBody
	CodeLoginFailed    = "login_failed"    // 403: an oidc callback that does not complete a login
	CodeBadRequest     = "bad_request"     // 400: a webhook body that could not be read
	CodePolicyError    = "policy_error"    // 500: a rule could not be evaluated (over its cost limit, say)

	// CodePolicyUnavailable: 503, what the policy needs cannot be had
	// now (a jwt-validation's keys).
	CodePolicyUnavailable = "policy_unavailable"
)

// Refusal is a policy's answer to a request or connection it does not let
// through.
type Refusal struct {
	Status  int    // the HTTP status
	Code    string // a Code* constant
	Message string // a short sentence for people; never a secret
}

// Options are what the edge gives Compile. The zero Options compile every
// kind but oidc.
type Options struct {
	// OIDC makes the Provider of an oidc kind, at bind time; ctx is
	// Compile's. Package github.com/tunnelkit/tunnelkit/policy/oidc has
	// one (oidc.Providers.Provider). An error wrapping ErrInvalid,
	// ErrForbidden or ErrUnsupported refuses the bind for good; any other
	// becomes ErrUnavailable (try again later). Nil: oidc kinds are
	// refused with ErrUnsupported.
	OIDC func(ctx context.Context, cfg OIDCConfig) (Provider, error)

	// CookieKey encrypts and authenticates the oidc cookies: 32 secret
	// bytes or more, the same on every edge that serves the same names
	// (each then accepts the others' sessions), kept across restarts
	// (a new key logs everyone out). Shorter: oidc kinds are refused with
	// ErrUnsupported.
	CookieKey []byte

	// SessionLifetime is how long an oidc login holds. Zero:
	// DefaultSessionLifetime.
	SessionLifetime time.Duration

	// Refuse writes a refusal, so that it looks like the edge's others.
	// Headers it needs (WWW-Authenticate, Retry-After) are on w already.
	// Nil: WriteRefusal.
	Refuse func(w http.ResponseWriter, r *http.Request, ref Refusal)

	// MaxWebhookBody bounds the body a webhook check reads. Zero:
	// DefaultMaxWebhookBody.
	MaxWebhookBody int64

	// RateLimitClients bounds the client sources a rate limit remembers.
	// Zero: DefaultRateLimitClients.
	RateLimitClients int

	// Now is the clock of rate limits, webhook timestamps and sessions.
	// Nil: time.Now.
	Now func() time.Time

	// Logger gets failed logins at Debug (clients choose their volume),
	// and rules that fail to evaluate at Warn, at most once a second;
	// never a credential. Nil: no logging.
	Logger *slog.Logger

	// Engine compiles the expressions of rules. Nil: a spec whose rules
	// have expressions, interpolations or bucket keys is refused with
	// ErrUnsupported (rules without any run without one).
	Engine Engine

	// Endpoint describes the endpoint, for the endpoint.* variables of
	// rules. Its Protocol defaults to Compile's proto.
	Endpoint Endpoint
}

// Policy is a compiled Spec, for one endpoint: what the edge consults
// before it opens a stream to the agent. Its methods are safe for
// concurrent use; a nil *Policy lets everything through (and still strips
// reserved headers in Check). It holds no goroutine: drop it when the
// endpoint goes.
//
// A Policy is three lists of steps, one per phase: the kinds first, each
// compiled to the action it equals, in the order of the package
// documentation, then the rules. Every check runs through them.
type Policy struct {
	conn, req, resp []step

	mtls      *mutualTLS // for the handshake's client CAs
	login     *oidcLogin // an oidc action's, whose callback it answers first
	readsBody bool
	maxBody   int64
	endpoint  Endpoint

	refuseFunc func(http.ResponseWriter, *http.Request, Refusal)
	clock      func() time.Time
	epoch      time.Time
	log        *slog.Logger

	lastFailLog   atomic.Int64
	failsUnlogged atomic.Int64
}

// Compile validates spec for an endpoint of protocol proto (see Validate)
// and compiles it, once per bind. ctx bounds what it fetches (an oidc
// kind's provider discovery). The spec is not kept: its passwords are
// kept only as keyed hashes. Rules with expressions or interpolations need
// Options.Engine (ErrUnsupported without one).
func Compile(ctx context.Context, proto string, spec Spec, opts Options) (*Policy, error) {
	if err := spec.Validate(proto); err != nil {
		return nil, err
	}
	p := &Policy{
		refuseFunc: opts.Refuse,
		clock:      opts.Now,
		log:        opts.Logger,
		maxBody:    opts.MaxWebhookBody,
		endpoint:   opts.Endpoint,
	}
	if p.refuseFunc == nil {
		p.refuseFunc = WriteRefusal
	}
	if p.clock == nil {
		p.clock = time.Now
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.maxBody <= 0 {
		p.maxBody = DefaultMaxWebhookBody
	}
	if p.endpoint.Protocol == "" {
		p.endpoint.Protocol = proto
	}
	p.epoch = p.clock()

	// The kinds, as the steps they equal, in the documented order.
	kind := func(name string, a act) step { return step{at: name, acts: []act{a}} }
	var first []step
	if len(spec.CIDRAllow) > 0 || len(spec.CIDRDeny) > 0 {
		a := &restrictAct{enforce: true}
		if len(spec.CIDRAllow) > 0 {
			a.allow = newPrefixSet(spec.CIDRAllow)
		}
		if len(spec.CIDRDeny) > 0 {
			a.deny = newPrefixSet(spec.CIDRDeny)
		}
		first = append(first, kind(KindCIDRAllow+"/"+KindCIDRDeny, a))
	}
	if spec.RateLimit != nil {
		first = append(first, kind(KindRateLimit, &rateAct{table: newRateTable(spec.RateLimit, opts.RateLimitClients), enforce: true}))
	}
	if proto == ProtoTCP || proto == ProtoTLS {
		p.conn = first
	} else {
		p.req = first
	}
	if spec.MutualTLS != nil {
		var err error
		if p.mtls, err = newMutualTLS(spec.MutualTLS); err != nil {
			return nil, err
		}
		p.req = append(p.req, kind(KindMutualTLS, &mtlsAct{p.mtls}))
	}
	if spec.BasicAuth != nil {
		p.req = append(p.req, kind(KindBasicAuth, &basicAct{auth: newBasicAuth(spec.BasicAuth), challenge: basicChallenge, enforce: true}))
	}
	if spec.OIDC != nil {
		l, err := newOIDCLogin(ctx, spec.OIDC, &opts)
		if err != nil {
			return nil, err
		}
		p.req = append(p.req, kind(KindOIDC, &oidcAct{l}))
	}
	if spec.Webhook != nil {
		p.req = append(p.req, kind(KindWebhook, &webhookAct{wh: newWebhook(spec.Webhook), enforce: true}))
		p.readsBody = true
	}
	if ops := newHeaderOps(spec.RequestHeaders); ops != nil {
		p.req = append(p.req, kind(KindRequestHeaders, &headerOpsAct{ops}))
	}

	// The rules.
	c := compiler{ctx: ctx, engine: opts.Engine, opts: &opts, clients: opts.RateLimitClients}
	if spec.OIDC != nil {
		c.login = &oidcLogin{} // the kind's: an action may not add another
	}
	for _, ph := range spec.phases() {
		c.phase = ph.name
		for i := range ph.rules {
			st, err := c.rule(&ph.rules[i], i)
			if err != nil {
				return nil, err
			}
			switch ph.name {
			case PhaseTCPConnect:
				p.conn = append(p.conn, st)
			case PhaseHTTPRequest:
				p.req = append(p.req, st)
			case PhaseHTTPResponse:
				p.resp = append(p.resp, st)
			}
			for _, a := range st.acts {
				if _, ok := a.(*webhookAct); ok {
					p.readsBody = true
				}
			}
		}
	}
	if ops := newHeaderOps(spec.ResponseHeaders); ops != nil {
		p.resp = append(p.resp, kind(KindResponseHeaders, &headerOpsAct{ops}))
	}
	if spec.OIDC == nil {
		p.login = c.login
	}
	return p, nil
}

// AllowAddr reports whether the policy's address checks on connections
// let client in: the cidr kinds and restrict-ips actions of rules that
// need no expression (cidr_allow and cidr_deny, for tls and tcp
// endpoints). It spends nothing of a rate limit.
func (p *Policy) AllowAddr(client netip.Addr) bool {
	if p == nil {
		return true
	}
	for _, steps := range [2][]step{p.conn, p.req} {
		for i := range steps {
			if len(steps[i].conds) > 0 {
				continue
			}
			for _, a := range steps[i].acts {
				if r, ok := a.(*restrictAct); ok && r.enforce && !r.allows(client) {
					return false
				}
			}
		}
	}
	return true
}

// AcceptConn is Accept for a connection known by its client's address
// alone.
func (p *Policy) AcceptConn(client netip.Addr) (ref Refusal, ok bool) {
	return p.Accept(Conn{Client: netip.AddrPortFrom(client, 0)})
}

// Accept decides a connection to a tls or tcp endpoint, before the edge
// dials the agent: the on_tcp_connect phase (the address kinds, the rate
// limit, then the rules). When ok is false the edge closes the
// connection; the Refusal says why, for its logs and metrics.
func (p *Policy) Accept(c Conn) (ref Refusal, ok bool) {
	if p == nil || len(p.conn) == 0 {
		return Refusal{}, true
	}
	x := getRun()
	defer putRun(x)
	*x = run{p: p, vars: Vars{Phase: PhaseTCPConnect, Conn: c, Endpoint: p.endpoint, Now: p.clock()}}
	answered, err := runPhase(p.conn, x)
	switch {
	case err != nil:
		p.failed(err, "client", c.Client.String())
		return refusedRule, false
	case answered:
		return x.ref, false
	}
	return Refusal{}, true
}

var (
	refusedAddr = Refusal{http.StatusForbidden, CodePolicyDenied, "your address may not reach this endpoint"}
	refusedRate = Refusal{http.StatusTooManyRequests, CodeRateLimited, "too many requests from your address; try again later"}
)

// Check runs the policy on a request to an http or https endpoint, from
// client, before the edge opens a stream to the agent: the
// on_http_request phase, whose order is in the package documentation. It
// returns served true when it answered the request itself (a refusal
// through Options.Refuse, a redirect, a custom response, a step of a
// login): the edge is done with it. Otherwise the request goes on to the
// app with its headers rewritten in place (reserved headers removed,
// identity headers set, header changes applied), its URL as url-rewrite
// left it and, when a webhook is checked, its body read and replaced by
// the same bytes, with their length (no longer chunked, unless it has
// trailers). Call Check on every request, on a nil *Policy too: that
// removes the reserved headers a client sent.
//
// Reserved headers are those named like one the edge reserves or sets,
// as app stacks read names, with '_' and '.' as '-' and the case folded
// (CGI and PHP read Tunnelkit_Auth_User as Tunnelkit-Auth-User): every
// spelling of a Tunnelkit-* name, and every spelling of an X-Forwarded-*
// or Forwarded name but the canonical one (X-Forwarded-For), which the
// edge appends to. A request trailer named like any of them, however
// spelled, is removed too: those the request announces at once, those
// that come as its body ends (r.Body is wrapped for that, when trailers
// may come).
//
// A rule that fails to evaluate (over its cost limit, say) answers 500
// policy_error: the policy fails closed.
func (p *Policy) Check(w http.ResponseWriter, r *http.Request, client netip.Addr) (served bool) {
	stripReserved(r.Header)
	if p == nil || len(p.req) == 0 {
		holdTrailers(r)
		return false
	}
	if p.login != nil && (r.URL.Path == CallbackPath || r.URL.Path == LogoutPath) {
		// An oidc action's callback, whatever its rule's expressions
		// say of this path: the login it started comes back here.
		return p.login.serve(p, w, r)
	}
	x := getRun()
	defer putRun(x)
	*x = run{p: p, w: w, r: r, vars: Vars{
		Phase:    PhaseHTTPRequest,
		Conn:     connOf(r, client),
		Endpoint: p.endpoint,
		Request:  r,
		Now:      p.clock(),
	}}
	answered, err := runPhase(p.req, x)
	switch {
	case err != nil:
		p.failed(err, "host", r.Host, "client", client.String())
		p.refuse(w, r, refusedRule)
		return true
	case answered:
		return true
	}
	holdTrailers(r)
	return false
}

// connOf describes a request's connection.
func connOf(r *http.Request, client netip.Addr) Conn {
	c := Conn{Client: clientAddrPort(client, r.RemoteAddr)}
	if r.TLS != nil {
		c.ServerName = r.TLS.ServerName
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		c.ServerPort = a.Port
	}
	c.ClientCertSubject = r.Header.Get(HeaderClientCertSubject)
	return c
}

// readBody reads the body, bounded, and puts the same bytes back as the
// body. It returns false when it refused the request.
func (p *Policy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if rb, ok := r.Body.(*readBack); ok {
		return rb.b, true // read by an action before
	}
	tooLarge := Refusal{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("a webhook body may be at most %d bytes", p.maxBody)}
	if r.ContentLength > p.maxBody {
		p.refuse(w, r, tooLarge)
		return nil, false
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, p.maxBody+1))
		r.Body.Close()
		switch {
		case int64(len(body)) > p.maxBody:
			p.refuse(w, r, tooLarge)
			return nil, false
		case err != nil:
			p.refuse(w, r, Refusal{http.StatusBadRequest, CodeBadRequest, "the request body could not be read"})
			return nil, false
		}
		stripReservedTrailers(r.Trailer) // come with the body's end
	}
	r.ContentLength = int64(len(body))
	if len(r.Trailer) == 0 {
		// Known now: the app gets a Content-Length, not chunks.
		r.TransferEncoding = nil
	}
	r.Body = &readBack{Reader: bytes.NewReader(body), b: body}
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return body, true
}

// readBack is a body read whole by the policy, to be read again.
type readBack struct {
	*bytes.Reader
	b []byte
}

func (*readBack) Close() error { return nil }

// Response runs the on_http_response phase on the app's response to in,
// the client's request as Check left it, from client, before the edge
// writes it (httputil.ReverseProxy's ModifyResponse): the rules (the
// agent's, then the operator's), then the response_headers kind. A
// custom-response replaces the response, closing the app's body. A rule
// that fails to evaluate replaces it with a 500 policy_error. A nil
// *Policy does nothing.
func (p *Policy) Response(resp *http.Response, in *http.Request, client netip.Addr) {
	if p == nil || len(p.resp) == 0 {
		return
	}
	if in == nil {
		in = &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Header: http.Header{}}
	}
	x := getRun()
	defer putRun(x)
	*x = run{p: p, r: in, resp: resp, vars: Vars{
		Phase:    PhaseHTTPResponse,
		Conn:     connOf(in, client),
		Endpoint: p.endpoint,
		Request:  in,
		Response: resp,
		Now:      p.clock(),
		Auth:     Auth{User: in.Header.Get(HeaderAuthUser), Email: in.Header.Get(HeaderAuthEmail), Subject: in.Header.Get(HeaderAuthSubject)},
	}}
	if _, err := runPhase(p.resp, x); err != nil {
		p.failed(err, "host", in.Host, "client", client.String())
		body := CodePolicyError + ": " + refusedRule.Message + "\n"
		if resp.Body != nil {
			resp.Body.Close()
		}
		resp.StatusCode = refusedRule.Status
		resp.Status = "500 Internal Server Error"
		resp.Header = http.Header{
			"Content-Type":           {"text/plain; charset=utf-8"},
			"X-Content-Type-Options": {"nosniff"},
			"Tunnelkit-Error":        {CodePolicyError},
			"Content-Length":         {strconv.Itoa(len(body))},
		}
		resp.Trailer, resp.TransferEncoding = nil, nil
		resp.ContentLength = int64(len(body))
		resp.Body = io.NopCloser(strings.NewReader(body))
	}
}

// ReadsBody reports whether Check reads the request body (a webhook kind
// does, up to Options.MaxWebhookBody bytes), so that the caller can bound
// the time that read may take. False for a nil *Policy.
func (p *Policy) ReadsBody() bool {
	return p != nil && p.readsBody
}

// ClientCAs returns the pool of the mutual_tls CAs, to ask for and verify a
// client certificate on this endpoint's TLS connections; nil without
// mutual_tls. See the package documentation for the tls.Config to use.
func (p *Policy) ClientCAs() *x509.CertPool {
	if p == nil || p.mtls == nil {
		return nil
	}
	return p.mtls.pool
}

func (p *Policy) refuse(w http.ResponseWriter, r *http.Request, ref Refusal) {
	p.refuseFunc(w, r, ref)
}

func (p *Policy) now() time.Time { return p.clock() }

// nanos is the time since Compile, in ns, monotonic with the real clock.
func (p *Policy) nanos() int64 { return int64(p.clock().Sub(p.epoch)) }

// WriteRefusal writes ref the way the edge writes its own refusals: the
// status, Tunnelkit-Error: code, and a plain-text body "code: message".
// It is what Check uses when Options.Refuse is nil.
func WriteRefusal(w http.ResponseWriter, r *http.Request, ref Refusal) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Tunnelkit-Error", ref.Code)
	if r.ContentLength != 0 && r.ProtoMajor == 1 {
		// Close rather than read what is left of an unread body.
		h.Set("Connection", "close")
	}
	w.WriteHeader(ref.Status)
	io.WriteString(w, ref.Code+": "+ref.Message+"\n")
}
