package policy

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

func basicHeader(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

func TestBasicAuth(t *testing.T) {
	p := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:s3cret", "bob:pw:with:colons", "zoë:ünïcode"}}}, Options{})
	for _, tc := range []struct {
		auth     string
		wantUser string // "": refused
	}{
		{basicHeader("ann", "s3cret"), "ann"},
		{basicHeader("bob", "pw:with:colons"), "bob"},
		{basicHeader("zoë", "ünïcode"), "zoë"},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("ann:s3cret")), "ann"}, // scheme in any case
		{"Basic   " + base64.StdEncoding.EncodeToString([]byte("ann:s3cret")), "ann"},
		{basicHeader("ann", "s3cret2"), ""},
		{basicHeader("ann", "s3cre"), ""},
		{basicHeader("ann", ""), ""},
		{basicHeader("bob", "s3cret"), ""}, // another's password
		{basicHeader("anns", "3cret"), ""}, // the same bytes, split elsewhere
		{basicHeader("", "s3cret"), ""},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("ann")), ""},
		{"Basic !!!", ""},
		{"Bearer " + base64.StdEncoding.EncodeToString([]byte("ann:s3cret")), ""},
		{"Basic " + strings.Repeat("QUFB", 200), ""}, // longer than any credential
		{"", ""},
	} {
		r := newRequest("GET", "/")
		if tc.auth != "" {
			r.Header.Set("Authorization", tc.auth)
		}
		served, w := check(p, r, "192.0.2.1")
		if tc.wantUser == "" {
			if !served || w.Code != http.StatusUnauthorized || w.Header().Get("Tunnelkit-Error") != CodeUnauthorized ||
				!strings.HasPrefix(w.Header().Get("WWW-Authenticate"), `Basic realm="tunnelkit"`) {
				t.Errorf("Authorization %q: served %v, %d %q, WWW-Authenticate %q; want 401 unauthorized", tc.auth, served, w.Code, w.Header().Get("Tunnelkit-Error"), w.Header().Get("WWW-Authenticate"))
			}
			continue
		}
		if served {
			t.Errorf("Authorization %q: refused (%d %s)", tc.auth, w.Code, w.Body)
			continue
		}
		if got := r.Header.Get(HeaderAuthUser); got != tc.wantUser {
			t.Errorf("Authorization %q: %s %q; want %q", tc.auth, HeaderAuthUser, got, tc.wantUser)
		}
		if _, ok := r.Header["Authorization"]; ok {
			t.Errorf("Authorization %q: passed on to the app", tc.auth)
		}
	}
	// Two Authorization headers are one too many.
	r := newRequest("GET", "/")
	r.Header["Authorization"] = []string{basicHeader("ann", "s3cret"), basicHeader("ann", "s3cret")}
	if served, _ := check(p, r, "192.0.2.1"); !served {
		t.Error("two Authorization headers accepted")
	}

	pass := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:s3cret"}, PassAuthorization: true}}, Options{})
	r = newRequest("GET", "/")
	r.Header.Set("Authorization", basicHeader("ann", "s3cret"))
	if served, _ := check(pass, r, "192.0.2.1"); served || r.Header.Get("Authorization") == "" {
		t.Errorf("pass_authorization: served %v, Authorization %q", served, r.Header.Get("Authorization"))
	}
}

// The compiled policy holds no password in clear.
func TestBasicAuthNoClearPassword(t *testing.T) {
	p := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:correct-horse-battery"}}}, Options{})
	for _, m := range findAct[*basicAct](t, p).auth.macs {
		if strings.Contains(string(m[:]), "correct-horse") {
			t.Fatal("a password in clear")
		}
	}
	// Two compiles of the same spec hash under different keys.
	q := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:correct-horse-battery"}}}, Options{})
	if findAct[*basicAct](t, p).auth.macs[0] == findAct[*basicAct](t, q).auth.macs[0] {
		t.Error("the same hash in two policies: the key is not random")
	}
}

