package edge_test

// The operator's reservations and customers' own domains (issue #34,
// item 2).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testacme"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/router"
)

// TestReservedName: a name the operator reserves for alice is refused to
// bob, with its tree, over every protocol, while alice is not connected;
// alice binds it and is served; the operator cannot reserve what bob
// holds, nor invalid names.
func TestReservedName(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	ctx := context.Background()
	if err := e.srv.Reserve(ctx, "Shop", "alice"); err != nil {
		t.Fatal(err)
	}
	if got, err := e.srv.Reservations(ctx); err != nil || !slices.Equal(got, []router.Reservation{{Name: "shop.example.test", Identity: "alice"}}) {
		t.Fatalf("Reservations() = %v, %v", got, err)
	}
	bob := &agent.Client{Addrs: []string{e.agentAddr}, Token: "bob-token"}
	defer bob.Close()
	for _, url := range []string{"http://shop", "http://Shop.Example.Test.", "tls://shop.example.test", "http://x.shop.example.test", "tls://*.shop.example.test"} {
		if _, err := bob.Listen(ctx, url); !errors.Is(err, agent.ErrNameTaken) {
			t.Errorf("bob binding %s, reserved for alice: %v, want ErrNameTaken", url, err)
		}
	}
	if err := e.srv.Reserve(ctx, "shop.example.test", "bob"); !errors.Is(err, router.ErrNameTaken) {
		t.Errorf("reserving alice's name for bob: %v, want ErrNameTaken", err)
	}
	e.agentOf(t, "alice", agent.Endpoint{URL: "http://shop"}, nameHandler("shop"))
	if resp, body := get(t, e.testEdge, e.url("shop")+"/", nil); resp.StatusCode != 200 || body != "shop /" {
		t.Fatalf("alice's reserved name: %d %q", resp.StatusCode, body)
	}

	// What bob holds, and what is no name to reserve.
	e.agentOf(t, "bob", agent.Endpoint{URL: "http://bobs"}, nameHandler("bobs"))
	for _, name := range []string{"bobs", "x.bobs.example.test"} {
		if err := e.srv.Reserve(ctx, name, "alice"); !errors.Is(err, router.ErrNameTaken) {
			t.Errorf("reserving %s, held by bob, for alice: %v, want ErrNameTaken", name, err)
		}
	}
	for _, c := range []struct{ name, identity string }{
		{"*.w.example.test", "alice"}, {"example.test", "alice"}, {"", "alice"}, {"bad_name", "alice"}, {"x", ""}, {"1.2.3.4", "alice"},
	} {
		if err := e.srv.Reserve(ctx, c.name, c.identity); !errors.Is(err, edge.ErrInvalidReservation) {
			t.Errorf("Reserve(%q, %q) = %v, want ErrInvalidReservation", c.name, c.identity, err)
		}
	}

	// Unreserved, the name stays alice's while she holds it.
	if err := e.srv.Unreserve(ctx, "shop.example.test"); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Unreserve(ctx, "shop.example.test"); !errors.Is(err, router.ErrNoReservation) {
		t.Errorf("Unreserve of a name not reserved: %v, want ErrNoReservation", err)
	}
	if resp, _ := get(t, e.testEdge, e.url("shop")+"/", nil); resp.StatusCode != 200 {
		t.Errorf("alice's name after Unreserve: %d, want her app", resp.StatusCode)
	}
	if _, err := bob.Listen(ctx, "http://shop"); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("bob binding shop, bound by alice: %v, want ErrNameTaken", err)
	}
}

// TestReservationsUnsupported: a Router that keeps no reservations says
// so, and names outside the domain stay unbound.
func TestReservationsUnsupported(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, func(s *edge.Server) { s.Router = struct{ router.Router }{new(router.MemoryRouter)} })
	ctx := context.Background()
	if err := e.srv.Reserve(ctx, "shop", "alice"); !errors.Is(err, edge.ErrReservationsUnsupported) {
		t.Errorf("Reserve: %v, want ErrReservationsUnsupported", err)
	}
	if err := e.srv.Unreserve(ctx, "shop"); !errors.Is(err, edge.ErrReservationsUnsupported) {
		t.Errorf("Unreserve: %v, want ErrReservationsUnsupported", err)
	}
	if _, err := e.srv.Reservations(ctx); !errors.Is(err, edge.ErrReservationsUnsupported) {
		t.Errorf("Reservations: %v, want ErrReservationsUnsupported", err)
	}
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "alice-token"}
	defer c.Close()
	if _, err := c.Listen(ctx, "http://shop.customer.test"); !errors.Is(err, agent.ErrRefused) {
		t.Errorf("binding a name outside the domain: %v, want ErrRefused", err)
	}
}

