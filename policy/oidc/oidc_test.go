package oidc

import (
	"crypto/x509"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"

	"github.com/tunnelkit/tunnelkit/policy"
)

func TestMain(m *testing.M) {
	// The example provider logs each request through slog's default
	// logger.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

const (
	clientID     = "tunnelkit-edge"
	clientSecret = "edge-secret"
	password     = "verysecure"
)

// world is a real OpenID provider (zitadel's example server) and an edge
// whose handler runs a policy's Check before an app, each on a loopback
// port with TLS.
type world struct {
	t        *testing.T
	issuer   string
	edgeURL  string
	roots    *x509.CertPool
	pol      atomic.Pointer[policy.Policy]
	clock    *clock
	discover atomic.Int32 // discovery documents served
	userinfo atomic.Int32 // userinfo requests served
	users    string       // the user name host: test-user@<users>
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// listen returns a loopback listener and its https URL.
func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln, "https://" + ln.Addr().String()
}

var registerOnce sync.Mutex

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, clock: &clock{t: time.Now()}}
	opLn, issuer := listen(t)
	edgeLn, edgeURL := listen(t)
	w.issuer, w.edgeURL, w.users = issuer, edgeURL, "127.0.0.1"

	// The provider, with the edge's callback registered.
	registerOnce.Lock()
	storage.RegisterClients(storage.WebClient(clientID, clientSecret, edgeURL+policy.CallbackPath))
	registerOnce.Unlock()
	op := exampleop.SetupServer(issuer, storage.NewStorage(storage.NewUserStore(issuer)), nil, false)
	opSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			w.discover.Add(1)
		case "/userinfo":
			w.userinfo.Add(1)
		}
		op.ServeHTTP(rw, r)
	}))
	opSrv.Listener = opLn
	opSrv.StartTLS()
	t.Cleanup(opSrv.Close)
	w.roots = x509.NewCertPool()
	w.roots.AddCert(opSrv.Certificate())

	// The edge: the policy, then the app, which shows what it got.
	app := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "email=%s subject=%s cookie=%s",
			r.Header.Get(policy.HeaderAuthEmail), r.Header.Get(policy.HeaderAuthSubject), r.Header.Get("Cookie"))
	})
	edge := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		client := netip.MustParseAddrPort(r.RemoteAddr).Addr()
		if w.pol.Load().Check(rw, r, client) {
			return
		}
		app.ServeHTTP(rw, r)
	}))
	edge.Listener = edgeLn
	edge.StartTLS()
	t.Cleanup(edge.Close)
	w.roots.AddCert(edge.Certificate())
	return w
}

// compile sets the edge's policy: an oidc kind allowing emails.
func (w *world) compile(providers *Providers, emails ...string) error {
	pol, err := policy.Compile(w.t.Context(), policy.ProtoHTTPS, policy.Spec{OIDC: &policy.OIDC{
		Issuer: w.issuer, ClientID: clientID, ClientSecret: clientSecret, AllowEmails: emails,
	}}, policy.Options{
		OIDC:      providers.Provider,
		CookieKey: []byte("a key of 32 bytes or more, secret"),
		Now:       w.clock.Now,
	})
	if err == nil {
		w.pol.Store(pol)
	}
	return err
}

func (w *world) providers() *Providers {
	ps := &Providers{RootCAs: w.roots, AllowPrivateNetworks: true}
	w.t.Cleanup(ps.CloseIdleConnections)
	return ps
}