func TestReservedHeadersStripped(t *testing.T) {
	forged := func() *http.Request {
		r := newRequest("GET", "/")
		r.Header.Set(HeaderAuthEmail, "boss@example.com")
		r.Header.Set(HeaderAuthUser, "root")
		r.Header.Set(HeaderClientCertSubject, "CN=boss")
		r.Header["tunnelkit-auth-subject"] = []string{"not canonical"}
		r.Header.Set("Tunnelkit-Anything-Later", "x")
		r.Header.Set("X-Keep", "y")
		return r
	}
	var none *Policy
	empty := mustCompile(t, ProtoHTTP, Spec{}, Options{})
	basic := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:pw"}}}, Options{})
	for name, p := range map[string]*Policy{"nil": none, "empty": empty, "basic": basic} {
		r := forged()
		r.Header.Set("Authorization", basicHeader("ann", "pw"))
		if served, w := check(p, r, "192.0.2.1"); served {
			t.Fatalf("%s: refused: %d %s", name, w.Code, w.Body)
		}
		for k, v := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "tunnelkit-") && !(k == HeaderAuthUser && slices.Equal(v, []string{"ann"})) {
				t.Errorf("%s: %s: %q reached the app", name, k, v)
			}
		}
		if r.Header.Get("X-Keep") != "y" {
			t.Errorf("%s: X-Keep removed", name)
		}
	}
}

// trailingBody is a request body at whose end net/http adds the trailers
// that came (fill) to the request's Trailer map, as it does for HTTP/1.1
// chunks (any trailer) and HTTP/2 (the announced ones).
type trailingBody struct {
	io.Reader
	trailer, fill http.Header
}

func (b *trailingBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		maps.Copy(b.trailer, b.fill)
	}
	return n, err
}

func (b *trailingBody) Close() error { return nil }

// Names that app stacks fold into the edge's own (CGI and PHP read
// Tunnelkit_Auth_User and Tunnelkit.Auth.User, as Tunnelkit-Auth-User, as
// HTTP_TUNNELKIT_AUTH_USER) are dropped: every spelling of a Tunnelkit-*
// name, and every spelling of an X-Forwarded-* or Forwarded name but the
// canonical one, which the edge appends to. A trailer named like any of
// them is dropped, however spelled, announced or not (issue #32, item 6).
func TestReservedHeaderSpellings(t *testing.T) {
	forged := func() *http.Request {
		r := newRequest("POST", "/")
		r.Header = http.Header{
			"Tunnelkit_Auth_User": {"root"}, "Tunnelkit.Auth.User": {"root"}, "Tunnelkit-Auth_user": {"root"},
			"tunnelkit_auth_email": {"boss@example.com"}, "TUNNELKIT.CLIENT-CERT_SUBJECT": {"CN=root"},
			"X_Forwarded_For": {"6.6.6.6"}, "X.Forwarded.Proto": {"http"}, "x-forwarded-host": {"evil.example"},
			"X-Forwarded_Host": {"evil.example"}, "FORWARDED": {"for=6.6.6.6"}, "X_Forwarded_Port": {"1"},
			"X-Forwarded-For": {"198.51.100.1"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"app.example.test"},
			"Forwarded": {"for=198.51.100.1"}, "X-Forwarded-Port": {"443"},
			"X-Tunnelkit-Auth-User": {"kept"}, "Tunnelkit": {"kept"}, "X_Real_Ip": {"kept"},
			"Authorization": {basicHeader("ann", "pw")},
		}
		r.Trailer = http.Header{"Tunnelkit-Auth-User": nil, "Tunnelkit_Auth_User": nil, "X-Forwarded-For": nil, "X-Checksum": nil}
		r.Body = &trailingBody{Reader: strings.NewReader("body"), trailer: r.Trailer, fill: http.Header{
			"Tunnelkit-Auth-User": {"root"}, "Tunnelkit_Auth_User": {"root"}, "X-Forwarded-For": {"6.6.6.6"},
			"Forwarded": {"for=6.6.6.6"}, "Tunnelkit.Auth.Email": {"boss@example.com"}, "X-Checksum": {"abc"},
		}}
		return r
	}
	want := http.Header{
		"X-Forwarded-For": {"198.51.100.1"}, "X-Forwarded-Proto": {"https"}, "X-Forwarded-Host": {"app.example.test"},
		"Forwarded": {"for=198.51.100.1"}, "X-Forwarded-Port": {"443"},
		"X-Tunnelkit-Auth-User": {"kept"}, "Tunnelkit": {"kept"}, "X_Real_Ip": {"kept"},
	}
	var none *Policy
	basic := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"ann:pw"}}}, Options{})
	for name, p := range map[string]*Policy{"nil": none, "basic": basic} {
		r := forged()
		if served, w := check(p, r, "192.0.2.1"); served {
			t.Fatalf("%s: refused: %d %s", name, w.Code, w.Body)
		}
		want := maps.Clone(want)
		if p != nil {
			want[HeaderAuthUser] = []string{"ann"}
		} else {
			want["Authorization"] = []string{basicHeader("ann", "pw")}
		}
		if !maps.EqualFunc(r.Header, want, slices.Equal) {
			t.Errorf("%s: the app gets the headers\n%v\nwant\n%v", name, r.Header, want)
		}
		if got := slices.Sorted(maps.Keys(r.Trailer)); !slices.Equal(got, []string{"X-Checksum"}) {
			t.Errorf("%s: trailers announced to the app: %q; want X-Checksum alone", name, got)
		}
		if b, err := io.ReadAll(r.Body); err != nil || string(b) != "body" {
			t.Fatalf("%s: body %q, %v", name, b, err)
		}
		if want := (http.Header{"X-Checksum": {"abc"}}); !maps.EqualFunc(r.Trailer, want, slices.Equal) {
			t.Errorf("%s: trailers the app gets: %v; want %v", name, r.Trailer, want)
		}
	}
}