// customerEdge is an edge whose certificates cover *.example.test and a
// customer's own domain, shop.customer.test.
func customerEdge(t testing.TB) (*viewEdge, *testpki.CA) {
	pki := testpki.New(t)
	e := startViewEdge(t, func(s *edge.Server) {
		s.Certificates = []tls.Certificate{pki.Issue(t, "*.example.test"), pki.Issue(t, "shop.customer.test")}
	})
	return e, pki
}

// TestCustomerDomain: a customer's own domain, outside the edge's domain,
// is bound only by the identity it is reserved for, and exactly; it is
// served over http (routed by Host) and https (by server name, with the
// operator's certificate), as a ReverseProxy hop would pass it on.
func TestCustomerDomain(t *testing.T) {
	t.Parallel()
	e, pki := customerEdge(t)
	ctx := context.Background()
	alice := &agent.Client{Addrs: []string{e.agentAddr}, Token: "alice-token"}
	defer alice.Close()
	if _, err := alice.Listen(ctx, "https://shop.customer.test"); !errors.Is(err, agent.ErrRefused) {
		t.Fatalf("binding a customer's domain not reserved: %v, want ErrRefused", err)
	}
	if err := e.srv.Reserve(ctx, "shop.customer.test", "alice"); err != nil {
		t.Fatal(err)
	}
	bob := &agent.Client{Addrs: []string{e.agentAddr}, Token: "bob-token"}
	defer bob.Close()
	if _, err := bob.Listen(ctx, "http://shop.customer.test"); !errors.Is(err, agent.ErrRefused) {
		t.Errorf("bob binding alice's domain: %v, want ErrRefused", err)
	}
	for _, url := range []string{"http://x.shop.customer.test", "tls://*.shop.customer.test", "http://other.customer.test"} {
		if _, err := alice.Listen(ctx, url); !errors.Is(err, agent.ErrRefused) {
			t.Errorf("alice binding %s, not reserved: %v, want ErrRefused", url, err)
		}
	}
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "alice: host="+r.Host+" proto="+r.Header.Get("X-Forwarded-Proto")+" xfh="+r.Header.Get("X-Forwarded-Host"))
	})
	hl := e.agentOf(t, "alice", agent.Endpoint{URL: "http://shop.customer.test"}, echo)
	sl := e.agentOf(t, "alice", agent.Endpoint{URL: "https://shop.customer.test"}, echo)
	_, httpPort, _ := net.SplitHostPort(e.httpAddr)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	if hl.URL() != "http://shop.customer.test:"+httpPort || sl.URL() != "https://shop.customer.test:"+tlsPort {
		t.Fatalf("URLs %s and %s", hl.URL(), sl.URL())
	}

	if resp, body := get(t, e.testEdge, "http://shop.customer.test:"+httpPort+"/", nil); resp.StatusCode != 200 || body != "alice: host=shop.customer.test:"+httpPort+" proto=http xfh=shop.customer.test:"+httpPort {
		t.Errorf("over http: %d %q", resp.StatusCode, body)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: pki.Pool},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://shop.customer.test:" + tlsPort + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "alice: host=shop.customer.test:"+tlsPort+" proto=https xfh=shop.customer.test:"+tlsPort {
		t.Errorf("over https: %d %q", resp.StatusCode, body)
	}
	if cn := resp.TLS.PeerCertificates[0].DNSNames; !slices.Equal(cn, []string{"shop.customer.test"}) {
		t.Errorf("certificate for %v, want the customer's", cn)
	}
	// Other names outside the domain: no tunnel.
	for _, host := range []string{"other.customer.test", "1.2.3.4", "test"} {
		if resp, _ := get(t, e.testEdge, "http://"+host+":"+httpPort+"/", nil); resp.StatusCode != 404 || resp.Header.Get("Tunnelkit-Error") != "no_endpoint" {
			t.Errorf("%s: %d %s, want 404 no_endpoint", host, resp.StatusCode, resp.Header.Get("Tunnelkit-Error"))
		}
	}
	// The domain unreserved: alice's routes stay until they go; then
	// nobody binds it again.
	if err := e.srv.Unreserve(ctx, "shop.customer.test"); err != nil {
		t.Fatal(err)
	}
	if resp, _ := get(t, e.testEdge, "http://shop.customer.test:"+httpPort+"/", nil); resp.StatusCode != 200 {
		t.Errorf("after Unreserve, alice's route: %d", resp.StatusCode)
	}
	if _, err := alice.Listen(ctx, "tls://shop.customer.test"); !errors.Is(err, agent.ErrRefused) {
		t.Errorf("alice binding her domain once unreserved: %v, want ErrRefused", err)
	}
}

