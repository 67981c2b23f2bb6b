package policy

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/net/http/httpguts"
)

// The reserved paths of an endpoint with an oidc policy: the edge answers
// them itself, on the endpoint's own host. Register
// https://HOST/.tunnelkit/oidc/callback at the provider as a redirect URI
// for every HOST of the endpoint.
const (
	CallbackPath = "/.tunnelkit/oidc/callback" // where the provider sends the browser back
	LogoutPath   = "/.tunnelkit/oidc/logout"   // ends the session (its cookie)
)

// Cookie names. The __Host- prefix makes browsers keep them host-only,
// Secure and on Path=/, whatever else says otherwise.
const (
	cookiePrefix  = "__Host-tunnelkit-"
	SessionCookie = cookiePrefix + "session" // the signed session, after a login
	LoginCookie   = cookiePrefix + "login"   // a login under way: state, PKCE verifier, nonce
)

// DefaultSessionLifetime is how long a login holds when
// Options.SessionLifetime is zero.
const DefaultSessionLifetime = 12 * time.Hour

// loginLifetime bounds the time between the redirect to the provider and
// the return to the callback.
const loginLifetime = 10 * time.Minute

// exchangeTimeout bounds the code exchange of a callback.
const exchangeTimeout = 15 * time.Second

// OIDCConfig is what Options.OIDC makes a Provider from: the oidc kind's
// provider and client, without its allow lists.
type OIDCConfig struct {
	Issuer       string
	ClientID     string
	ClientSecret string // may be empty (a public client)
}

// Provider runs the authorization-code flow with PKCE (RFC 7636) against one
// OpenID provider, for one client. Package
// github.com/tunnelkit/tunnelkit/policy/oidc implements it with
// coreos/go-oidc and golang.org/x/oauth2. Its methods are called
// concurrently.
type Provider interface {
	// AuthCodeURL returns the URL of the provider's login for a flow that
	// comes back to redirectURL with state: response type code, scopes
	// openid and email, the nonce, and the S256 challenge of verifier.
	AuthCodeURL(state, nonce, verifier, redirectURL string) string

	// Exchange redeems code at the token endpoint with verifier and
	// redirectURL, verifies the ID token it gets (signature, issuer,
	// audience, expiry) and returns the identity it proves, with the
	// token's nonce claim, which the caller compares. ctx bounds the
	// exchange.
	Exchange(ctx context.Context, code, verifier, redirectURL string) (Identity, error)
}

// Identity is who logged in, as a verified ID token (or the provider's
// userinfo, for the same subject) says.
type Identity struct {
	Subject       string
	Email         string
	EmailVerified bool
	Nonce         string // the ID token's nonce claim
}

// oidcLogin is a compiled oidc kind.
type oidcLogin struct {
	provider Provider
	aead     cipher.AEAD
	issuer   string
	clientID string
	emails   map[string]bool // lower case
	domains  map[string]bool // lower case
	anyone   bool            // no lists: any account the issuer verified (an oidc action)
	lifetime time.Duration
}

