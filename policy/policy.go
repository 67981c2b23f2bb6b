package policy

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
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

	// Logger gets failed logins at Debug (clients choose their volume);
	// never a credential. Nil: no logging.
	Logger *slog.Logger
}

// Policy is a compiled Spec, for one endpoint: what the edge consults
// before it opens a stream to the agent. Its methods are safe for
// concurrent use; a nil *Policy lets everything through (and still strips
// reserved headers in Check). It holds no goroutine: drop it when the
// endpoint goes.
type Policy struct {
	allow, deny *prefixSet
	rate        *rateTable
	basic       *basicAuth
	oidc        *oidcLogin
	mtls        *mutualTLS
	reqHeaders  *headerOps
	respHeaders *headerOps
	webhook     *webhook
	maxBody     int64

	refuseFunc func(http.ResponseWriter, *http.Request, Refusal)
	clock      func() time.Time
	epoch      time.Time
	log        *slog.Logger
}

// Compile validates spec for an endpoint of protocol proto (see Validate)
// and compiles it, once per bind. ctx bounds what it fetches (an oidc
// kind's provider discovery). The spec is not kept: its passwords are
// kept only as keyed hashes.
func Compile(ctx context.Context, proto string, spec Spec, opts Options) (*Policy, error) {
	if err := spec.Validate(proto); err != nil {
		return nil, err
	}
	p := &Policy{
		refuseFunc: opts.Refuse,
		clock:      opts.Now,
		log:        opts.Logger,
		maxBody:    opts.MaxWebhookBody,
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
	p.epoch = p.clock()
	if len(spec.CIDRAllow) > 0 {
		p.allow = newPrefixSet(spec.CIDRAllow)
	}
	if len(spec.CIDRDeny) > 0 {
		p.deny = newPrefixSet(spec.CIDRDeny)
	}
	if spec.RateLimit != nil {
		p.rate = newRateTable(spec.RateLimit, opts.RateLimitClients)
	}
	if spec.BasicAuth != nil {
		p.basic = newBasicAuth(spec.BasicAuth)
	}
	if spec.MutualTLS != nil {
		var err error
		if p.mtls, err = newMutualTLS(spec.MutualTLS); err != nil {
			return nil, err
		}
	}
	p.reqHeaders = newHeaderOps(spec.RequestHeaders)
	p.respHeaders = newHeaderOps(spec.ResponseHeaders)
	if spec.Webhook != nil {
		p.webhook = newWebhook(spec.Webhook)
	}
	if spec.OIDC != nil {
		var err error
		if p.oidc, err = newOIDCLogin(ctx, spec.OIDC, &opts); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// AllowAddr reports whether the address lists let client in: it is in
// cidr_allow (when there is one) and not in cidr_deny. IPv4-mapped IPv6
// addresses are matched as IPv4; an invalid address is refused by any
// list. It is pure and allocates nothing.
func (p *Policy) AllowAddr(client netip.Addr) bool {
	if p == nil {
		return true
	}
	if p.allow != nil && !p.allow.contains(client) {
		return false
	}
	if p.deny != nil && (!client.IsValid() || p.deny.contains(client)) {
		return false
	}
	return true
}

// AcceptConn decides a connection to a tls or tcp endpoint, before the edge
// dials the agent: the address lists, then the rate limit (a connection
// spends a token). When ok is false the edge closes the connection; the
// Refusal says why, for its logs and metrics.
func (p *Policy) AcceptConn(client netip.Addr) (ref Refusal, ok bool) {
	if p == nil {
		return Refusal{}, true
	}
	if !p.AllowAddr(client) {
		return refusedAddr, false
	}
	if p.rate != nil {
		if ok, _ := p.rate.allow(client, p.nanos()); !ok {
			return refusedRate, false
		}
	}
	return Refusal{}, true
}

var (
	refusedAddr = Refusal{http.StatusForbidden, CodePolicyDenied, "your address may not reach this endpoint"}
	refusedRate = Refusal{http.StatusTooManyRequests, CodeRateLimited, "too many requests from your address; try again later"}
)

// Check runs the policy on a request to an http or https endpoint, from
// client, before the edge opens a stream to the agent; the order of the
// checks is in the package documentation. It returns served true when it
// answered the request itself (a refusal through Options.Refuse, a redirect
// to the login, the login callback): the edge is done with it. Otherwise
// the request goes on to the app with its headers rewritten in place
// (reserved headers removed, identity headers set, request_headers
// applied) and, with a webhook kind, its body read and replaced by the
// same bytes, with their length (no longer chunked, unless it has
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
func (p *Policy) Check(w http.ResponseWriter, r *http.Request, client netip.Addr) (served bool) {
	stripReserved(r.Header)
	if p == nil {
		holdTrailers(r)
		return false
	}
	if !p.AllowAddr(client) {
		p.refuse(w, r, refusedAddr)
		return true
	}
	if p.rate != nil {
		if ok, wait := p.rate.allow(client, p.nanos()); !ok {
			secs := max(int64((wait+time.Second-1)/time.Second), 1)
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			p.refuse(w, r, refusedRate)
			return true
		}
	}
	if p.mtls != nil {
		subject, ok := p.mtls.verify(r.TLS)
		if !ok {
			p.refuse(w, r, Refusal{http.StatusForbidden, CodePolicyDenied, "this endpoint needs a client certificate from its CAs"})
			return true
		}
		r.Header[HeaderClientCertSubject] = []string{subject}
	}
	if p.basic != nil {
		i := p.basic.check(r.Header)
		if i < 0 {
			w.Header()["Www-Authenticate"] = basicChallenge
			p.refuse(w, r, Refusal{http.StatusUnauthorized, CodeUnauthorized, "this endpoint needs a user and password"})
			return true
		}
		if !p.basic.pass {
			delete(r.Header, "Authorization")
		}
		r.Header[HeaderAuthUser] = p.basic.users[i]
	}
	if p.oidc != nil && p.oidc.serve(p, w, r) {
		return true
	}
	if p.webhook != nil && p.checkWebhook(w, r) {
		return true
	}
	p.reqHeaders.apply(r.Header)
	holdTrailers(r)
	return false
}

// checkWebhook reads the body, bounded, verifies its signature, and puts
// the same bytes back as the body. It returns true when it refused.
func (p *Policy) checkWebhook(w http.ResponseWriter, r *http.Request) (served bool) {
	tooLarge := Refusal{http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("a webhook body may be at most %d bytes", p.maxBody)}
	if r.ContentLength > p.maxBody {
		p.refuse(w, r, tooLarge)
		return true
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(io.LimitReader(r.Body, p.maxBody+1))
		r.Body.Close()
		switch {
		case int64(len(body)) > p.maxBody:
			p.refuse(w, r, tooLarge)
			return true
		case err != nil:
			p.refuse(w, r, Refusal{http.StatusBadRequest, CodeBadRequest, "the request body could not be read"})
			return true
		}
		stripReservedTrailers(r.Trailer) // come with the body's end
	}
	if !p.webhook.verify(r.Header, body, p.clock()) {
		p.refuse(w, r, Refusal{http.StatusForbidden, CodeWebhookInvalid, "no valid " + p.webhook.provider + " webhook signature"})
		return true
	}
	r.ContentLength = int64(len(body))
	if len(r.Trailer) == 0 {
		// Known now: the app gets a Content-Length, not chunks.
		r.TransferEncoding = nil
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) == 0 {
		r.Body = http.NoBody
	}
	return false
}

// RewriteResponse applies response_headers to the header of the app's
// response, before the edge writes it (httputil.ReverseProxy's
// ModifyResponse). A nil *Policy does nothing.
func (p *Policy) RewriteResponse(h http.Header) {
	if p == nil {
		return
	}
	p.respHeaders.apply(h)
}

// ReadsBody reports whether Check reads the request body (a webhook kind
// does, up to Options.MaxWebhookBody bytes), so that the caller can bound
// the time that read may take. False for a nil *Policy.
func (p *Policy) ReadsBody() bool {
	return p != nil && p.webhook != nil
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