func TestHeaders(t *testing.T) {
	p := mustCompile(t, ProtoHTTP, Spec{
		RequestHeaders: &Headers{
			Add:    []string{"X-Env: prod", "x-multi: one", "X-Multi:two", "X-Empty:"},
			Remove: []string{"x-debug", "Cookie"},
		},
		ResponseHeaders: &Headers{
			Add:    []string{"Strict-Transport-Security: max-age=63072000"},
			Remove: []string{"Server", "X-Powered-By"},
		},
	}, Options{})
	r := newRequest("GET", "/")
	r.Header.Set("X-Env", "dev")
	r.Header.Set("X-Debug", "1")
	r.Header.Set("Cookie", "a=b")
	if served, _ := check(p, r, "192.0.2.1"); served {
		t.Fatal("refused")
	}
	want := http.Header{"X-Env": {"prod"}, "X-Multi": {"one", "two"}, "X-Empty": {""}}
	for k, v := range want {
		if !slices.Equal(r.Header[k], v) {
			t.Errorf("%s: %q; want %q", k, r.Header[k], v)
		}
	}
	for _, k := range []string{"X-Debug", "Cookie"} {
		if _, ok := r.Header[k]; ok {
			t.Errorf("%s kept", k)
		}
	}
	// An app's appending to a value the policy set does not reach the
	// next request.
	r.Header.Add("X-Multi", "three")
	r2 := newRequest("GET", "/")
	check(p, r2, "192.0.2.1")
	if got := r2.Header["X-Multi"]; !slices.Equal(got, []string{"one", "two"}) {
		t.Errorf("next request's X-Multi: %q", got)
	}

	h := http.Header{"Server": {"nginx"}, "X-Powered-By": {"PHP"}, "Content-Type": {"text/html"}}
	p.Response(&http.Response{StatusCode: 200, Header: h}, newRequest("GET", "/"), netip.Addr{})
	if len(h) != 2 || h.Get("Strict-Transport-Security") != "max-age=63072000" || h.Get("Content-Type") != "text/html" {
		t.Errorf("response header %v", h)
	}
	var none *Policy
	none.Response(&http.Response{Header: h}, newRequest("GET", "/"), netip.Addr{}) // no panic, no change
}

func TestRateLimitHTTP(t *testing.T) {
	clk := newClock()
	p := mustCompile(t, ProtoHTTP, Spec{RateLimit: &RateLimit{Requests: 3, Seconds: 2}}, Options{Now: clk.Now})
	for i := range 3 {
		if served, w := check(p, newRequest("GET", "/"), "192.0.2.1"); served {
			t.Fatalf("request %d refused: %d", i, w.Code)
		}
	}
	served, w := check(p, newRequest("GET", "/"), "192.0.2.1")
	if !served || w.Code != http.StatusTooManyRequests || w.Header().Get("Tunnelkit-Error") != CodeRateLimited {
		t.Fatalf("4th request: served %v, %d %q", served, w.Code, w.Header().Get("Tunnelkit-Error"))
	}
	// 3 per 2 s: a token every 2/3 s, so come back in 1 s (rounded up).
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q; want 1", got)
	}
	// Another client is not affected; the same /64 is.
	if served, _ := check(p, newRequest("GET", "/"), "192.0.2.2"); served {
		t.Error("another client refused")
	}
	for range 3 {
		check(p, newRequest("GET", "/"), "2001:db8:1:2::1")
	}
	if served, _ := check(p, newRequest("GET", "/"), "2001:db8:1:2:ffff::9"); !served {
		t.Error("another address of a /64 that spent its tokens is not limited")
	}
	if served, _ := check(p, newRequest("GET", "/"), "2001:db8:1:3::1"); served {
		t.Error("the next /64 is limited")
	}
	clk.Add(700 * time.Millisecond)
	if served, _ := check(p, newRequest("GET", "/"), "192.0.2.1"); served {
		t.Error("refused after a token came back")
	}
	if served, _ := check(p, newRequest("GET", "/"), "192.0.2.1"); !served {
		t.Error("two requests on one token")
	}
}