func newOIDCLogin(ctx context.Context, o *OIDC, opts *Options) (*oidcLogin, error) {
	if opts.OIDC == nil {
		return nil, fmt.Errorf("%w: %s (the edge has no OIDC provider hook)", ErrUnsupported, KindOIDC)
	}
	if len(opts.CookieKey) < 32 {
		return nil, fmt.Errorf("%w: %s (the edge has no cookie key of 32 bytes or more)", ErrUnsupported, KindOIDC)
	}
	key, err := hkdf.Key(sha256.New, opts.CookieKey, nil, "tunnelkit policy oidc cookies v1", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	p, err := opts.OIDC(ctx, OIDCConfig{Issuer: o.Issuer, ClientID: o.ClientID, ClientSecret: o.ClientSecret})
	if err != nil {
		if errors.Is(err, ErrInvalid) || errors.Is(err, ErrForbidden) || errors.Is(err, ErrUnsupported) {
			return nil, fmt.Errorf("%s: %w", KindOIDC, err)
		}
		return nil, fmt.Errorf("%w: %s: provider %s: %v", ErrUnavailable, KindOIDC, quote(o.Issuer), err)
	}
	l := &oidcLogin{
		provider: p,
		aead:     aead,
		issuer:   o.Issuer,
		clientID: o.ClientID,
		emails:   map[string]bool{},
		domains:  map[string]bool{},
		lifetime: opts.SessionLifetime,
	}
	if l.lifetime <= 0 {
		l.lifetime = DefaultSessionLifetime
	}
	l.anyone = len(o.AllowEmails)+len(o.AllowDomains) == 0
	for _, e := range o.AllowEmails {
		l.emails[strings.ToLower(e)] = true
	}
	for _, d := range o.AllowDomains {
		l.domains[strings.ToLower(d)] = true
	}
	return l, nil
}

// allowed reports whether a verified e-mail address may in.
func (l *oidcLogin) allowed(email string) bool {
	if l.anyone {
		return true
	}
	email = strings.ToLower(email)
	if l.emails[email] {
		return true
	}
	i := strings.LastIndexByte(email, '@')
	return i > 0 && l.domains[email[i+1:]]
}

// session is what the session cookie holds.
type session struct {
	expires int64 // Unix seconds
	subject string
	email   string
}

// login is what the login cookie holds.
type login struct {
	expires  int64 // Unix seconds
	state    string
	verifier string
	nonce    string
	returnTo string // path and query to go back to
}

// serve runs the oidc part of Check: the reserved paths, and otherwise the
// session cookie, or a new login.
func (l *oidcLogin) serve(p *Policy, w http.ResponseWriter, r *http.Request) (served bool) {
	switch r.URL.Path {
	case CallbackPath:
		l.callback(p, w, r)
		return true
	case LogoutPath:
		http.SetCookie(w, l.cookie(SessionCookie, "", -1))
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, "logged out")
		return true
	}
	now := p.now()
	if s, ok := l.readSession(r, now); ok {
		if !l.allowed(s.email) {
			// Allowed once, but not by this policy (a cookie of
			// another bind with the same key and client).
			p.refuse(w, r, Refusal{http.StatusForbidden, CodePolicyDenied, "your account may not reach this endpoint"})
			return true
		}
		stripCookies(r.Header)
		r.Header[HeaderAuthEmail] = []string{s.email}
		r.Header[HeaderAuthSubject] = []string{s.subject}
		return false
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.refuse(w, r, Refusal{http.StatusUnauthorized, CodeUnauthorized, "log in first: open this site in a browser"})
		return true
	}
	lg := login{
		expires:  now.Add(loginLifetime).Unix(),
		state:    random(32),
		verifier: random(32),
		nonce:    random(16),
		returnTo: r.URL.RequestURI(),
	}
	if len(lg.returnTo) > 2048 || !localPath(lg.returnTo) {
		lg.returnTo = "/"
	}
	http.SetCookie(w, l.cookie(LoginCookie, l.seal("login", r.Host, lg.marshal()), int(loginLifetime/time.Second)))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, l.provider.AuthCodeURL(lg.state, lg.nonce, lg.verifier, redirectURL(r)), http.StatusFound)
	return true
}

