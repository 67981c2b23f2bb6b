package policy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeIdP is a Provider that keeps the PKCE challenge of each login, as a
// real provider does, and checks the verifier at the exchange.
type fakeIdP struct {
	mu     sync.Mutex
	logins map[string]fakeLogin // by code
	next   int
}

type fakeLogin struct {
	challenge, redirect, nonce string
	id                         Identity
}

func (f *fakeIdP) AuthCodeURL(state, nonce, verifier, redirectURL string) string {
	sum := sha256.Sum256([]byte(verifier))
	q := url.Values{
		"state": {state}, "nonce": {nonce}, "redirect_uri": {redirectURL},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
	}
	return "https://idp.example/authorize?" + q.Encode()
}

// login is the user logging in at the provider: it returns the callback
// URL the provider sends the browser to.
func (f *fakeIdP) login(authURL string, id Identity) string {
	u, _ := url.Parse(authURL)
	q := u.Query()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	code := fmt.Sprintf("code-%d", f.next)
	if f.logins == nil {
		f.logins = map[string]fakeLogin{}
	}
	f.logins[code] = fakeLogin{challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri"), nonce: q.Get("nonce"), id: id}
	return q.Get("redirect_uri") + "?" + url.Values{"code": {code}, "state": {q.Get("state")}}.Encode()
}

func (f *fakeIdP) Exchange(ctx context.Context, code, verifier, redirectURL string) (Identity, error) {
	if err := ctx.Err(); err != nil {
		return Identity{}, err // as an exchange over the network fails
	}
	f.mu.Lock()
	l, ok := f.logins[code]
	delete(f.logins, code)
	f.mu.Unlock()
	sum := sha256.Sum256([]byte(verifier))
	switch {
	case !ok:
		return Identity{}, errors.New("invalid_grant: unknown code")
	case base64.RawURLEncoding.EncodeToString(sum[:]) != l.challenge:
		return Identity{}, errors.New("invalid_grant: PKCE verifier does not match")
	case redirectURL != l.redirect:
		return Identity{}, errors.New("invalid_grant: redirect_uri")
	}
	id := l.id
	if id.Nonce == "" {
		id.Nonce = l.nonce
	}
	return id, nil
}

// browser keeps cookies for one host, as a browser would, and sends
// requests through a policy to an app that records what it got.
type browser struct {
	t       *testing.T
	p       *Policy
	host    string
	cookies map[string]*http.Cookie
	clk     *clock
	ctx     context.Context // of its requests; nil: context.Background
}

func newBrowser(t *testing.T, p *Policy, clk *clock) *browser {
	return &browser{t: t, p: p, host: "app.example.test", cookies: map[string]*http.Cookie{}, clk: clk}
}

// get requests target (a path, or a full URL on the browser's host) and
// returns the response, and the request as the app would get it (nil when
// the policy answered).
func (b *browser) get(method, target string, header ...string) (*httptest.ResponseRecorder, *http.Request) {
	b.t.Helper()
	if u, err := url.Parse(target); err == nil && u.IsAbs() {
		if u.Host != b.host {
			b.t.Fatalf("request to %s from a browser of %s", target, b.host)
		}
		target = u.RequestURI()
	}
	ctx := b.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	r := httptest.NewRequestWithContext(ctx, method, "https://"+b.host+target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	for _, c := range b.cookies {
		r.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
	}
	w := httptest.NewRecorder()
	served := b.p.Check(w, r, mustAddr("192.0.2.1"))
	for _, c := range w.Result().Cookies() {
		if !c.Secure || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Path != "/" || c.Domain != "" || !strings.HasPrefix(c.Name, "__Host-") {
			b.t.Errorf("cookie %s is not host-only, Secure, HttpOnly, Lax: %v", c.Name, c)
		}
		if c.MaxAge < 0 {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c
		}
	}
	if served {
		return w, nil
	}
	return w, r
}

func compileOIDC(t *testing.T, idp *fakeIdP, clk *clock, o *OIDC) *Policy {
	t.Helper()
	if o == nil {
		o = &OIDC{Issuer: "https://idp.example", ClientID: "app", AllowEmails: []string{"Ann@Example.com"}, AllowDomains: []string{"corp.example"}}
	}
	return mustCompile(t, ProtoHTTPS, Spec{OIDC: o}, Options{
		OIDC:      func(context.Context, OIDCConfig) (Provider, error) { return idp, nil },
		CookieKey: []byte("0123456789abcdef0123456789abcdef"),
		Now:       clk.Now,
	})
}

var ann = Identity{Subject: "user-1", Email: "ann@example.com", EmailVerified: true}

// loginAs runs a whole login from target and returns the app's request for
// target.
func (b *browser) loginAs(idp *fakeIdP, target string, id Identity) *http.Request {
	b.t.Helper()
	w, _ := b.get("GET", target)
	if w.Code != http.StatusFound || !strings.HasPrefix(w.Header().Get("Location"), "https://idp.example/authorize?") {
		b.t.Fatalf("GET %s: %d to %q; want a redirect to the provider", target, w.Code, w.Header().Get("Location"))
	}
	cb := idp.login(w.Header().Get("Location"), id)
	w, _ = b.get("GET", cb)
	if w.Code != http.StatusFound || w.Header().Get("Location") != target {
		b.t.Fatalf("callback: %d %q to %q; want a redirect to %s", w.Code, w.Body, w.Header().Get("Location"), target)
	}
	w, r := b.get("GET", target)
	if r == nil {
		b.t.Fatalf("GET %s after the login: %d %s", target, w.Code, w.Body)
	}
	return r
}

func TestOIDCLogin(t *testing.T) {
	clk := newClock()
	idp := new(fakeIdP)
	p := compileOIDC(t, idp, clk, nil)
	b := newBrowser(t, p, clk)
	r := b.loginAs(idp, "/page?x=1", ann)
	if r.Header.Get(HeaderAuthEmail) != "ann@example.com" || r.Header.Get(HeaderAuthSubject) != "user-1" {
		t.Errorf("identity headers %v", r.Header)
	}
	if strings.Contains(r.Header.Get("Cookie"), "tunnelkit") {
		t.Errorf("the app got the edge's cookies: %q", r.Header.Get("Cookie"))
	}
	if _, ok := b.cookies[LoginCookie]; ok {
		t.Error("the login cookie outlived the login")
	}
	// Later requests ride on the session, the app's own cookies intact,
	// forged identity headers replaced.
	b.cookies["theme"] = &http.Cookie{Name: "theme", Value: "dark"}
	_, r = b.get("POST", "/api", HeaderAuthEmail, "boss@example.com", "tunnelkit-auth-subject", "boss")
	if r == nil || r.Header.Get(HeaderAuthEmail) != "ann@example.com" || len(r.Header[HeaderAuthEmail]) != 1 || r.Header.Get(HeaderAuthSubject) != "user-1" {
		t.Fatalf("forged identity reached the app: %v", r)
	}
	if c := r.Header.Get("Cookie"); c != "theme=dark" {
		t.Errorf("the app's cookies: %q; want theme=dark", c)
	}
	// A domain allowed by allow_domains.
	b2 := newBrowser(t, p, clk)
	if r := b2.loginAs(idp, "/", Identity{Subject: "u2", Email: "bob@CORP.example", EmailVerified: true}); r.Header.Get(HeaderAuthEmail) != "bob@CORP.example" {
		t.Errorf("domain login: %v", r.Header)
	}
	// Logout ends the session: the next request starts a login.
	if w, _ := b.get("GET", LogoutPath); w.Code != 200 {
		t.Errorf("logout: %d", w.Code)
	}
	if w, _ := b.get("GET", "/"); w.Code != http.StatusFound {
		t.Errorf("after logout: %d; want a new login", w.Code)
	}
}

// A callback whose request's context ended, as net/http ends it when an
// HTTP/1.1 client half-closes after its request, completes the login as
// a whole request does: the code exchange is bounded by its own timeout,
// not by the client (issue #32).
func TestOIDCCallbackHalfClosed(t *testing.T) {
	clk := newClock()
	idp := new(fakeIdP)
	p := compileOIDC(t, idp, clk, nil)
	b := newBrowser(t, p, clk)
	w, _ := b.get("GET", "/page")
	cb := idp.login(w.Header().Get("Location"), ann)
	halfClosed, cancel := context.WithCancel(context.Background())
	cancel()
	b.ctx = halfClosed
	if w, _ := b.get("GET", cb); w.Code != http.StatusFound || w.Header().Get("Location") != "/page" {
		t.Fatalf("callback, its client half-closed: %d %q to %q; want a redirect to /page", w.Code, w.Body, w.Header().Get("Location"))
	}
	if _, r := b.get("GET", "/page"); r == nil || r.Header.Get(HeaderAuthEmail) != "ann@example.com" {
		t.Fatalf("after the login: %v; want ann's session", r)
	}
}

func TestOIDCRefusals(t *testing.T) {
	clk := newClock()
	idp := new(fakeIdP)
	p := compileOIDC(t, idp, clk, nil)

	t.Run("not allowed", func(t *testing.T) {
		for _, id := range []Identity{
			{Subject: "u", Email: "eve@example.com", EmailVerified: true},
			{Subject: "u", Email: "ann@example.com", EmailVerified: false}, // unverified
			{Subject: "u", Email: "eve@sub.corp.example", EmailVerified: true},
			{Subject: "u", Email: "", EmailVerified: true},
		} {
			b := newBrowser(t, p, clk)
			w, _ := b.get("GET", "/")
			w, _ = b.get("GET", idp.login(w.Header().Get("Location"), id))
			if w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodePolicyDenied {
				t.Errorf("%+v: %d %s", id, w.Code, w.Body)
			}
			if _, ok := b.cookies[SessionCookie]; ok {
				t.Errorf("%+v: got a session", id)
			}
		}
	})
	t.Run("state mismatch", func(t *testing.T) {
		b := newBrowser(t, p, clk)
		w, _ := b.get("GET", "/")
		cb, _ := url.Parse(idp.login(w.Header().Get("Location"), ann))
		q := cb.Query()
		q.Set("state", "attacker-state")
		cb.RawQuery = q.Encode()
		if w, _ := b.get("GET", cb.String()); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("%d %s", w.Code, w.Body)
		}
	})
	t.Run("login of another browser", func(t *testing.T) {
		// The attacker starts a login and sends the victim its callback
		// URL (login CSRF): the victim's browser has no matching cookie.
		attacker, victim := newBrowser(t, p, clk), newBrowser(t, p, clk)
		w, _ := attacker.get("GET", "/")
		cb := idp.login(w.Header().Get("Location"), ann)
		victim.get("GET", "/") // a login of its own under way
		if w, _ := victim.get("GET", cb); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("%d %s", w.Code, w.Body)
		}
		if w, _ := newBrowser(t, p, clk).get("GET", cb); w.Code != http.StatusForbidden {
			t.Errorf("no login cookie: %d %s", w.Code, w.Body)
		}
	})
	t.Run("PKCE mismatch", func(t *testing.T) {
		// Two logins in one browser: the second's cookie (verifier)
		// replaces the first's, so the first's code fails at the
		// provider and its state here.
		b := newBrowser(t, p, clk)
		w1, _ := b.get("GET", "/")
		first := idp.login(w1.Header().Get("Location"), ann)
		w2, _ := b.get("GET", "/")
		idp.login(w2.Header().Get("Location"), ann)
		if w, _ := b.get("GET", first); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("%d %s", w.Code, w.Body)
		}
		// A code whose verifier is not the cookie's, with the right state.
		b = newBrowser(t, p, clk)
		w, _ := b.get("GET", "/")
		loc, _ := url.Parse(w.Header().Get("Location"))
		q := loc.Query()
		q.Set("code_challenge", "not-the-challenge")
		loc.RawQuery = q.Encode()
		if w, _ := b.get("GET", idp.login(loc.String(), ann)); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("verifier mismatch: %d %s", w.Code, w.Body)
		}
	})
	t.Run("nonce mismatch", func(t *testing.T) {
		b := newBrowser(t, p, clk)
		w, _ := b.get("GET", "/")
		id := ann
		id.Nonce = "replayed-token-nonce"
		if w, _ := b.get("GET", idp.login(w.Header().Get("Location"), id)); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("%d %s", w.Code, w.Body)
		}
	})
	t.Run("provider error", func(t *testing.T) {
		b := newBrowser(t, p, clk)
		b.get("GET", "/")
		w, _ := b.get("GET", CallbackPath+"?error=access_denied%0D%0A&state=x")
		if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "access_denied??") {
			t.Errorf("%d %q", w.Code, w.Body)
		}
	})
	t.Run("login too slow", func(t *testing.T) {
		clk := newClock()
		p := compileOIDC(t, idp, clk, nil)
		b := newBrowser(t, p, clk)
		w, _ := b.get("GET", "/")
		cb := idp.login(w.Header().Get("Location"), ann)
		clk.Add(loginLifetime + time.Second)
		if w, _ := b.get("GET", cb); w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeLoginFailed {
			t.Errorf("%d %s", w.Code, w.Body)
		}
	})
	t.Run("not GET", func(t *testing.T) {
		w, _ := newBrowser(t, p, clk).get("POST", "/form")
		if w.Code != http.StatusUnauthorized || w.Header().Get("Tunnelkit-Error") != CodeUnauthorized {
			t.Errorf("%d %s", w.Code, w.Body)
		}
	})
	t.Run("open redirect", func(t *testing.T) {
		b := newBrowser(t, p, clk)
		w, _ := b.get("GET", "//evil.example/x")
		w, _ = b.get("GET", idp.login(w.Header().Get("Location"), ann))
		if loc := w.Header().Get("Location"); loc != "/" {
			t.Errorf("back to %q after the login; want /", loc)
		}
	})
}