// browser returns an HTTP client with a cookie jar that trusts both
// servers; follow false stops at the first redirect.
func (w *world) browser(follow bool) *http.Client {
	jar, _ := cookiejar.New(nil)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig.RootCAs = w.roots
	c := &http.Client{Jar: jar, Transport: tr}
	if !follow {
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	w.t.Cleanup(tr.CloseIdleConnections)
	return c
}

var loginID = regexp.MustCompile(`name="id" value="([^"]*)"`)

// login opens path on the edge in c, follows it to the provider's login
// form, posts user's credentials, and returns where that ends.
func (w *world) login(c *http.Client, path, user string) (status int, body string, header http.Header) {
	w.t.Helper()
	resp, err := c.Get(w.edgeURL + path)
	if err != nil {
		w.t.Fatal(err)
	}
	page := read(w.t, resp)
	return w.submit(c, resp, page, user)
}

// submit posts user's credentials to the login form page, which resp
// brought.
func (w *world) submit(c *http.Client, resp *http.Response, page, user string) (int, string, http.Header) {
	w.t.Helper()
	if !strings.HasPrefix(resp.Request.URL.String(), w.issuer+"/login/username") {
		w.t.Fatalf("ended at %s (%d), not the provider's login form:\n%s", resp.Request.URL, resp.StatusCode, page)
	}
	m := loginID.FindStringSubmatch(page)
	if m == nil {
		w.t.Fatalf("no auth request id in the login form:\n%s", page)
	}
	resp, err := c.PostForm(w.issuer+"/login/username", url.Values{
		"id": {html.UnescapeString(m[1])}, "username": {user}, "password": {password},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	body := read(w.t, resp)
	return resp.StatusCode, body, resp.Header
}

func read(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (w *world) user() string  { return "test-user@" + w.users } // e-mail test-user@zitadel.ch
func (w *world) user2() string { return "test-user2" }           // e-mail test-user2@zitadel.ch

func TestLoginAllowed(t *testing.T) {
	w := newWorld(t)
	if err := w.compile(w.providers(), "test-user@zitadel.ch"); err != nil {
		t.Fatal(err)
	}
	c := w.browser(true)
	status, body, _ := w.login(c, "/dashboard?tab=2", w.user())
	if status != 200 || !strings.HasPrefix(body, "email=test-user@zitadel.ch subject=id1 ") {
		t.Fatalf("after the login: %d %q; want the app, with the identity", status, body)
	}
	if strings.Contains(body, "tunnelkit") {
		t.Errorf("the app got the edge's cookies: %q", body)
	}
	// This provider puts the e-mail address in userinfo only, not in the
	// ID token of a code flow: the subject-checked fallback ran.
	if w.userinfo.Load() == 0 {
		t.Error("no userinfo request")
	}
	// The session holds; a forged identity is replaced by the real one.
	req, _ := http.NewRequest("GET", w.edgeURL+"/api", nil)
	req.Header.Set(policy.HeaderAuthEmail, "boss@zitadel.ch")
	req.Header.Set(policy.HeaderAuthSubject, "id0")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := read(t, resp); resp.StatusCode != 200 || !strings.HasPrefix(body, "email=test-user@zitadel.ch subject=id1 ") {
		t.Errorf("with forged identity headers: %d %q", resp.StatusCode, body)
	}
	// The session cookie is host-only, Secure, HttpOnly and Lax.
	resp, err = c.Get(w.edgeURL + policy.LogoutPath)
	if err != nil {
		t.Fatal(err)
	}
	read(t, resp)
	if c.Jar.Cookies(mustURL(w.edgeURL)) != nil {
		t.Errorf("cookies after logout: %v", c.Jar.Cookies(mustURL(w.edgeURL)))
	}
}

func TestLoginDisallowed(t *testing.T) {
	w := newWorld(t)
	if err := w.compile(w.providers(), "test-user@zitadel.ch"); err != nil {
		t.Fatal(err)
	}
	status, body, h := w.login(w.browser(true), "/", w.user2())
	if status != http.StatusForbidden || h.Get("Tunnelkit-Error") != policy.CodePolicyDenied {
		t.Fatalf("test-user2@zitadel.ch: %d %q; want 403 policy_denied", status, body)
	}
}

// An expired or tampered session cookie starts a new login, which
// succeeds.
func TestLoginAgain(t *testing.T) {
	w := newWorld(t)
	if err := w.compile(w.providers(), "test-user@zitadel.ch"); err != nil {
		t.Fatal(err)
	}
	c := w.browser(true)
	if status, body, _ := w.login(c, "/", w.user()); status != 200 {
		t.Fatalf("login: %d %q", status, body)
	}
	edge := mustURL(w.edgeURL)
	session := func() *http.Cookie {
		for _, ck := range c.Jar.Cookies(edge) {
			if ck.Name == policy.SessionCookie {
				return ck
			}
		}
		t.Fatal("no session cookie")
		return nil
	}
	stop := &http.Client{Jar: c.Jar, Transport: c.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	toLogin := func(why string) {
		t.Helper()
		resp, err := stop.Get(w.edgeURL + "/again")
		if err != nil {
			t.Fatal(err)
		}
		read(t, resp)
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, w.issuer) {
			t.Fatalf("%s: %d to %q; want a new login at the provider", why, resp.StatusCode, loc)
		}
		// And the login goes through.
		if status, body, _ := w.login(c, "/again", w.user()); status != 200 || !strings.HasPrefix(body, "email=test-user@zitadel.ch") {
			t.Fatalf("%s: the new login: %d %q", why, status, body)
		}
	}

	good := session()
	v := []byte(good.Value)
	v[len(v)/2] ^= 'A' ^ 'B'
	c.Jar.SetCookies(edge, []*http.Cookie{{Name: policy.SessionCookie, Value: string(v), Path: "/", Secure: true}})
	toLogin("tampered")

	w.clock.Add(policy.DefaultSessionLifetime + time.Second)
	toLogin("expired")
}

// A callback whose state is not the browser's login's, or whose code was
// issued for another PKCE challenge, logs nobody in.
func TestLoginStateAndPKCE(t *testing.T) {
	w := newWorld(t)
	if err := w.compile(w.providers(), "test-user@zitadel.ch"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, param, value, why string
	}{
		{"state mismatch", "state", "a-state-of-another-login", "state does not match"},
		// The provider binds the code to this challenge, which is not
		// that of the verifier in the browser's login cookie.
		{"PKCE mismatch", "code_challenge", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM", "did not accept the login's code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := w.browser(true)
			stop := &http.Client{Jar: c.Jar, Transport: c.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := stop.Get(w.edgeURL + "/")
			if err != nil {
				t.Fatal(err)
			}
			read(t, resp)
			auth, err := url.Parse(resp.Header.Get("Location"))
			if err != nil || !strings.HasPrefix(auth.String(), w.issuer) {
				t.Fatalf("%d to %q; want the provider", resp.StatusCode, resp.Header.Get("Location"))
			}
			q := auth.Query()
			if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("nonce") == "" {
				t.Fatalf("the authorization request lacks PKCE or a nonce: %s", auth)
			}
			q.Set(tc.param, tc.value)
			auth.RawQuery = q.Encode()
			resp, err = c.Get(auth.String())
			if err != nil {
				t.Fatal(err)
			}
			page := read(t, resp)
			status, body, h := w.submit(c, resp, page, w.user())
			if status != http.StatusForbidden || h.Get("Tunnelkit-Error") != policy.CodeLoginFailed || !strings.Contains(body, tc.why) {
				t.Fatalf("%d %q; want 403 login_failed: ...%s", status, body, tc.why)
			}
			for _, ck := range c.Jar.Cookies(mustURL(w.edgeURL)) {
				if ck.Name == policy.SessionCookie {
					t.Fatal("got a session")
				}
			}
		})
	}
}

// By default, providers on non-public addresses are refused for good.
func TestProvidersRefusePrivate(t *testing.T) {
	w := newWorld(t)
	err := w.compile(&Providers{RootCAs: w.roots}, "test-user@zitadel.ch")
	if !errors.Is(err, policy.ErrForbidden) || !errors.Is(err, ErrPrivateAddress) {
		t.Fatalf("Compile with a loopback issuer: %v; want ErrForbidden, ErrPrivateAddress", err)
	}
	for _, a := range []string{"127.0.0.1:443", "[::1]:443", "10.1.2.3:443", "192.168.0.1:443", "169.254.169.254:80",
		"100.64.0.1:443", "0.0.0.0:443", "[fd00::1]:443", "[fe80::1]:443", "[::ffff:127.0.0.1]:443", "224.0.0.1:443"} {
		if err := refusePrivate("tcp", a, nil); !errors.Is(err, ErrPrivateAddress) {
			t.Errorf("%s: %v; want refused", a, err)
		}
	}
	for _, a := range []string{"8.8.8.8:443", "[2001:4860:4860::8888]:443"} {
		if err := refusePrivate("tcp", a, nil); err != nil {
			t.Errorf("%s: %v", a, err)
		}
	}
}

// Binds that name the same issuer share its discovery document.
func TestProvidersCache(t *testing.T) {
	w := newWorld(t)
	ps := w.providers()
	for range 3 {
		if err := w.compile(ps, "test-user@zitadel.ch"); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.discover.Load(); n != 1 {
		t.Errorf("%d discovery fetches for three binds; want 1", n)
	}
	// Each bind's provider works.
	if status, body, _ := w.login(w.browser(true), "/", w.user()); status != 200 {
		t.Errorf("login: %d %q", status, body)
	}
}

// A provider that is down, or answers with too much, makes the bind
// unavailable (for now), not refused.
func TestProvidersUnavailable(t *testing.T) {
	huge := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, `{"issuer":"x","pad":"`)
		for range 2 << 10 {
			io.WriteString(rw, strings.Repeat("a", 1<<10))
		}
	}))
	defer huge.Close()
	dead, _ := listen(t)
	deadURL := "https://" + dead.Addr().String()
	dead.Close()
	roots := x509.NewCertPool()
	roots.AddCert(huge.Certificate())
	ps := &Providers{RootCAs: roots, AllowPrivateNetworks: true}
	defer ps.CloseIdleConnections()
	for _, issuer := range []string{huge.URL, deadURL} {
		_, err := policy.Compile(t.Context(), policy.ProtoHTTPS, policy.Spec{OIDC: &policy.OIDC{
			Issuer: issuer, ClientID: "c", AllowDomains: []string{"example.com"},
		}}, policy.Options{OIDC: ps.Provider, CookieKey: make([]byte, 32)})
		if !errors.Is(err, policy.ErrUnavailable) {
			t.Errorf("%s: %v; want ErrUnavailable", issuer, err)
		}
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

// The oidc action of traffic policy rules, against the real provider: a
// login of any account the provider verified, whose callback the policy
// answers before a rule that would take its path; a later visit holds the
// session.
func TestOIDCActionLogin(t *testing.T) {
	w := newWorld(t)
	spec, err := policy.Parse([]byte(`{"on_http_request":[
		{"name":"would take the callback","actions":[{"type":"redirect","config":{"from":"/\\.tunnelkit/","to":"/taken/"}}]},
		{"name":"login","actions":[{"type":"oidc","config":{"issuer_url":"` + w.issuer + `","client_id":"` + clientID + `","client_secret":"` + clientSecret + `","scopes":["openid","email","profile"]}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Compile(t.Context(), policy.ProtoHTTPS, spec, policy.Options{
		OIDC:      w.providers().Provider,
		CookieKey: []byte("a key of 32 bytes or more, secret"),
		Now:       w.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	w.pol.Store(pol)
	c := w.browser(true)
	status, body, _ := w.login(c, "/reports?q=1", w.user2())
	if status != 200 || !strings.HasPrefix(body, "email=test-user2@zitadel.ch subject=id2 ") {
		t.Fatalf("after the login: %d %q; want the app, with the identity", status, body)
	}
	resp, err := c.Get(w.edgeURL + "/other")
	if err != nil {
		t.Fatal(err)
	}
	if body := read(t, resp); !strings.HasPrefix(body, "email=test-user2@zitadel.ch") {
		t.Errorf("the session on another path: %q", body)
	}
}
