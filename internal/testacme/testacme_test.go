package testacme_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/internal/testacme"
)

const name = "x.example.test"

// countingTransport counts the requests to an ACME server, the orders it
// created (a POST to newOrder answered 201: an order resent after a
// rejected nonce is one order) and its 400 answers (pebble's random bad
// nonces, which the client retries).
type countingTransport struct {
	base     http.RoundTripper
	orderURL atomic.Value // string
	requests atomic.Int64
	orders   atomic.Int64
	rejected atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	res, err := c.base.RoundTrip(r)
	if err != nil {
		return res, err
	}
	if u, _ := c.orderURL.Load().(string); u != "" && r.Method == http.MethodPost && r.URL.String() == u && res.StatusCode == http.StatusCreated {
		c.orders.Add(1)
	}
	if res.StatusCode == http.StatusBadRequest {
		c.rejected.Add(1)
	}
	return res, err
}

// manager returns an autocert manager for name alone, issuing from p
// through a counting transport, with its certificates in cacheDir.
func manager(t *testing.T, p *testacme.Pebble, cacheDir string) (*autocert.Manager, *countingTransport) {
	t.Helper()
	ct := &countingTransport{base: p.HTTPClient.Transport}
	client := &acme.Client{DirectoryURL: p.DirectoryURL, HTTPClient: &http.Client{Transport: ct, Timeout: p.HTTPClient.Timeout}}
	dir, err := client.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ct.orderURL.Store(dir.OrderURL)
	ct.requests.Store(0)
	return &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		HostPolicy: autocert.HostWhitelist(name),
		Cache:      autocert.DirCache(cacheDir),
		Client:     client,
	}, ct
}

// serve serves HTTPS with m's certificates on ln until the test ends.
func serve(t *testing.T, ln net.Listener, m *autocert.Manager) {
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello "+r.TLS.ServerName)
		}),
	}
	done := make(chan struct{})
	go func() { srv.Serve(tls.NewListener(ln, m.TLSConfig())); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
}

// get asks https://name/ at addr, verifying the server's certificate
// against roots, and returns the certificate.
func get(t *testing.T, addr string, roots *x509.CertPool) *x509.Certificate {
	t.Helper()
	c := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: name},
			DisableKeepAlives: true,
		},
		Timeout: 60 * time.Second,
	}
	res, err := c.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "hello "+name {
		t.Fatalf("got %q", b)
	}
	chain := res.TLS.VerifiedChains[0]
	if len(chain) < 3 || !strings.Contains(chain[1].Subject.CommonName, "Pebble Intermediate") {
		t.Errorf("verified chain %v: want leaf, pebble's intermediate, root", subjects(chain))
	}
	return res.TLS.PeerCertificates[0]
}

func subjects(chain []*x509.Certificate) []string {
	var s []string
	for _, c := range chain {
		s = append(s, c.Subject.CommonName)
	}
	return s
}

// TestAutocert has autocert get a certificate from pebble through a real
// TLS-ALPN-01 validation, then serve it from its cache.
func TestAutocert(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	unused, err := net.Listen("tcp", "127.0.0.1:0") // HTTP-01 is not used
	if err != nil {
		t.Fatal(err)
	}
	unused.Close()
	start := time.Now()
	p := testacme.Start(t, unused.Addr().(*net.TCPAddr).Port, ln.Addr().(*net.TCPAddr).Port)
	t.Logf("pebble up in %v", time.Since(start).Round(time.Millisecond))
	roots := p.Roots(t)
	cacheDir := t.TempDir()
	m, ct := manager(t, p, cacheDir)
	serve(t, ln, m)

	start = time.Now()
	first := get(t, ln.Addr().String(), roots)
	t.Logf("first request, with issuance, in %v (%d ACME requests, %d rejected)",
		time.Since(start).Round(time.Millisecond), ct.requests.Load(), ct.rejected.Load())
	if len(first.DNSNames) != 1 || first.DNSNames[0] != name {
		t.Errorf("certificate for %v, want [%s]", first.DNSNames, name)
	}
	if n := ct.orders.Load(); n != 1 {
		t.Errorf("%d ACME orders, want 1", n)
	}

	// The same manager: from its memory.
	requests := ct.requests.Load()
	second := get(t, ln.Addr().String(), roots)
	if !sameSerial(first.SerialNumber, second.SerialNumber) {
		t.Errorf("second certificate's serial %x, first's %x", second.SerialNumber, first.SerialNumber)
	}
	if n := ct.requests.Load() - requests; n != 0 {
		t.Errorf("%d ACME requests for the second handshake, want 0", n)
	}

	// A new manager on the same cache directory: from the disk, no ACME.
	m2, ct2 := manager(t, p, cacheDir)
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln2, m2)
	third := get(t, ln2.Addr().String(), roots)
	if !sameSerial(first.SerialNumber, third.SerialNumber) {
		t.Errorf("certificate from the cache has serial %x, want %x", third.SerialNumber, first.SerialNumber)
	}
	if n := ct2.requests.Load(); n != 0 {
		t.Errorf("%d ACME requests with a warm cache, want 0", n)
	}
}

func sameSerial(a, b *big.Int) bool { return a.Cmp(b) == 0 }

// TestRootsChange checks that Roots is pebble's current root: another
// pebble has another one.
func TestRootsChange(t *testing.T) {
	a := testacme.Start(t, 1, 2)
	b := testacme.Start(t, 1, 2)
	if string(a.RootPEM(t)) == string(b.RootPEM(t)) {
		t.Error("two pebbles served the same root")
	}
}
