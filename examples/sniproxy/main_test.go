package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// selfSigned returns a certificate for names and a pool trusting it.
func selfSigned(t testing.TB, names ...string) (tls.Certificate, *x509.CertPool) {
	ca := testpki.New(t)
	return ca.Issue(t, names...), ca.Pool
}

// tlsBackend serves TLS and answers every connection with its id.
func tlsBackend(t testing.TB, id string, cert tls.Certificate) string {
	t.Helper()
	ln := tls.NewListener(listen(t), &tls.Config{Certificates: []tls.Certificate{cert}})
	return testnet.Serve(t, ln, func(c net.Conn) { io.WriteString(c, id) })
}

// echoBackend echoes every byte until EOF, then sends trailer and closes:
// bytes sent after the client's half-close must still reach it.
func echoBackend(t testing.TB, trailer []byte) string {
	t.Helper()
	return testnet.Serve(t, listen(t), func(c net.Conn) {
		io.Copy(c, c)
		c.Write(trailer)
	})
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startProxy runs a proxy with routes on loopback and returns its address.
func startProxy(t testing.TB, def string, routes ...string) (*proxy, string, *testtools.Buffer) {
	t.Helper()
	logs := &testtools.Buffer{}
	p := &proxy{Default: def, DialTimeout: 5 * time.Second, Logger: newLogger(logs)}
	for _, r := range routes {
		if err := p.addRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(ln) }()
	t.Cleanup(func() {
		p.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return p, ln.Addr().String(), logs
}

// tlsID connects through the proxy as serverName and returns what the
// backend said, verifying its certificate.
func tlsID(addr, serverName string, pool *x509.CertPool) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{ServerName: serverName, RootCAs: pool})
	if err != nil {
		return "", err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestRoutesByNameAndWildcard(t *testing.T) {
	cert, pool := selfSigned(t, "app.example.test", "*.example.test", "other.test")
	app := tlsBackend(t, "app", cert)
	wild := tlsBackend(t, "wild", cert)
	_, addr, logs := startProxy(t, "", "app.example.test="+app, "*.example.test="+wild)
	for _, c := range []struct{ name, want string }{
		{"app.example.test", "app"},
		{"APP.example.test", "app"},
		{"api.example.test", "wild"},
	} {
		got, err := tlsID(addr, c.name, pool)
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	// No route and no default: closed.
	if _, err := tlsID(addr, "other.test", pool); err == nil {
		t.Error("unrouted name reached a backend")
	}
	waitLog(t, logs, "sni=app.example.test backend="+app)
}

func TestFailoverPastDeadBackend(t *testing.T) {
	cert, pool := selfSigned(t, "app.example.test")
	live := tlsBackend(t, "live", cert)
	dead := deadAddr(t)
	_, addr, _ := startProxy(t, "", "app.example.test="+dead+","+live)
	for i := range 6 {
		got, err := tlsID(addr, "app.example.test", pool)
		if err != nil || got != "live" {
			t.Fatalf("connection %d: %q, %v", i, got, err)
		}
	}
}

func TestRoundRobin(t *testing.T) {
	cert, pool := selfSigned(t, "app.example.test")
	a, b := tlsBackend(t, "a", cert), tlsBackend(t, "b", cert)
	_, addr, _ := startProxy(t, "", "app.example.test="+a+","+b)
	seen := map[string]int{}
	for range 10 {
		got, err := tlsID(addr, "app.example.test", pool)
		if err != nil {
			t.Fatal(err)
		}
		seen[got]++
	}
	if seen["a"] != 5 || seen["b"] != 5 {
		t.Fatalf("round robin: %v", seen)
	}
}

func TestNotTLSToDefaultAtOnce(t *testing.T) {
	def := echoBackend(t, []byte(" (from default)"))
	_, addr, _ := startProxy(t, def, "app.example.test="+deadAddr(t))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One request line; the client then waits for the answer: the proxy
	// must not wait for more bytes or for a timeout.
	io.WriteString(c, "GET / HTTP/1.1\r\n")
	buf := make([]byte, len("GET / HTTP/1.1\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "GET / HTTP/1.1\r\n" {
		t.Fatalf("not-TLS bytes back from default: %q, %v", buf, err)
	}
}

func TestNotTLSWithoutDefaultClosed(t *testing.T) {
	_, addr, _ := startProxy(t, "")
	for _, first := range []string{"SSH-2.0-x\r\n", "\x16\x03\x01\x00\x05garbage-not-a-hello"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, first)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(make([]byte, 16))
		c.Close()
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%q: read %d, %v; want closed", first, n, err)
		}
	}
}

// clientHello returns the first flight of a Go TLS client for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
	buf := make([]byte, 64<<10)
	n, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()
	return buf[:n]
}

// TestHalfCloseEchoLosesNoByte sends a real ClientHello and 4 MiB after it,
// half-closes, and reads the echo and a trailer the backend sends after
// seeing EOF: every byte, in order.
func TestHalfCloseEchoLosesNoByte(t *testing.T) {
	trailer := bytes.Repeat([]byte("after-half-close;"), 10000)
	backend := echoBackend(t, trailer)
	_, addr, logs := startProxy(t, "", "app.example.test="+backend)
	hello := clientHello(t, "app.example.test")
	payload := make([]byte, 4<<20)
	rand.Read(payload)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		c.Write(hello)
		c.Write(payload)
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte{}, hello...), payload...), trailer...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d; sha %x vs %x", len(got), len(want), sha256.Sum256(got), sha256.Sum256(want))
	}
	// One log line with the name, the backend and the bytes each way.
	waitLog(t, logs, fmt.Sprintf("sni=app.example.test backend=%s bytes_in=%d bytes_out=%d", backend, len(hello)+len(payload), len(want)))
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-route", "app.example.test"},
		{"-route", "app.example.test="},
		{"-route", "bad name=127.0.0.1:1"},
		{"-route", "app.example.test=no-port"},
		{"-default", "no-port"},
		{"-listen", "127.0.0.1:bad"},
		{"extra"},
	} {
		var stderr strings.Builder
		if err := run(args, &stderr); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

func waitLog(t testing.TB, l *testtools.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(l.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q in:\n%s", want, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