func TestOIDCSessionCookie(t *testing.T) {
	clk := newClock()
	idp := new(fakeIdP)
	p := compileOIDC(t, idp, clk, nil)
	b := newBrowser(t, p, clk)
	b.loginAs(idp, "/", ann)
	good := *b.cookies[SessionCookie]

	newLogin := func(name string) {
		t.Helper()
		w, r := b.get("GET", "/")
		if r != nil || w.Code != http.StatusFound || !strings.HasPrefix(w.Header().Get("Location"), "https://idp.example/") {
			t.Errorf("%s: %d; want a new login", name, w.Code)
		}
	}
	// Tampered: any change to the sealed value.
	for _, i := range []int{0, 5, len(good.Value) / 2, len(good.Value) - 1} {
		v := []byte(good.Value)
		if v[i] == 'A' {
			v[i] = 'B'
		} else {
			v[i] = 'A'
		}
		b.cookies[SessionCookie] = &http.Cookie{Name: SessionCookie, Value: string(v)}
		newLogin(fmt.Sprintf("tampered byte %d", i))
	}
	b.cookies[SessionCookie] = &http.Cookie{Name: SessionCookie, Value: "garbage"}
	newLogin("garbage")
	b.cookies[SessionCookie] = &http.Cookie{Name: SessionCookie, Value: strings.Repeat("A", 5000)}
	newLogin("huge")

	// Another host (another endpoint sharing the key): not valid there.
	other := newBrowser(t, p, clk)
	other.host = "other.example.test"
	other.cookies[SessionCookie] = &good
	if w, r := other.get("GET", "/"); r != nil || w.Code != http.StatusFound {
		t.Errorf("a cookie of app.example.test let a request to other.example.test in")
	}
	// The same host on another port: valid (browsers share cookies across ports).
	port := newBrowser(t, p, clk)
	port.host = "app.example.test:8443"
	port.cookies[SessionCookie] = &good
	if _, r := port.get("GET", "/"); r == nil {
		t.Error("the session does not hold on another port")
	}
	// Another client of the same issuer, with the same key: not valid.
	q := compileOIDC(t, idp, clk, &OIDC{Issuer: "https://idp.example", ClientID: "other-app", AllowEmails: []string{"ann@example.com"}})
	b3 := newBrowser(t, q, clk)
	b3.cookies[SessionCookie] = &good
	if _, r := b3.get("GET", "/"); r != nil {
		t.Error("a cookie of another client was accepted")
	}
	// A policy that no longer allows the account refuses its session.
	r := compileOIDC(t, idp, clk, &OIDC{Issuer: "https://idp.example", ClientID: "app", AllowEmails: []string{"zed@example.com"}})
	b4 := newBrowser(t, r, clk)
	b4.cookies[SessionCookie] = &good
	if w, _ := b4.get("GET", "/"); w.Code != http.StatusForbidden {
		t.Errorf("session of an account no longer allowed: %d", w.Code)
	}
	// Valid until it expires.
	b.cookies[SessionCookie] = &good
	clk.Add(DefaultSessionLifetime - time.Minute)
	if _, r := b.get("GET", "/"); r == nil {
		t.Error("the session ended early")
	}
	clk.Add(2 * time.Minute)
	newLogin("expired")
}

