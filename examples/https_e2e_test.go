package examples_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testacme"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// getTLS fetches url over HTTPS with every name resolved to addr,
// verifying the certificate against roots, and returns the body and the
// protocol the response came over.
func getTLS(t *testing.T, addr, url string, roots *x509.CertPool) (string, string) {
	t.Helper()
	body, proto, _ := getTLSCert(t, addr, url, roots)
	return body, proto
}

// getTLSCert is getTLS, on a new connection, also returning the server's
// certificate.
func getTLSCert(t *testing.T, addr, url string, roots *x509.CertPool) (string, string, *x509.Certificate) {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Timeout: 60 * time.Second, Transport: tr}).Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b), resp.Proto, resp.TLS.PeerCertificates[0]
}

// localApp serves what it saw of each request on loopback until the test
// ends, and returns its address.
func localApp(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "local app saw %s over %s from %s", r.Host, r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-For"))
	})}
	go app.Serve(ln)
	t.Cleanup(func() { app.Close() })
	return ln.Addr().String()
}

// TestHTTPSWithOperatorCertificate runs the edge with -tls, -cert and
// -key, and the agent with an https URL.
func TestHTTPSWithOperatorCertificate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	pki := testpki.New(t)
	certPEM, keyPEM := testpki.PEMFiles(t, pki.Issue(t, "*.example.test"))
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)
	agents, pub, tlsAddr := freePort(t), freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-tls", tlsAddr, "-domain", "example.test",
		"-cert", certFile, "-key", keyFile, "-redirect-https")
	waitListening(t, agents)
	waitListening(t, tlsAddr)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)

	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "https://abc.example.test", "-to", localApp(t)))
	if want := "https://abc.example.test:" + tlsPort; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	body, proto := getTLS(t, tlsAddr, url+"/", pki.Pool)
	if want := "local app saw abc.example.test:" + tlsPort + " over https from 127.0.0.1"; body != want || proto != "HTTP/2.0" {
		t.Fatalf("got %q over %s, want %q over HTTP/2.0", body, proto, want)
	}
	// -redirect-https: plain HTTP for the name is sent to https.
	client := &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, pub)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Get("http://abc.example.test/p?q=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusPermanentRedirect || loc != url+"/p?q=1" {
		t.Fatalf("plain HTTP: %d to %q, want 308 to %s/p?q=1", resp.StatusCode, loc, url)
	}
}

// TestHTTPSWithACME runs the edge with -acme-directory against a real ACME
// server (pebble), which validates through the edge's own TLS port.
// Pebble's certificates live 30 s here, and the edge renews them 20 s
// before they expire (-acme-renew-before): a later handshake gets a new
// certificate, without a restart, before the first one expires.
func TestHTTPSWithACME(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub, tlsAddr := freePort(t), freePort(t), freePort(t)
	_, httpPort, _ := net.SplitHostPort(pub)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	hp, _ := strconv.Atoi(httpPort)
	tp, _ := strconv.Atoi(tlsPort)
	pebble := testacme.Start(t, hp, tp, testacme.CertValidity(30*time.Second))
	caFile := filepath.Join(t.TempDir(), "pebble-ca.pem")
	if err := os.WriteFile(caFile, pebble.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-tls", tlsAddr, "-domain", "example.test",
		"-acme-directory", pebble.DirectoryURL, "-acme-ca", caFile, "-acme-email", "ops@example.test", "-acme-cache", t.TempDir(),
		"-acme-renew-before", "20s")
	waitListening(t, agents)
	waitListening(t, tlsAddr)

	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "https://acme.example.test", "-to", localApp(t)))
	if want := "https://acme.example.test:" + tlsPort; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	roots := pebble.Roots(t)
	body, _, first := getTLSCert(t, tlsAddr, url+"/", roots)
	if want := "local app saw acme.example.test:" + tlsPort + " over https from 127.0.0.1"; body != want {
		t.Fatalf("got %q, want %q", body, want)
	}
	for {
		_, _, cert := getTLSCert(t, tlsAddr, url+"/", roots)
		if cert.SerialNumber.Cmp(first.SerialNumber) != 0 {
			break // renewed; getTLSCert verified it against pebble's root
		}
		if time.Now().After(first.NotAfter) {
			t.Fatal("the certificate expired without being renewed")
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// TestHTTPSWithACMEBudget runs the edge with ACME order budgets small
// enough to meet (-acme-orders-per-identity 1, -acme-orders-per-hour 2):
// alice's first name gets a certificate and her second none; bob's first
// gets one; then the edge's budget is spent and carol's gets none. Each
// refused handshake fails, as one for a name nobody bound does.
func TestHTTPSWithACMEBudget(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub, tlsAddr := freePort(t), freePort(t), freePort(t)
	_, httpPort, _ := net.SplitHostPort(pub)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	hp, _ := strconv.Atoi(httpPort)
	tp, _ := strconv.Atoi(tlsPort)
	pebble := testacme.Start(t, hp, tp)
	dir := t.TempDir()
	caFile, tokens := filepath.Join(dir, "pebble-ca.pem"), filepath.Join(dir, "tokens")
	if err := os.WriteFile(caFile, pebble.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte("alice-secret alice\nbob-secret bob\ncarol-secret carol\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-tls", tlsAddr, "-domain", "example.test",
		"-tokens", tokens, "-acme-directory", pebble.DirectoryURL, "-acme-ca", caFile, "-acme-cache", t.TempDir(),
		"-acme-orders-per-identity", "1", "-acme-orders-per-hour", "2")
	waitListening(t, agents)
	waitListening(t, tlsAddr)
	roots := pebble.Roots(t)
	app := localApp(t)
	for _, c := range []struct {
		token, name string
		want        bool
	}{
		{"alice-secret", "a1", true},
		{"alice-secret", "a2", false}, // alice's budget
		{"bob-secret", "b1", true},
		{"carol-secret", "c1", false}, // the edge's
	} {
		url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", c.token, "-url", "https://"+c.name+".example.test", "-to", app))
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 60 * time.Second}, "tcp", tlsAddr, &tls.Config{ServerName: c.name + ".example.test", RootCAs: roots})
		if err == nil {
			conn.Close()
		}
		if got := err == nil; got != c.want {
			t.Errorf("%s: a certificate: %v (%v), want %v", url, got, err, c.want)
		}
	}
}