// TestReservationsOutliveRestart: with StateDir, the operator's
// reservations are in the record, and a restart keeps them.
func TestReservationsOutliveRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	srv := &edge.Server{Domain: "example.test", Authenticate: tokens, StateDir: dir}
	te := edgeOn(t, srv, listen(t), listen(t))
	if err := srv.Reserve(ctx, "shop.customer.test", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reserve(ctx, "shop", "alice"); err != nil {
		t.Fatal(err)
	}
	srv2 := &edge.Server{Domain: "example.test", Authenticate: tokens, StateDir: dir}
	te = te.restart(t, srv2)
	want := []router.Reservation{{Name: "shop.customer.test", Identity: "alice"}, {Name: "shop.example.test", Identity: "alice"}}
	if got, err := srv2.Reservations(ctx); err != nil || !slices.Equal(got, want) {
		t.Fatalf("after a restart: %v, %v; want %v", got, err, want)
	}
	bob := &agent.Client{Addrs: []string{te.agentAddr}, Token: "bob-token"}
	defer bob.Close()
	if _, err := bob.Listen(ctx, "http://shop"); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("bob binding alice's reserved name after a restart: %v", err)
	}
	alice := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token"}
	defer alice.Close()
	if _, err := alice.Listen(ctx, "http://shop.customer.test"); err != nil {
		t.Errorf("alice binding her domain after a restart: %v", err)
	}
}