func TestOIDCCompile(t *testing.T) {
	spec := Spec{OIDC: &OIDC{Issuer: "https://idp.example", ClientID: "app", AllowDomains: []string{"example.com"}}}
	key := []byte("0123456789abcdef0123456789abcdef")
	hook := func(context.Context, OIDCConfig) (Provider, error) { return new(fakeIdP), nil }
	for _, tc := range []struct {
		name string
		opts Options
		want error
	}{
		{"no hook", Options{CookieKey: key}, ErrUnsupported},
		{"no key", Options{OIDC: hook}, ErrUnsupported},
		{"short key", Options{OIDC: hook, CookieKey: key[:31]}, ErrUnsupported},
		{"provider down", Options{CookieKey: key, OIDC: func(context.Context, OIDCConfig) (Provider, error) {
			return nil, errors.New("dial tcp: connection refused")
		}}, ErrUnavailable},
		{"provider refuses", Options{CookieKey: key, OIDC: func(context.Context, OIDCConfig) (Provider, error) {
			return nil, fmt.Errorf("%w: issuer on a private network", ErrForbidden)
		}}, ErrForbidden},
		{"ok", Options{CookieKey: key, OIDC: hook}, nil},
	} {
		_, err := Compile(t.Context(), ProtoHTTPS, spec, tc.opts)
		if !errors.Is(err, tc.want) || (err == nil) != (tc.want == nil) {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
		}
	}
	// The hook gets the kind's provider and client.
	var got OIDCConfig
	spec.OIDC.ClientSecret = "s"
	Compile(t.Context(), ProtoHTTPS, spec, Options{CookieKey: key, OIDC: func(_ context.Context, c OIDCConfig) (Provider, error) {
		got = c
		return new(fakeIdP), nil
	}})
	if got != (OIDCConfig{Issuer: "https://idp.example", ClientID: "app", ClientSecret: "s"}) {
		t.Errorf("hook got %+v", got)
	}
}

