package oidc

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testchrome"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/policy"
)

// TestBrowserLoginThroughEdge: a person, as headless Chromium, opens an
// https endpoint whose agent declared an oidc policy; the edge sends the
// browser to a real provider (zitadel's example), where it logs in, and
// back to the page it asked for, which the app serves, knowing who logged
// in and nothing of the edge's cookies. An identity header the browser
// forges never reaches the app; a tampered session cookie, or one past its
// lifetime (on the edge's policy clock), starts a new login.
func TestBrowserLoginThroughEdge(t *testing.T) {
	testtools.Need(t, "chromium")
	clock := &clock{t: time.Now()}

	// The edge's listeners come first: the provider registers the
	// endpoint's callback, on the edge's TLS port.
	agents, tlsLn := listenTCP(t), listenTCP(t)
	_, tlsPort, _ := net.SplitHostPort(tlsLn.Addr().String())
	appURL := "https://app.example.test:" + tlsPort

	opLn, issuer := listen(t)
	registerOnce.Lock()
	storage.RegisterClients(storage.WebClient(clientID, clientSecret, appURL+policy.CallbackPath))
	registerOnce.Unlock()
	op := exampleop.SetupServer(issuer, storage.NewStorage(storage.NewUserStore(issuer)), nil, false)
	opSrv := httptest.NewUnstartedServer(op)
	opSrv.Listener = opLn
	opSrv.StartTLS()
	t.Cleanup(opSrv.Close)
	opRoots := x509.NewCertPool()
	opRoots.AddCert(opSrv.Certificate())
	providers := &Providers{RootCAs: opRoots, AllowPrivateNetworks: true}
	t.Cleanup(providers.CloseIdleConnections)

	pki := testpki.New(t)
	ticketKey := make([]byte, 32)
	rand.Read(ticketKey)
	srv := &edge.Server{
		Domain:       "example.test",
		TLSPort:      tlsPort,
		Certificates: []tls.Certificate{pki.Issue(t, "*.example.test")},
		TicketKey:    ticketKey,
		OIDC:         providers.Provider,
		Clock:        clock.Now,
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })

	// The agent, and its app, which shows what it got.
	ag := &agent.Client{Addrs: []string{agents.Addr().String()}}
	t.Cleanup(func() { ag.Close() })
	l, err := ag.ListenEndpoint(context.Background(), agent.Endpoint{URL: "https://app", Policy: &policy.Spec{OIDC: &policy.OIDC{
		Issuer: issuer, ClientID: clientID, ClientSecret: clientSecret, AllowEmails: []string{"test-user@zitadel.ch"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if l.URL() != appURL {
		t.Fatalf("URL %s; want %s", l.URL(), appURL)
	}
	var hits atomic.Int64
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/favicon.ico" { // the browser's own, once it has a session
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><title>app</title><pre id=seen>path=%s email=%s subject=%s user=%s cookie=%s</pre>",
			r.URL.RequestURI(), r.Header.Get(policy.HeaderAuthEmail), r.Header.Get(policy.HeaderAuthSubject), r.Header.Get(policy.HeaderAuthUser), r.Header.Get("Cookie"))
	})}
	go app.Serve(l)
	t.Cleanup(func() { app.Close() })

	// The browser: every name under example.test is the edge; the test
	// CAs are not the point here.
	page := testchrome.Start(t, appURL+"/dashboard?tab=2",
		"--host-resolver-rules=MAP *.example.test 127.0.0.1", "--ignore-certificate-errors")
	page.Call(t, "Network.enable", nil)
	var seen int64 // the requests the app should have got so far
	login := func(why string) {
		t.Helper()
		page.WaitLoad(t, `location.origin === `+jsString(issuer)+` && document.getElementById('username')`, 30*time.Second)
		if n := hits.Load(); n != seen {
			t.Fatalf("%s: the app got %d requests before the login; want %d", why, n, seen)
		}
		page.Eval(t, `document.getElementById('username').value = `+jsString("test-user@"+hostOf(issuer))+`;
			document.getElementById('password').value = `+jsString(password))
		page.Click(t, `button[type=submit]`)
	}
	seenApp := func(why, path string) string {
		t.Helper()
		page.WaitLoad(t, `location.origin === `+jsString(appURL)+` && document.getElementById('seen')`, 30*time.Second)
		var text string
		json.Unmarshal([]byte(page.Eval(t, `document.getElementById('seen').textContent`)), &text)
		want := "path=" + path + " email=test-user@zitadel.ch subject=id1 user= cookie="
		if text != want {
			t.Fatalf("%s: the app saw %q; want %q (no cookie of the edge)", why, text, want)
		}
		seen++
		if n := hits.Load(); n != seen {
			t.Fatalf("%s: the app got %d requests; want %d", why, n, seen)
		}
		return text
	}

	login("the first visit")
	seenApp("after the login", "/dashboard?tab=2")

	// A header the browser forges is the edge's to set.
	page.Call(t, "Network.setExtraHTTPHeaders", map[string]any{"headers": map[string]string{
		policy.HeaderAuthEmail: "boss@zitadel.ch", policy.HeaderAuthSubject: "id0", policy.HeaderAuthUser: "root",
	}})
	page.Navigate(t, appURL+"/forged")
	seenApp("with forged identity headers", "/forged")
	page.Call(t, "Network.setExtraHTTPHeaders", map[string]any{"headers": map[string]string{}})

	// A tampered session cookie: a new login.
	session := sessionCookie(t, page, appURL)
	v := []byte(session.Value)
	// Another letter, which a cookie may hold (a flipped bit may give one
	// it may not: Chromium refuses to set it).
	if v[len(v)/2] == 'A' {
		v[len(v)/2] = 'B'
	} else {
		v[len(v)/2] = 'A'
	}
	setCookie(t, page, appURL, string(v))
	page.Navigate(t, appURL+"/tampered")
	login("a tampered session cookie")
	seenApp("after logging in again", "/tampered")

	// A session cookie past its lifetime on the edge's clock (the browser
	// keeps it: it is the edge that must refuse it): a new login.
	session = sessionCookie(t, page, appURL)
	clock.Add(policy.DefaultSessionLifetime + time.Minute)
	page.Navigate(t, appURL+"/later")
	if got := sessionCookie(t, page, appURL); got.Value != session.Value {
		t.Fatal("the browser dropped or replaced the session cookie itself")
	}
	login("an expired session cookie")
	seenApp("after logging in once more", "/later")
}