// callback completes a login: the provider sent the browser back with a
// code for the state of the login cookie.
func (l *oidcLogin) callback(p *Policy, w http.ResponseWriter, r *http.Request) {
	fail := func(msg string, err error) {
		p.log.Debug("policy: oidc login failed", "host", r.Host, "why", msg, "err", err)
		http.SetCookie(w, l.cookie(LoginCookie, "", -1))
		w.Header().Set("Cache-Control", "no-store")
		p.refuse(w, r, Refusal{http.StatusForbidden, CodeLoginFailed, msg})
	}
	if r.Method != http.MethodGet {
		fail("the login callback takes GET only", nil)
		return
	}
	now := p.now()
	var lg login
	c, err := r.Cookie(LoginCookie)
	if err == nil {
		var raw []byte
		if raw, err = l.open("login", r.Host, c.Value); err == nil {
			err = lg.unmarshal(raw)
		}
	}
	if err != nil || lg.expires < now.Unix() {
		fail("no login under way in this browser, or it took too long: open the site again", err)
		return
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		fail("the provider refused the login: "+printable(e, 64), nil)
		return
	}
	if subtle.ConstantTimeCompare([]byte(q.Get("state")), []byte(lg.state)) != 1 {
		fail("the login's state does not match this browser's", nil)
		return
	}
	code := q.Get("code")
	if code == "" {
		fail("the provider sent no code", nil)
		return
	}
	// Bounded by its own timeout, not by the client: net/http cancels
	// r's context when an HTTP/1.1 client half-closes after its request,
	// still waiting for the answer, and a code is redeemed once.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), exchangeTimeout)
	id, err := l.provider.Exchange(ctx, code, lg.verifier, redirectURL(r))
	cancel()
	switch {
	case err != nil:
		fail("the provider did not accept the login's code", err)
		return
	case subtle.ConstantTimeCompare([]byte(id.Nonce), []byte(lg.nonce)) != 1:
		fail("the ID token's nonce does not match the login's", nil)
		return
	case id.Subject == "" || len(id.Subject) > MaxIDBytes || !httpguts.ValidHeaderFieldValue(id.Subject) ||
		len(id.Email) > MaxIDBytes || !httpguts.ValidHeaderFieldValue(id.Email):
		fail("the provider's identity is unusable", nil)
		return
	}
	if id.Email == "" || !id.EmailVerified || !l.allowed(id.Email) {
		p.log.Debug("policy: oidc identity not allowed", "host", r.Host)
		http.SetCookie(w, l.cookie(LoginCookie, "", -1))
		p.refuse(w, r, Refusal{http.StatusForbidden, CodePolicyDenied, "your account may not reach this endpoint"})
		return
	}
	s := session{expires: now.Add(l.lifetime).Unix(), subject: id.Subject, email: id.Email}
	http.SetCookie(w, l.cookie(SessionCookie, l.seal("session", r.Host, s.marshal()), int(l.lifetime/time.Second)))
	http.SetCookie(w, l.cookie(LoginCookie, "", -1))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, lg.returnTo, http.StatusFound)
}

// readSession returns the request's session, if it has a valid one.
func (l *oidcLogin) readSession(r *http.Request, now time.Time) (session, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return session{}, false
	}
	raw, err := l.open("session", r.Host, c.Value)
	if err != nil {
		return session{}, false
	}
	var s session
	if s.unmarshal(raw) != nil || s.expires < now.Unix() {
		return session{}, false
	}
	return s, true
}

func (l *oidcLogin) cookie(name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name:     name,
		Value:    value,
		Path:     "/",
		MaxAge:   maxAge,
		Secure:   true,
		HttpOnly: true,
		SameSite: http.SameSiteLaxMode,
	}
}

// aad binds a cookie to its purpose, the host it was set for, and the
// provider and client that vouched for it: a cookie of another endpoint,
// or of another issuer, never opens.
func (l *oidcLogin) aad(purpose, host string) []byte {
	// Browsers keep cookies by host name, whatever the port.
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return []byte(purpose + "\x00" + strings.ToLower(host) + "\x00" + l.issuer + "\x00" + l.clientID)
}

// seal encrypts and authenticates a cookie's value.
func (l *oidcLogin) seal(purpose, host string, plain []byte) string {
	nonce := make([]byte, l.aead.NonceSize(), l.aead.NonceSize()+len(plain)+l.aead.Overhead())
	rand.Read(nonce)
	return cookieEncoding.EncodeToString(l.aead.Seal(nonce, nonce, plain, l.aad(purpose, host)))
}

// cookieEncoding encodes cookie values: one encoding per value (Strict
// refuses the variants with other trailing bits).
var cookieEncoding = base64.RawURLEncoding.Strict()

// maxCookie bounds a cookie value that open decodes.
const maxCookie = 4096

var errCookie = errors.New("policy: invalid cookie")

