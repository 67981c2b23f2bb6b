package agentcmd

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// serveApp runs h on loopback until the test ends, in the protocols
// protos allows, over TLS with cert when it is not nil, and returns its
// address.
func serveApp(t *testing.T, h http.Handler, protos http.Protocols, cert *tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: &protos}
	if cert != nil {
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cert != nil {
			srv.ServeTLS(ln, "", "")
		} else {
			srv.Serve(ln)
		}
	}()
	t.Cleanup(func() { srv.Close(); <-done })
	return ln.Addr().String()
}

// TestHealthCheckAsTheForwarder: an endpoint's HTTP health check reaches
// its app as the endpoint's requests do: with the Host of host_header,
// and in HTTP/2 for the app protocol h2c (prior knowledge, or over TLS to
// an https app), so that a virtual-hosted or an HTTP/2-only app can be up.
func TestHealthCheckAsTheForwarder(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.New(t)
	cert := ca.Issue(t, "127.0.0.1")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	var h1, h2c, h2 http.Protocols
	h1.SetHTTP1(true)
	h2c.SetUnencryptedHTTP2(true)
	h2.SetHTTP2(true)
	// Each app answers 200 to what it expects, and says what is wrong
	// with anything else.
	app := func(host string, proto int) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case host != "" && r.Host != host:
				http.Error(w, "no such host: "+r.Host, http.StatusMisdirectedRequest)
			case r.ProtoMajor != proto:
				http.Error(w, "want HTTP/"+fmt.Sprint(proto), http.StatusHTTPVersionNotSupported)
			case r.URL.Path != "/healthz":
				http.NotFound(w, r)
			}
		})
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		name     string
		to, keys string // the endpoint's
	}{
		{"host_header name", serveApp(t, app("app.internal", 1), h1, nil), "    host_header: app.internal\n"},
		{"host_header rewrite", "http://" + serveApp(t, app("", 1), h1, nil), "    host_header: rewrite\n"},
		{"h2c", serveApp(t, app("", 2), h2c, nil), "    app_protocol: h2c\n"},
		{"h2c with host_header", serveApp(t, app("grpc.internal", 2), h2c, nil), "    app_protocol: h2c\n    host_header: grpc.internal\n"},
		{"h2c to an https app", "https://" + serveApp(t, app("", 2), h2, &cert), "    app_protocol: h2c\n    to_ca: " + caFile + "\n"},
		{"https app, http1", "https://" + serveApp(t, app("", 1), h1, &cert), "    to_ca: " + caFile + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "agent.yml")
			src := "endpoints:\n  - url: http://a\n    to: " + tc.to + "\n" + tc.keys + "    health_check:\n      path: /healthz\n"
			if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			cl, err := parseArgs([]string{"-config", file}, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			_, specs, err := cl.load(noEnv)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := specs[0].health.Check(ctx); err != nil {
				t.Errorf("the check of the app that is up: %v\n%s", err, src)
			}
		})
	}
}