func TestRateLimitConn(t *testing.T) {
	clk := newClock()
	p := mustCompile(t, ProtoTCP, Spec{RateLimit: &RateLimit{Requests: 2}}, Options{Now: clk.Now})
	a := netip.MustParseAddr("198.51.100.7")
	for i := range 2 {
		if _, ok := p.AcceptConn(a); !ok {
			t.Fatalf("connection %d refused", i)
		}
	}
	if ref, ok := p.AcceptConn(a); ok || ref.Code != CodeRateLimited {
		t.Fatalf("3rd connection: %v, %v", ref, ok)
	}
	clk.Add(time.Second)
	if _, ok := p.AcceptConn(a); !ok {
		t.Fatal("refused after the bucket refilled")
	}
}

func TestMutualTLS(t *testing.T) {
	p := mustCompile(t, ProtoHTTPS, Spec{MutualTLS: &MutualTLS{CAs: testCAPEM}}, Options{})
	if p.ClientCAs() == nil || !p.ClientCAs().Equal(poolOf(testCA.cert)) {
		t.Fatal("ClientCAs is not the pool of the spec's CAs")
	}
	leaf := testCA.issue(t, pkix.Name{CommonName: "client-1", Organization: []string{"Acme"}})
	other := newCA("Other CA")
	otherLeaf := other.issue(t, pkix.Name{CommonName: "intruder"})
	for _, tc := range []struct {
		name string
		cs   *tls.ConnectionState
		want string // "": refused
	}{
		{"no TLS", nil, ""},
		{"no certificate", &tls.ConnectionState{}, ""},
		{"unverified", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}, ""},
		{"verified", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf, testCA.cert}}}, "CN=client-1,O=Acme"},
		{"verified by another pool", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{otherLeaf}, VerifiedChains: [][]*x509.Certificate{{otherLeaf, other.cert}}}, ""},
	} {
		r := newRequest("GET", "/")
		r.TLS = tc.cs
		r.Header.Set(HeaderClientCertSubject, "CN=forged")
		served, w := check(p, r, "192.0.2.1")
		if tc.want == "" {
			if !served || w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodePolicyDenied {
				t.Errorf("%s: served %v, %d", tc.name, served, w.Code)
			}
			continue
		}
		if served {
			t.Errorf("%s: refused", tc.name)
		} else if got := r.Header.Get(HeaderClientCertSubject); got != tc.want {
			t.Errorf("%s: subject %q; want %q", tc.name, got, tc.want)
		}
	}
	var none *Policy
	if none.ClientCAs() != nil || mustCompile(t, ProtoHTTPS, Spec{}, Options{}).ClientCAs() != nil {
		t.Error("ClientCAs without mutual_tls")
	}
}

func poolOf(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

// Refusals go through Options.Refuse, with the headers they need set.
func TestRefuseHook(t *testing.T) {
	var got []Refusal
	p := mustCompile(t, ProtoHTTP, Spec{
		CIDRDeny:  prefixes("10.0.0.0/8"),
		BasicAuth: &BasicAuth{Credentials: []string{"a:b"}},
	}, Options{Refuse: func(w http.ResponseWriter, r *http.Request, ref Refusal) {
		got = append(got, ref)
		if ref.Code == CodeUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Error("no WWW-Authenticate set before the hook")
		}
		w.WriteHeader(ref.Status)
	}})
	check(p, newRequest("GET", "/"), "10.1.1.1")
	check(p, newRequest("GET", "/"), "192.0.2.1")
	if len(got) != 2 || got[0].Code != CodePolicyDenied || got[0].Status != 403 || got[1].Code != CodeUnauthorized || got[1].Status != 401 {
		t.Errorf("refusals %+v", got)
	}
}

func TestWriteRefusal(t *testing.T) {
	p := mustCompile(t, ProtoHTTP, Spec{CIDRDeny: prefixes("0.0.0.0/0")}, Options{})
	r := newRequest("POST", "/")
	r.ContentLength = 10
	served, w := check(p, r, "192.0.2.1")
	if !served || w.Code != 403 || w.Body.String() != "policy_denied: your address may not reach this endpoint\n" ||
		w.Header().Get("Tunnelkit-Error") != "policy_denied" || w.Header().Get("Content-Type") != "text/plain; charset=utf-8" ||
		w.Header().Get("Connection") != "close" {
		t.Errorf("refusal: %d %v %q", w.Code, w.Header(), w.Body)
	}
}
