package edge_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testacme"
)

// orderCounter counts the orders an ACME server created for its client: a
// POST to a URL ending in "/order-plz" (pebble's newOrder) answered 201.
// Pebble rejects some nonces on purpose, and the client sends the same
// order again: that is one order.
type orderCounter struct {
	base   http.RoundTripper
	orders atomic.Int64
}

func (c *orderCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/order-plz") && resp.StatusCode == http.StatusCreated {
		c.orders.Add(1)
	}
	return resp, err
}

// TestACMECertificateOnDemand runs a real ACME server (pebble) whose
// validation connects to the edge's own ports: an agent binds https://x,
// the first handshake gets a certificate issued by pebble through a
// TLS-ALPN-01 challenge the edge answers, and the second comes from the
// cache. Names nobody bound over https, and names under a wildcard
// endpoint, get no certificate and cost no order.
func TestACMECertificateOnDemand(t *testing.T) {
	t.Parallel()
	agents, httpLn, tlsLn := listen(t), listen(t), listen(t)
	httpPort, _ := strconv.Atoi(portOf(httpLn))
	tlsPort, _ := strconv.Atoi(portOf(tlsLn))
	pebble := testacme.Start(t, httpPort, tlsPort)
	counter := &orderCounter{base: pebble.HTTPClient.Transport}
	cacheDir := t.TempDir()
	srv := &edge.Server{
		Domain:   "example.test",
		HTTPPort: portOf(httpLn),
		TLSPort:  portOf(tlsLn),
		ACME: &edge.ACME{
			DirectoryURL: pebble.DirectoryURL,
			Email:        "ops@example.test",
			Cache:        autocert.DirCache(cacheDir),
			HTTPClient:   &http.Client{Transport: counter, Timeout: 30 * time.Second},
		},
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(httpLn) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })

	c := &agent.Client{Addrs: []string{agents.Addr().String()}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "https://x")
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://x.example.test:" + portOf(tlsLn); l.URL() != want {
		t.Fatalf("URL %q, want %q", l.URL(), want)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello over "+r.Header.Get("X-Forwarded-Proto"))
	}))
	wl, err := c.Listen(context.Background(), "https://*.wild.example.test")
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()

	roots := pebble.Roots(t)
	get := func() (*x509.Certificate, string) {
		t.Helper()
		tr := &http.Transport{
			DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, n, tlsLn.Addr().String())
			},
			TLSClientConfig: &tls.Config{RootCAs: roots},
		}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 60 * time.Second}).Get("https://x.example.test/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.TLS.PeerCertificates[0], string(b)
	}
	first, body := get()
	if body != "hello over https" {
		t.Errorf("body %q", body)
	}
	if !strings.Contains(first.Issuer.CommonName, "Pebble") {
		t.Errorf("issuer %q, want pebble's", first.Issuer.CommonName)
	}
	orders := counter.orders.Load()
	if orders != 1 {
		t.Errorf("%d ACME orders for the first handshake, want 1", orders)
	}
	if _, err := os.Stat(filepath.Join(cacheDir, cacheKey(pebble, "x.example.test"))); err != nil {
		t.Errorf("certificate not in the cache: %v", err)
	}
	second, _ := get()
	if second.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Error("the second handshake got a new certificate, not the cached one")
	}

	// Strangers' names: unbound, under the wildcard endpoint, the domain
	// itself. No handshake, and no order.
	for _, name := range []string{"nobody.example.test", "a.wild.example.test", "example.test"} {
		conn, err := tls.Dial("tcp", tlsLn.Addr().String(), &tls.Config{ServerName: name, InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			t.Errorf("%s: handshake succeeded", name)
		}
	}
	if n := counter.orders.Load(); n != orders {
		t.Errorf("%d more ACME orders for names nobody bound over https", n-orders)
	}
}

// cacheKey returns the key of the ACME Cache where an edge on pebble
// keeps key, as ACME.Cache says: after pebble's directory's host and path,
// each ':' and '/' as '-', and '+'.
func cacheKey(pebble *testacme.Pebble, key string) string {
	dir := strings.TrimPrefix(pebble.DirectoryURL, "https://")
	return strings.NewReplacer(":", "-", "/", "-").Replace(dir) + "+" + key
}

func portOf(ln net.Listener) string {
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestACMECacheKeyedByDirectory is issue #32's item 4: certificates are
// kept per CA directory, so that an edge moved to another CA (staging to
// production) gets its certificates from the new CA at the first
// handshake, not from the old one's left in the Cache. Two pebbles are two
// CAs with roots of their own; one Cache serves three edges in turn: on
// CA1, on CA2, on CA1 again (which still has CA1's certificate).
func TestACMECacheKeyedByDirectory(t *testing.T) {
	t.Parallel()
	acme := edge.ACME{Cache: autocert.DirCache(t.TempDir())}
	listeners := func() edge.Listeners {
		return edge.Listeners{Agents: listen(t), HTTP: listen(t), TLS: listen(t)}
	}
	ls1 := listeners()
	ca1 := startPebbleFor(t, ls1)
	ls2 := listeners()
	ca2 := startPebbleFor(t, ls2)

	// serve starts an edge on ls with ca, binds https://x, and returns the
	// certificate of its first handshake (verified against ca's root) and
	// the orders the edge placed.
	serve := func(ca *testacme.Pebble, ls edge.Listeners) (*x509.Certificate, int) {
		t.Helper()
		e := startACMEEdgeOn(t, ca, ls, acme, authenticateByToken)
		defer e.srv.Close()
		name := hostOf(t, bind(t, e.agent(t, "alice"), "https://x").URL())
		cert, err := e.handshake(name)
		if err != nil {
			t.Fatalf("the first handshake with the edge on %s: %v (orders: %v)", ca.DirectoryURL, err, e.orders.list())
		}
		return cert, e.orders.count(nil)
	}

	first, orders := serve(ca1, ls1)
	if orders != 1 {
		t.Errorf("%d orders with CA1, want 1", orders)
	}
	second, orders := serve(ca2, ls2)
	if orders != 1 {
		t.Errorf("%d orders with CA2 after the move from CA1, want 1", orders)
	}
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Error("CA2's certificate is CA1's")
	}
	third, orders := serve(ca1, listeners())
	if orders != 0 {
		t.Errorf("%d orders with CA1 on the way back to it, want 0: its certificate is in the cache", orders)
	}
	if third.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("back on CA1: certificate %v, want CA1's first one, %v", third.SerialNumber, first.SerialNumber)
	}
}
