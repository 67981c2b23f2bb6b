// Package oidc is the OpenID Connect side of package policy: a
// policy.Provider built on github.com/coreos/go-oidc/v3 (discovery, ID
// token verification) and golang.org/x/oauth2 (the code exchange, PKCE). It
// is a module of its own, so that apps and edges that need no OIDC login do
// not build OAuth libraries.
//
// Typical use, in an edge:
//
//	providers := &oidc.Providers{}
//	srv := &edge.Server{
//		OIDC:      providers.Provider,
//		TicketKey: key, // the session cookies' key derives from it: the same on every edge
//		...
//	}
//	defer providers.CloseIdleConnections()
//
// or, compiling policies without package edge:
//
//	opts := policy.Options{
//		OIDC:      providers.Provider,
//		CookieKey: key, // 32+ secret bytes, the same on every edge
//	}
//	pol, err := policy.Compile(ctx, proto, spec, opts)
//
// An agent chooses its issuer, so an edge fetches URLs an agent names: the
// issuer's discovery document, then the token, keys and userinfo endpoints
// the document names. Providers bounds what that costs: every request is
// bounded in time (Timeout) and size (1 MiB per response), goes through no
// proxy, and by default may not reach loopback, private, link-local or
// other non-public addresses (AllowPrivateNetworks), checked on the address
// each connection is made to, redirects and DNS answers included. An
// operator can also name the issuers agents may use (policy.Operator's
// OIDCIssuers).
package oidc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"

	gooidc "github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/tunnelkit/tunnelkit/policy"
)

// Defaults of Providers.
const (
	DefaultTimeout    = 10 * time.Second
	DefaultMaxIssuers = 256
	// DiscoveryTTL is how long a provider's discovery document is kept
	// before the next bind that names the issuer fetches it again.
	DiscoveryTTL = time.Hour
	// maxResponse bounds each response from a provider.
	maxResponse = 1 << 20
)

// ErrPrivateAddress is the error of a connection to a provider at an
// address that is not public, refused unless
// Providers.AllowPrivateNetworks. Provider returns it wrapped in
// policy.ErrForbidden, which makes policy.Compile refuse the bind for good.
var ErrPrivateAddress = errors.New("oidc: provider at a non-public address")

// Providers makes the policy.Provider of each oidc policy, for
// policy.Options.OIDC, and keeps each issuer's discovery document (and the
// keys it names) for the binds that name the same issuer. Its zero value is
// ready to use; its fields must not change after the first call.
type Providers struct {
	// RootCAs verifies the providers' TLS certificates. Nil: the
	// system's roots.
	RootCAs *x509.CertPool

	// AllowPrivateNetworks lets providers be at loopback, private,
	// link-local, CGNAT, unspecified or multicast addresses. False: such
	// connections are refused (ErrPrivateAddress), so that an agent cannot
	// make the edge reach into the operator's network.
	AllowPrivateNetworks bool

	// Timeout bounds each request to a provider. Zero: DefaultTimeout.
	Timeout time.Duration

	// MaxIssuers bounds the issuers whose discovery documents are kept.
	// Zero: DefaultMaxIssuers.
	MaxIssuers int

	once   sync.Once
	client *http.Client

	mu     sync.Mutex
	byURL  map[string]*discovered
	nowFor func() time.Time // tests
}

type discovered struct {
	p       *gooidc.Provider
	fetched time.Time
}

// Provider returns the provider of cfg: its issuer's discovery document
// (fetched within ctx, or kept from an earlier call), and cfg's client.
// It has the signature of policy.Options.OIDC.
func (ps *Providers) Provider(ctx context.Context, cfg policy.OIDCConfig) (policy.Provider, error) {
	ps.once.Do(ps.init)
	u, err := url.Parse(cfg.Issuer)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%w: oidc: issuer %q: want an https URL", policy.ErrInvalid, cfg.Issuer)
	}
	op, err := ps.discover(ctx, cfg.Issuer)
	if err != nil {
		if errors.Is(err, ErrPrivateAddress) {
			return nil, fmt.Errorf("%w: %w", policy.ErrForbidden, err)
		}
		return nil, fmt.Errorf("oidc: discovery of %s: %w", cfg.Issuer, err)
	}
	return &provider{
		op:     op,
		client: ps.client,
		oauth: oauth2.Config{
			ClientID:     cfg.ClientID,
			ClientSecret: cfg.ClientSecret,
			Endpoint:     op.Endpoint(),
			Scopes:       []string{gooidc.ScopeOpenID, "email"},
		},
		verifier: op.Verifier(&gooidc.Config{ClientID: cfg.ClientID}),
	}, nil
}

// CloseIdleConnections closes the connections to providers that are kept
// for the next request, as an edge shuts down. Providers stays usable.
func (ps *Providers) CloseIdleConnections() {
	ps.once.Do(ps.init)
	ps.client.CloseIdleConnections()
}

