package sni

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// These tests run real TLS clients against a crypto/tls server that gets its
// conn from Peek: the handshake must complete through the replayed bytes.
// Everything runs on 127.0.0.1.

type serverResult struct {
	hello *ClientHello
	state tls.ConnectionState
	err   error
}

// startServer accepts one conn on 127.0.0.1, peeks its ClientHello, then
// runs a TLS server handshake over the conn Peek returned and serve over the
// TLS conn. It returns the address and a channel with the outcome.
func startServer(t *testing.T, serve func(*tls.Conn) error) (string, <-chan serverResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cfg := serverConfig(t)
	result := make(chan serverResult, 1)
	go func() {
		var r serverResult
		defer func() { result <- r }()
		raw, err := ln.Accept()
		if err != nil {
			r.err = err
			return
		}
		ln.Close()
		defer raw.Close()
		hello, conn, err := Peek(raw)
		if err != nil {
			r.err = fmt.Errorf("peek: %w", err)
			return
		}
		r.hello = hello
		tc := tls.Server(conn, cfg)
		tc.SetDeadline(time.Now().Add(30 * time.Second))
		if err := tc.Handshake(); err != nil {
			r.err = fmt.Errorf("server handshake through the replay conn: %w", err)
			return
		}
		r.state = tc.ConnectionState()
		if err := serve(tc); err != nil {
			r.err = fmt.Errorf("serve: %w", err)
		}
		tc.Close()
	}()
	return ln.Addr().String(), result
}

// pingPong reads a "ping" line and answers "pong".
func pingPong(tc *tls.Conn) error {
	line, err := bufio.NewReader(tc).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("read %q, want ping", line)
	}
	_, err = io.WriteString(tc, "pong\n")
	return err
}

func TestRealGoClient(t *testing.T) {
	testwait.NoLeak(t, 0)
	addr, result := startServer(t, pingPong)
	conn, err := tls.Dial("tcp", addr, clientConfig(t, appName))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping\n")
	if line, err := bufio.NewReader(conn).ReadString('\n'); line != "pong\n" {
		t.Errorf("client read %q, %v", line, err)
	}
	r := <-result
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.hello.ServerName != appName || r.state.ServerName != appName {
		t.Errorf("peeked %q, server saw %q; want %q", r.hello.ServerName, r.state.ServerName, appName)
	}
	if n := len(r.hello.Raw); n <= 1460 {
		t.Errorf("Go's default hello is %d bytes, want a post-quantum one over 1460", n)
	}
	if r.state.CurveID != tls.X25519MLKEM768 {
		t.Errorf("key exchange %v, want X25519MLKEM768", r.state.CurveID)
	}
}

// A client that dials an IP address sends no server_name: Peek succeeds
// with an empty name, and the handshake completes.
func TestRealGoClientNoSNI(t *testing.T) {
	testwait.NoLeak(t, 0)
	addr, result := startServer(t, pingPong)
	conn, err := tls.Dial("tcp", addr, clientConfig(t, "")) // verifies 127.0.0.1
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping\n")
	bufio.NewReader(conn).ReadString('\n')
	r := <-result
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.hello.ServerName != "" || r.hello.RawServerName != "" || r.state.ServerName != "" {
		t.Errorf("peeked %q, server saw %q; want no name", r.hello.ServerName, r.state.ServerName)
	}
}

// With ECH, Peek sees the public name of the outer hello, and the TLS
// server, holding the key, the inner name.
func TestRealGoClientECH(t *testing.T) {
	testwait.NoLeak(t, 0)
	addr, result := startServer(t, pingPong)
	cfg := clientConfig(t, appName)
	cfg.EncryptedClientHelloConfigList = getPKI(t).echConfigList
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping\n")
	bufio.NewReader(conn).ReadString('\n')
	r := <-result
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.hello.ECH || r.hello.ServerName != publicName {
		t.Errorf("peeked ECH %v, name %q; want true, %q", r.hello.ECH, r.hello.ServerName, publicName)
	}
	if !r.state.ECHAccepted || r.state.ServerName != appName {
		t.Errorf("server: ECH accepted %v, name %q; want true, %q", r.state.ECHAccepted, r.state.ServerName, appName)
	}
}

// lookPath returns the path of a client binary, or skips the test.
func lookPath(t *testing.T, name string) string {
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not found: %v", name, err)
	}
	return path
}

func writeCA(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, getPKI(t).certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRealOpenSSLClient(t *testing.T) {
	openssl := lookPath(t, "openssl")
	testwait.NoLeak(t, 0)
	addr, result := startServer(t, pingPong)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", addr,
		"-servername", appName, "-CAfile", writeCA(t), "-brief")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "ping\n")
	// Wait for the answer before closing stdin, which ends s_client.
	sawPong := false
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		if sc.Text() == "pong" {
			sawPong = true
			break
		}
	}
	stdin.Close()
	io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	r := <-result
	if r.err != nil || !sawPong {
		t.Fatalf("server: %v; client saw pong: %v, exit: %v\n%s", r.err, sawPong, err, stderr.String())
	}
	if r.hello.ServerName != appName || r.state.ServerName != appName {
		t.Errorf("peeked %q, server saw %q; want %q", r.hello.ServerName, r.state.ServerName, appName)
	}
	t.Logf("openssl s_client: %d-byte hello, %s", len(r.hello.Raw), strings.TrimSpace(firstLine(stderr.String(), "Protocol version")))
}

func firstLine(s, prefix string) string {
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

// curl gets an HTTP response from the server behind Peek.
func TestRealCurlClient(t *testing.T) {
	curl := lookPath(t, "curl")
	testwait.NoLeak(t, 0)
	const body = "hello from behind sni.Peek\n"
	addr, result := startServer(t, func(tc *tls.Conn) error {
		req, err := http.ReadRequest(bufio.NewReader(tc))
		if err != nil {
			return err
		}
		_, port, _ := net.SplitHostPort(tc.LocalAddr().String())
		if want := appName + ":" + port; req.Host != want {
			return fmt.Errorf("Host %q, want %q", req.Host, want)
		}
		_, err = fmt.Fprintf(tc, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
		return err
	})
	_, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, curl, "-sS", "--max-time", "20",
		"--cacert", writeCA(t),
		"--resolve", appName+":"+port+":127.0.0.1",
		"https://"+appName+":"+port+"/")
	out, err := cmd.Output()
	r := <-result
	var stderr string
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		stderr = string(ee.Stderr)
	}
	if err != nil || r.err != nil {
		t.Fatalf("curl: %v %s; server: %v", err, stderr, r.err)
	}
	if string(out) != body {
		t.Errorf("curl got %q, want %q", out, body)
	}
	if r.hello.ServerName != appName {
		t.Errorf("peeked %q, want %q", r.hello.ServerName, appName)
	}
	if !slices.Contains(r.hello.ALPN, "http/1.1") {
		t.Errorf("ALPN %q, want http/1.1 among them", r.hello.ALPN)
	}
	t.Logf("curl: %d-byte hello, ALPN %q", len(r.hello.Raw), r.hello.ALPN)
}
