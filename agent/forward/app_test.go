package forward_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// The app's side: TLS to an app that serves https, a Unix socket, and the
// Host header the app sees.

// serveTLSApp serves h over TLS (HTTP/2 and HTTP/1.1 by ALPN) with a
// certificate of a CA of its own for 127.0.0.1 and app.internal, and
// returns its address and the CA.
func serveTLSApp(t *testing.T, h http.Handler) (string, *testpki.CA) {
	t.Helper()
	ca := testpki.New(t)
	cert := ca.Issue(t, "127.0.0.1", "app.internal")
	ln := listenLoopback(t)
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), ca
}

// whoami answers with the request's protocol, TLS and Host.
var whoami = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "%s tls=%v host=%s", r.Proto, r.TLS != nil, r.Host)
})

// get sends GET / for host through the forwarder at addr, as the edge
// would, and returns the status and body.
func get(t *testing.T, addr, host string, h2c bool) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := client(t, addr, h2c).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// HTTP with a TLSConfig speaks TLS to the app, checking its certificate
// against the config's roots, for both app protocols, with a Recorder too;
// an app whose certificate the roots do not trust gets the client a 502
// app_unreachable, never an unchecked connection.
func TestHTTPToTLSApp(t *testing.T) {
	app, ca := serveTLSApp(t, whoami)
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			addr, _ := startForwarder(t, forward.HTTP{To: app, AppProtocol: appProtocol(m.h2c), TLSConfig: &tls.Config{RootCAs: ca.Pool}})
			status, body := get(t, addr, "abc.example.test", m.h2c)
			wantProto := "HTTP/1.1"
			if m.h2c {
				wantProto = "HTTP/2.0"
			}
			if want := fmt.Sprintf("%s tls=true host=abc.example.test", wantProto); status != 200 || body != want {
				t.Fatalf("got %d %q, want 200 %q", status, body, want)
			}
		})
	}
	t.Run("untrusted", func(t *testing.T) {
		other := testpki.New(t)
		var log testtools.Buffer
		addr, stop := startForwarder(t, forward.HTTP{To: app, TLSConfig: &tls.Config{RootCAs: other.Pool}, Logger: debugLogger(&log)})
		status, body := get(t, addr, "abc.example.test", false)
		stop()
		if status != http.StatusBadGateway || !strings.HasPrefix(body, "app_unreachable") || strings.Contains(body, "certificate") {
			t.Fatalf("an app with an untrusted certificate: %d %q, want 502 app_unreachable, the certificate's error not shown", status, body)
		}
		if !strings.Contains(log.String(), "code=app_unreachable") || !strings.Contains(log.String(), "x509: certificate signed by unknown authority") {
			t.Errorf("log:\n%s\nwant the warning, naming the certificate's error", log.String())
		}
	})
	t.Run("server name", func(t *testing.T) {
		// The app's certificate names app.internal, not the address
		// dialled: the config's ServerName checks that name.
		_, port, _ := net.SplitHostPort(app)
		addr, _ := startForwarder(t, forward.HTTP{To: "localhost:" + port, TLSConfig: &tls.Config{RootCAs: ca.Pool, ServerName: "app.internal"}})
		if status, body := get(t, addr, "abc.example.test", false); status != 200 || body != "HTTP/1.1 tls=true host=abc.example.test" {
			t.Fatalf("got %d %q", status, body)
		}
		addr, _ = startForwarder(t, forward.HTTP{To: "localhost:" + port, TLSConfig: &tls.Config{RootCAs: ca.Pool}})
		if status, _ := get(t, addr, "abc.example.test", false); status != http.StatusBadGateway {
			t.Fatalf("a certificate not for localhost: %d, want 502", status)
		}
	})
}

// Network "unix" forwards to a Unix socket, in both modes.
func TestUnixSocketApp(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "app.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Skipf("no Unix sockets here: %v", err)
	}
	srv := &http.Server{Handler: whoami}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	addr, _ := startForwarder(t, forward.HTTP{To: sock, Network: "unix"})
	if status, body := get(t, addr, "abc.example.test", false); status != 200 || body != "HTTP/1.1 tls=false host=abc.example.test" {
		t.Fatalf("HTTP to a Unix socket: %d %q", status, body)
	}
	addr, _ = startForwarder(t, forward.Bytes{To: sock, Network: "unix"})
	if status, body := get(t, addr, "abc.example.test", false); status != 200 || body != "HTTP/1.1 tls=false host=abc.example.test" {
		t.Fatalf("Bytes to a Unix socket: %d %q", status, body)
	}
	if err := (forward.Bytes{To: sock, Network: "udp"}).Serve(listenLoopback(t)); err == nil || !strings.Contains(err.Error(), "want tcp or unix") {
		t.Fatalf("Network udp: %v", err)
	}
}

// Bytes with a TLSConfig wraps each conn's bytes in TLS to the app, after
// the PROXY header when there is one.
func TestBytesToTLSApp(t *testing.T) {
	ca := testpki.New(t)
	cert := ca.Issue(t, "127.0.0.1")
	raw := listenLoopback(t)
	got := make(chan string, 1)
	serveConns(raw, func(c net.Conn) {
		// A PROXY v1 line, then TLS.
		line := make([]byte, 0, 128)
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			line = append(line, b[0])
			if b[0] == '\n' {
				break
			}
		}
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		msg, _ := io.ReadAll(io.LimitReader(tc, 5))
		got <- string(line) + string(msg)
		io.WriteString(tc, "pong")
		tc.Close()
	})
	addr, _ := startForwarder(t, forward.Bytes{To: raw.Addr().String(), ProxyProtocol: 1, TLSConfig: &tls.Config{RootCAs: ca.Pool}})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "ping!")
	reply, _ := io.ReadAll(c)
	if s := <-got; !strings.HasPrefix(s, "PROXY TCP4 127.0.0.1 127.0.0.1 ") || !strings.HasSuffix(s, "\r\nping!") {
		t.Fatalf("the app got %q", s)
	}
	if string(reply) != "pong" {
		t.Fatalf("the client got %q", reply)
	}
}

// serveConns accepts ln's conns until it is closed, each handled by
// handle in a goroutine of its own, which closes the conn after.
func serveConns(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