func (ps *Providers) init() {
	timeout := ps.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	dialer := &net.Dialer{Timeout: timeout}
	if !ps.AllowPrivateNetworks {
		dialer.Control = refusePrivate
	}
	ps.client = &http.Client{
		Timeout: timeout,
		Transport: limitBody{&http.Transport{
			Proxy:               nil, // the address checked is the provider's
			DialContext:         dialer.DialContext,
			TLSClientConfig:     &tls.Config{RootCAs: ps.RootCAs},
			TLSHandshakeTimeout: timeout,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
		}},
	}
	ps.byURL = map[string]*discovered{}
	if ps.nowFor == nil {
		ps.nowFor = time.Now
	}
}

// discover returns the issuer's provider, fetching its discovery document
// unless a recent one is kept. Failures are not kept.
func (ps *Providers) discover(ctx context.Context, issuer string) (*gooidc.Provider, error) {
	now := ps.nowFor()
	ps.mu.Lock()
	d := ps.byURL[issuer]
	ps.mu.Unlock()
	if d != nil && now.Sub(d.fetched) < DiscoveryTTL {
		return d.p, nil
	}
	p, err := gooidc.NewProvider(gooidc.ClientContext(ctx, ps.client), issuer)
	if err != nil {
		return nil, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	max := ps.MaxIssuers
	if max <= 0 {
		max = DefaultMaxIssuers
	}
	if _, ok := ps.byURL[issuer]; !ok && len(ps.byURL) >= max {
		var oldest string
		for k, v := range ps.byURL {
			if oldest == "" || v.fetched.Before(ps.byURL[oldest].fetched) {
				oldest = k
			}
		}
		delete(ps.byURL, oldest)
	}
	ps.byURL[issuer] = &discovered{p: p, fetched: now}
	return p, nil
}

// refusePrivate is a net.Dialer's Control: it refuses connections to
// addresses that are not public.
func refusePrivate(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrPrivateAddress, address)
	}
	if a := ap.Addr().Unmap(); !policy.PublicAddr(a) {
		return fmt.Errorf("%w: %s", ErrPrivateAddress, a)
	}
	return nil
}

// limitBody bounds the body of every response.
type limitBody struct{ rt http.RoundTripper }

func (l limitBody) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := l.rt.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{rc: resp.Body, left: maxResponse}
	return resp, nil
}

type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

var errTooLarge = errors.New("oidc: provider response over 1 MiB")

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// provider is one client of one issuer.
type provider struct {
	op       *gooidc.Provider
	client   *http.Client
	oauth    oauth2.Config
	verifier *gooidc.IDTokenVerifier
}

var _ policy.Provider = (*provider)(nil)

func (p *provider) config(redirectURL string) *oauth2.Config {
	c := p.oauth
	c.RedirectURL = redirectURL
	return &c
}

// AuthCodeURL implements policy.Provider.
func (p *provider) AuthCodeURL(state, nonce, verifier, redirectURL string) string {
	return p.config(redirectURL).AuthCodeURL(state, gooidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier))
}

// Exchange implements policy.Provider: the code for tokens, the ID token
// verified, the e-mail address from its claims or, when it has none, from
// the userinfo endpoint for the same subject.
func (p *provider) Exchange(ctx context.Context, code, verifier, redirectURL string) (policy.Identity, error) {
	ctx = context.WithValue(ctx, oauth2.HTTPClient, p.client)
	tok, err := p.config(redirectURL).Exchange(ctx, code, oauth2.VerifierOption(verifier))
	if err != nil {
		return policy.Identity{}, fmt.Errorf("oidc: code exchange: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return policy.Identity{}, errors.New("oidc: the token response has no id_token")
	}
	idt, err := p.verifier.Verify(gooidc.ClientContext(ctx, p.client), raw)
	if err != nil {
		return policy.Identity{}, fmt.Errorf("oidc: ID token: %w", err)
	}
	if idt.AccessTokenHash != "" {
		if err := idt.VerifyAccessToken(tok.AccessToken); err != nil {
			return policy.Identity{}, fmt.Errorf("oidc: ID token: %w", err)
		}
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified any    `json:"email_verified"` // a bool, or "true" from some providers
	}
	if err := idt.Claims(&claims); err != nil {
		return policy.Identity{}, fmt.Errorf("oidc: ID token claims: %w", err)
	}
	id := policy.Identity{
		Subject:       idt.Subject,
		Nonce:         idt.Nonce,
		Email:         claims.Email,
		EmailVerified: claims.EmailVerified == true || claims.EmailVerified == "true",
	}
	if id.Email == "" {
		ui, err := p.op.UserInfo(gooidc.ClientContext(ctx, p.client), oauth2.StaticTokenSource(tok))
		if err != nil {
			return policy.Identity{}, fmt.Errorf("oidc: userinfo: %w", err)
		}
		if ui.Subject != idt.Subject {
			return policy.Identity{}, errors.New("oidc: userinfo is about another subject than the ID token")
		}
		id.Email, id.EmailVerified = ui.Email, ui.EmailVerified
	}
	return id, nil
}