// Edges that share a cookie key accept each other's sessions.
func TestOIDCSharedKey(t *testing.T) {
	clk := newClock()
	idp := new(fakeIdP)
	edge1, edge2 := compileOIDC(t, idp, clk, nil), compileOIDC(t, idp, clk, nil)
	b := newBrowser(t, edge1, clk)
	b.loginAs(idp, "/", ann)
	b.p = edge2
	if _, r := b.get("GET", "/"); r == nil || r.Header.Get(HeaderAuthEmail) != "ann@example.com" {
		t.Error("the second edge does not accept the first's session")
	}
}

// The oidc action: a login of any account the issuer verified (its later
// rules say who may in), whose callback the policy answers before any
// rule, even one that would take the callback's path.
func TestOIDCAction(t *testing.T) {
	clk := newClock()
	idp := &fakeIdP{}
	spec := mustParse(t, `{"on_http_request":[
		{"name":"catch","actions":[{"type":"redirect","config":{"from":"/\\.tunnelkit/","to":"/caught/"}}]},
		{"name":"login","actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"app","scopes":["openid","email"]}}]}]}`)
	opts := Options{
		OIDC:      func(context.Context, OIDCConfig) (Provider, error) { return idp, nil },
		CookieKey: []byte("0123456789abcdef0123456789abcdef"),
		Now:       clk.Now,
	}
	p := mustCompile(t, ProtoHTTPS, spec, opts)
	b := newBrowser(t, p, clk)
	bob := Identity{Subject: "user-2", Email: "bob@anywhere.example", EmailVerified: true}
	r := b.loginAs(idp, "/private?x=1", bob)
	if r.Header.Get(HeaderAuthEmail) != bob.Email || r.Header.Get(HeaderAuthSubject) != bob.Subject {
		t.Errorf("after the login: %v", r.Header)
	}
	// An unverified address is refused, list or no list.
	b2 := newBrowser(t, p, clk)
	w, _ := b2.get("GET", "/private")
	cb := idp.login(w.Header().Get("Location"), Identity{Subject: "user-3", Email: "eve@anywhere.example"})
	if w, _ = b2.get("GET", cb); w.Code != http.StatusForbidden {
		t.Errorf("an unverified e-mail address: %d", w.Code)
	}

	for _, tc := range []struct {
		proto, js string
		want      error
	}{
		{ProtoHTTP, `{"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"app"}}]}]}`, ErrProtocol},
		{ProtoHTTPS, `{"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"app","scopes":["offline_access"]}}]}]}`, ErrInvalid},
		{ProtoHTTPS, `{"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"http://idp.example","client_id":"app"}}]}]}`, ErrInvalid},
		{ProtoHTTPS, `{"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"app"}},{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"b"}}]}]}`, ErrProtocol},
		{ProtoHTTPS, `{"oidc":{"issuer":"https://idp.example","client_id":"app","allow_domains":["a.example"]},"on_http_request":[{"actions":[{"type":"oidc","config":{"issuer_url":"https://idp.example","client_id":"app"}}]}]}`, ErrProtocol},
	} {
		s, err := Parse([]byte(tc.js))
		if err == nil {
			_, err = Compile(t.Context(), tc.proto, s, opts)
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s %s: %v; want %v", tc.proto, tc.js, err, tc.want)
		}
	}
	if _, err := Combine(ProtoHTTPS, Operator{OIDCIssuers: []string{"https://other.example"}}, spec); !errors.Is(err, ErrForbidden) {
		t.Errorf("an oidc action's issuer the operator does not allow: %v", err)
	}
}