// TestCustomerDomainACME: a customer's domain bound over https gets a
// certificate from a real ACME CA (pebble, validating against the edge's
// ports), counted against its identity's budget: a second domain of the
// same identity, past OrdersPerIdentity, gets no order.
func TestCustomerDomainACME(t *testing.T) {
	t.Parallel()
	agents, httpLn, tlsLn := listen(t), listen(t), listen(t)
	httpPort, _ := strconv.Atoi(portOf(httpLn))
	tlsPort, _ := strconv.Atoi(portOf(tlsLn))
	pebble := testacme.Start(t, httpPort, tlsPort)
	counter := &orderCounter{base: pebble.HTTPClient.Transport}
	srv := &edge.Server{
		Domain:       "example.test",
		HTTPPort:     portOf(httpLn),
		TLSPort:      portOf(tlsLn),
		Authenticate: tokens,
		ACME: &edge.ACME{
			DirectoryURL:      pebble.DirectoryURL,
			Cache:             autocert.DirCache(t.TempDir()),
			HTTPClient:        &http.Client{Transport: counter, Timeout: 30 * time.Second},
			OrdersPerIdentity: 1,
		},
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(httpLn) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	ctx := context.Background()
	c := &agent.Client{Addrs: []string{agents.Addr().String()}, Token: "alice-token"}
	defer c.Close()
	for _, name := range []string{"shop.customer.test", "blog.customer.test"} {
		if err := srv.Reserve(ctx, name, "alice"); err != nil {
			t.Fatal(err)
		}
		l, err := c.Listen(ctx, "https://"+name)
		if err != nil {
			t.Fatal(err)
		}
		go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) }))
	}
	roots := pebble.Roots(t)
	handshake := func(name string) (*x509.Certificate, error) {
		conn, err := tls.Dial("tcp", tlsLn.Addr().String(), &tls.Config{ServerName: name, RootCAs: roots})
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	cert, err := handshake("shop.customer.test")
	if err != nil {
		t.Fatalf("the customer's domain: %v", err)
	}
	if !strings.Contains(cert.Issuer.CommonName, "Pebble") || !slices.Equal(cert.DNSNames, []string{"shop.customer.test"}) {
		t.Errorf("certificate from %q for %v", cert.Issuer.CommonName, cert.DNSNames)
	}
	if _, err := handshake("blog.customer.test"); err == nil {
		t.Error("a second domain of alice's got a certificate past OrdersPerIdentity 1")
	}
	if n := counter.orders.Load(); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// TestReservationBounds: Reserve stops at Limits.ReservationsPerIdentity
// and Limits.Reservations with ErrReservationLimit, counting what the
// Router holds (the record's, after a restart, too); a name reserved
// already is no new one; a removal makes room.
func TestReservationBounds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	newServer := func() *edge.Server {
		return &edge.Server{Domain: "example.test", StateDir: dir, Limits: edge.Limits{Reservations: 5, ReservationsPerIdentity: 3}}
	}
	srv := newServer()
	ctx := context.Background()
	for i := range 3 {
		if err := srv.Reserve(ctx, fmt.Sprintf("a%d", i), "alice"); err != nil {
			t.Fatal(err)
		}
	}
	err := srv.Reserve(ctx, "a3", "alice")
	if !errors.Is(err, edge.ErrReservationLimit) || !strings.Contains(err.Error(), "ReservationsPerIdentity") {
		t.Fatalf("alice's fourth reservation: %v, want ErrReservationLimit naming ReservationsPerIdentity", err)
	}
	if err := srv.Reserve(ctx, "A0.example.test.", "alice"); err != nil {
		t.Fatalf("alice's first name again, at her bound: %v, want nil (nothing new)", err)
	}
	for i := range 2 {
		if err := srv.Reserve(ctx, fmt.Sprintf("b%d", i), "bob"); err != nil {
			t.Fatal(err)
		}
	}
	srv.Close()
	srv = newServer() // the record's reservations count
	defer srv.Close()
	err = srv.Reserve(ctx, "c0", "carol")
	if !errors.Is(err, edge.ErrReservationLimit) || !strings.Contains(err.Error(), "Limits.Reservations") {
		t.Fatalf("a sixth reservation: %v, want ErrReservationLimit naming Limits.Reservations", err)
	}
	if err := srv.Unreserve(ctx, "B1"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reserve(ctx, "c0", "carol"); err != nil {
		t.Fatalf("a reservation once one was removed: %v", err)
	}
	if got, _ := srv.Reservations(ctx); len(got) != 5 {
		t.Fatalf("Reservations() = %v, want 5", got)
	}
}

// TestReservationSpellings: Reserve, Unreserve and Reservations take a
// name in any case, with or without the trailing dot, one label standing
// for the name under Domain, and store it one way (ReservationName's);
// a public suffix is no customer's domain, a name under one is.
func TestReservationSpellings(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	ctx := context.Background()
	spellings := []string{"zzz", "ZZZ", "zzz.example.test", "zzz.EXAMPLE.test."}
	for _, put := range spellings {
		for _, del := range spellings {
			if got, ok := srv.ReservationName(put); !ok || got != "zzz.example.test" {
				t.Fatalf("ReservationName(%q) = %q, %v", put, got, ok)
			}
			if err := srv.Reserve(ctx, put, "alice"); err != nil {
				t.Fatalf("Reserve(%q): %v", put, err)
			}
			if got, _ := srv.Reservations(ctx); !slices.Equal(got, []router.Reservation{{Name: "zzz.example.test", Identity: "alice"}}) {
				t.Fatalf("reserved as %q: Reservations() = %v", put, got)
			}
			if err := srv.Unreserve(ctx, del); err != nil {
				t.Fatalf("reserved as %q, Unreserve(%q): %v", put, del, err)
			}
		}
	}
	for _, bad := range []string{"co.uk", "github.io", "zzz.example.test.."} {
		if err := srv.Reserve(ctx, bad, "alice"); !errors.Is(err, edge.ErrInvalidReservation) {
			t.Errorf("Reserve(%q): %v, want ErrInvalidReservation", bad, err)
		}
	}
	if err := srv.Reserve(ctx, "Shop.Co.UK.", "alice"); err != nil {
		t.Fatalf("a customer's domain under a public suffix: %v", err)
	}
	if err := srv.Unreserve(ctx, "shop.co.uk"); err != nil {
		t.Fatal(err)
	}
}