// open checks and decrypts a cookie's value.
func (l *oidcLogin) open(purpose, host, value string) ([]byte, error) {
	if len(value) > maxCookie {
		return nil, errCookie
	}
	b, err := cookieEncoding.DecodeString(value)
	if err != nil || len(b) < l.aead.NonceSize()+l.aead.Overhead() {
		return nil, errCookie
	}
	n := l.aead.NonceSize()
	plain, err := l.aead.Open(nil, b[:n], b[n:], l.aad(purpose, host))
	if err != nil {
		return nil, errCookie
	}
	return plain, nil
}

const cookieVersion = 1

func (s *session) marshal() []byte {
	var b cryptobyte.Builder
	b.AddUint8(cookieVersion)
	b.AddUint64(uint64(s.expires))
	addString16(&b, s.subject)
	addString16(&b, s.email)
	return b.BytesOrPanic()
}

func (s *session) unmarshal(raw []byte) error {
	in := cryptobyte.String(raw)
	var v uint8
	var exp uint64
	var sub, email cryptobyte.String
	if !in.ReadUint8(&v) || v != cookieVersion || !in.ReadUint64(&exp) ||
		!in.ReadUint16LengthPrefixed(&sub) || !in.ReadUint16LengthPrefixed(&email) || !in.Empty() {
		return errCookie
	}
	*s = session{expires: int64(exp), subject: string(sub), email: string(email)}
	return nil
}

func (lg *login) marshal() []byte {
	var b cryptobyte.Builder
	b.AddUint8(cookieVersion)
	b.AddUint64(uint64(lg.expires))
	addString16(&b, lg.state)
	addString16(&b, lg.verifier)
	addString16(&b, lg.nonce)
	addString16(&b, lg.returnTo)
	return b.BytesOrPanic()
}

func (lg *login) unmarshal(raw []byte) error {
	in := cryptobyte.String(raw)
	var v uint8
	var exp uint64
	var state, verifier, nonce, ret cryptobyte.String
	if !in.ReadUint8(&v) || v != cookieVersion || !in.ReadUint64(&exp) ||
		!in.ReadUint16LengthPrefixed(&state) || !in.ReadUint16LengthPrefixed(&verifier) ||
		!in.ReadUint16LengthPrefixed(&nonce) || !in.ReadUint16LengthPrefixed(&ret) || !in.Empty() {
		return errCookie
	}
	*lg = login{expires: int64(exp), state: string(state), verifier: string(verifier), nonce: string(nonce), returnTo: string(ret)}
	return nil
}

func addString16(b *cryptobyte.Builder, s string) {
	b.AddUint16LengthPrefixed(func(b *cryptobyte.Builder) { b.AddBytes([]byte(s)) })
}

// random returns n random bytes in base64url without padding: 32 bytes
// make a PKCE verifier of 43 characters, as RFC 7636 asks.
func random(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// redirectURL is the callback URL of the request's host.
func redirectURL(r *http.Request) string {
	return "https://" + strings.ToLower(r.Host) + CallbackPath
}

// localPath reports whether p is a path on this host that a redirect may go
// back to: "/..." but not "//..." or "/\...", which browsers read as
// another host.
func localPath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "//") && !strings.HasPrefix(p, "/\\")
}

// stripCookies removes the policy's own cookies from the Cookie headers of a
// request on its way to the app: the session is the edge's business.
func stripCookies(h http.Header) {
	vals := h["Cookie"]
	changed := false
	var out []string
	for _, v := range vals {
		if !strings.Contains(v, cookiePrefix) {
			out = append(out, v)
			continue
		}
		changed = true
		var kept []string
		for part := range strings.SplitSeq(v, ";") {
			part = strings.TrimSpace(part)
			if part != "" && !strings.HasPrefix(part, cookiePrefix) {
				kept = append(kept, part)
			}
		}
		if len(kept) > 0 {
			out = append(out, strings.Join(kept, "; "))
		}
	}
	switch {
	case !changed:
	case len(out) == 0:
		delete(h, "Cookie")
	default:
		h["Cookie"] = out
	}
}

// printable returns s cut to n bytes with bytes outside printable ASCII
// replaced by '?'.
func printable(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}