type cookie struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// sessionCookie returns the browser's session cookie for url.
func sessionCookie(t *testing.T, page *testchrome.Page, url string) cookie {
	t.Helper()
	var r struct {
		Cookies []cookie `json:"cookies"`
	}
	json.Unmarshal(page.Call(t, "Network.getCookies", map[string]any{"urls": []string{url + "/"}}), &r)
	for _, c := range r.Cookies {
		if c.Name == policy.SessionCookie {
			return c
		}
	}
	t.Fatalf("no session cookie in the browser: %+v", r.Cookies)
	return cookie{}
}

// setCookie gives the browser value as its session cookie for url.
func setCookie(t *testing.T, page *testchrome.Page, url, value string) {
	t.Helper()
	var r struct {
		Success bool `json:"success"`
	}
	json.Unmarshal(page.Call(t, "Network.setCookie", map[string]any{
		"name": policy.SessionCookie, "value": value, "url": url + "/", "path": "/", "secure": true, "httpOnly": true, "sameSite": "Lax",
	}), &r)
	if !r.Success {
		t.Fatal("Network.setCookie failed")
	}
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// hostOf returns the host of a URL's authority, without the port.
func hostOf(u string) string {
	h := strings.TrimPrefix(u, "https://")
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

func listenTCP(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
