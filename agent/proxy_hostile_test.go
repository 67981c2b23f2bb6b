package agent_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// The proxies here are protocol peers written for the error paths: each
// answers the agent's CONNECT or SOCKS5 handshake wrongly. The agent must
// fail at once with ErrProxy and a message that names the proxy and says
// what it answered, and never shows the proxy's password.

// hostileEdge is the edge the agents ask for: never reached.
const hostileEdge = "edge.example.test:7000"

// hostilePassword is the password in the proxy URLs, which no error may show.
const hostilePassword = "s3cret-pw"

// connectPeer is a fake HTTP proxy: it reads the request, records it, and
// lets answer do the rest.
type connectPeer struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (p *connectPeer) serve(t *testing.T, answer func(c net.Conn)) string {
	return testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		p.mu.Lock()
		p.reqs = append(p.reqs, req)
		p.mu.Unlock()
		answer(c)
	})
}

// checkRequest checks that the agent sent CONNECT to the edge with its
// Basic credentials.
func (p *connectPeer) checkRequest(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.reqs) != 1 {
		t.Fatalf("the proxy got %d requests, want 1", len(p.reqs))
	}
	r := p.reqs[0]
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("agent:"+hostilePassword))
	if r.Method != http.MethodConnect || r.RequestURI != hostileEdge || r.Host != hostileEdge || r.Header.Get("Proxy-Authorization") != wantAuth {
		t.Errorf("the proxy got %s %s, Host %q, Proxy-Authorization %q; want CONNECT %s with Basic credentials",
			r.Method, r.RequestURI, r.Host, r.Header.Get("Proxy-Authorization"), hostileEdge)
	}
}

// proxyFailure runs Listen through the proxy at u and checks its error:
// ErrProxy, the proxy named as want's prefix, each of wants, no password.
func proxyFailure(t *testing.T, ctx context.Context, u *url.URL, tlsCfg *tls.Config, wants ...string) error {
	t.Helper()
	c := &agent.Client{Addrs: []string{hostileEdge}, Proxy: agent.ProxyURL(u), ProxyTLSConfig: tlsCfg}
	defer c.Close()
	_, err := c.Listen(ctx, "http://app")
	if err == nil {
		t.Fatal("Listen succeeded")
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, agent.ErrProxy) {
		t.Errorf("the error does not wrap ErrProxy: %v", err)
	}
	if prefix := "agent: proxy " + u.Scheme + "://" + u.Host + ": "; !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("the error does not start with %q: %v", prefix, err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error lacks %q: %v", w, err)
		}
	}
	if strings.Contains(err.Error(), hostilePassword) {
		t.Errorf("the error shows the password: %v", err)
	}
	return err
}

// proxyRetried runs Listen through the proxy at u, which cannot be
// reached or cannot reach the edge, and checks that it is tried again as
// an edge that cannot be reached is: Listen is still waiting after the
// third attempt, and the error it returns when its context then ends
// wraps ErrProxy and says each of wants, without the password.
func proxyRetried(t *testing.T, u *url.URL, wants ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var attempts atomic.Int32
	c := &agent.Client{Addrs: []string{hostileEdge}, Proxy: agent.ProxyURL(u), MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Reconnecting && attempts.Add(1) == 3 {
				cancel()
			}
		}}
	defer c.Close()
	_, err := c.Listen(ctx, "http://app")
	if attempts.Load() < 3 || !errors.Is(err, context.Canceled) {
		t.Fatalf("Listen through %s: %v after %d attempts; want it to try again until its context ended", u.Redacted(), err, attempts.Load())
	}
	if !errors.Is(err, agent.ErrProxy) {
		t.Errorf("the error does not wrap ErrProxy: %v", err)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error lacks %q: %v", w, err)
		}
	}
	if strings.Contains(err.Error(), hostilePassword) {
		t.Errorf("the error shows the password: %v", err)
	}
}

func proxyURL(scheme, addr string) *url.URL {
	return &url.URL{Scheme: scheme, Host: addr, User: url.UserPassword("agent", hostilePassword)}
}

func TestHostileConnectProxy(t *testing.T) {
	huge := "HTTP/1.1 200 Connection established\r\nX-Filler: " + strings.Repeat("x", 100<<10) + "\r\n\r\n"
	manyLines := "HTTP/1.1 200 Connection established\r\n" + strings.Repeat("X-Filler: xxxxxxxxxxxxxxxxxxxxxxxx\r\n", 4000) + "\r\n"
	for _, tc := range []struct {
		name   string
		answer string // written after reading the request, then the conn is closed
		want   []string
	}{
		{"SSH banner", "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", []string{"answered CONNECT " + hostileEdge + ` with something other than HTTP: "SSH-2.0-OpenSSH_9.2p1 Debian-2"`}},
		{"binary", "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n", []string{`with something other than HTTP: "???????????"`}},
		{"407", "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"corp\"\r\nContent-Length: 0\r\n\r\n",
			[]string{`refused the credentials of the proxy URL's user "agent": it answered CONNECT ` + hostileEdge + " with 407 Proxy Authentication Required"}},
		{"403", "HTTP/1.1 403 Forbidden\r\nContent-Type: text/html\r\nContent-Length: 22\r\n\r\n<h1>Access denied</h1>",
			[]string{"refused the tunnel: it answered CONNECT " + hostileEdge + " with 403 Forbidden"}},
		{"huge header line", huge, []string{"answered CONNECT " + hostileEdge + " with a header of more than 64 KiB"}},
		{"endless header", manyLines, []string{"with a header of more than 64 KiB"}},
		{"closes after the request", "", []string{"closed the connection before answering CONNECT " + hostileEdge}},
		{"half a status line", "HTTP/1.1 20", []string{`with something other than HTTP: "HTTP/1.1 20"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer := &connectPeer{}
			addr := peer.serve(t, func(c net.Conn) { io.WriteString(c, tc.answer) })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			proxyFailure(t, ctx, proxyURL("http", addr), nil, tc.want...)
			peer.checkRequest(t)
		})
	}

	t.Run("closes at once", func(t *testing.T) {
		addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {})
		proxyFailure(t, t.Context(), proxyURL("http", addr), nil, "closed the connection before answering CONNECT "+hostileEdge)
	})
	t.Run("silent", func(t *testing.T) {
		peer := &connectPeer{}
		addr := peer.serve(t, func(c net.Conn) { io.Copy(io.Discard, c) })
		ctx, cancel := context.WithTimeout(context.Background(), silentProxyWait)
		defer cancel()
		err := proxyFailure(t, ctx, proxyURL("http", addr), nil, "no answer in time to open the tunnel to the edge "+hostileEdge)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the error does not wrap context.DeadlineExceeded: %v", err)
		}
	})
	t.Run("nobody there", func(t *testing.T) {
		ln := testnet.Listen(t)
		addr := ln.Addr().String()
		ln.Close()
		proxyRetried(t, proxyURL("http", addr), "cannot connect to it", "connection refused")
	})
	t.Run("cannot reach the edge", func(t *testing.T) {
		// 502, 503, 504: the proxy could not reach the edge.
		for _, answer := range []string{"HTTP/1.0 502 Bad Gateway\r\n\r\n<html>unreachable</html>", "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\n\r\n"} {
			peer := &connectPeer{}
			addr := peer.serve(t, func(c net.Conn) { io.WriteString(c, answer) })
			proxyRetried(t, proxyURL("http", addr), "could not reach the edge: it answered CONNECT "+hostileEdge+" with "+answer[9:21])
		}
	})
	t.Run("https with a certificate from an unknown CA", func(t *testing.T) {
		ca := testpki.New(t)
		ln := tls.NewListener(testnet.Listen(t), &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}})
		addr := testnet.Serve(t, ln, func(c net.Conn) { io.Copy(io.Discard, c) })
		proxyFailure(t, t.Context(), proxyURL("https", addr), nil, "TLS to the proxy", "certificate signed by unknown authority")
		// Trusted, it gets to the CONNECT (which this peer never answers).
		ctx, cancel := context.WithTimeout(context.Background(), silentProxyWait)
		defer cancel()
		proxyFailure(t, ctx, proxyURL("https", addr), &tls.Config{RootCAs: ca.Pool}, "no answer in time")
	})
	t.Run("unsupported scheme", func(t *testing.T) {
		c := &agent.Client{Addrs: []string{hostileEdge}, Proxy: agent.ProxyURL(proxyURL("ftp", "127.0.0.1:21"))}
		defer c.Close()
		_, err := c.Listen(t.Context(), "http://app")
		if !errors.Is(err, agent.ErrProxy) || !strings.HasPrefix(err.Error(), "agent: proxy ftp://127.0.0.1:21: unsupported scheme") || strings.Contains(err.Error(), hostilePassword) {
			t.Errorf("Listen: %v; want ErrProxy for the scheme, without the password", err)
		}
	})
}

// silentProxyWait is how long the tests give the setup through a proxy
// that never answers: enough for the agent to reach it and ask on a busy
// machine (a TLS handshake to an https proxy first), so that what fails
// is the proxy's answer, not the way to it.
const silentProxyWait = 2 * time.Second

// socksPeer is a fake SOCKS5 proxy: a script of reads (the byte counts it
// expects) and writes.
func socksPeer(t *testing.T, script func(c net.Conn, r *bufio.Reader)) string {
	return testnet.Serve(t, testnet.Listen(t), func(c net.Conn) { script(c, bufio.NewReader(c)) })
}

// readGreeting reads the client's greeting (version, methods) and returns
// the methods it offers.
func readGreeting(r *bufio.Reader) []byte {
	head := make([]byte, 2)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil
	}
	methods := make([]byte, head[1])
	io.ReadFull(r, methods)
	return methods
}

// readUserPass reads a username/password subnegotiation (RFC 1929).
func readUserPass(r *bufio.Reader) (user, pass string) {
	ver, _ := r.ReadByte()
	if ver != 1 {
		return "", ""
	}
	field := func() string {
		n, _ := r.ReadByte()
		b := make([]byte, n)
		io.ReadFull(r, b)
		return string(b)
	}
	user = field()
	pass = field()
	return user, pass
}

func TestHostileSOCKSProxy(t *testing.T) {
	var gotUser, gotPass string
	var mu sync.Mutex
	for _, tc := range []struct {
		name   string
		script func(c net.Conn, r *bufio.Reader)
		want   []string
	}{
		{"answers HTTP", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
			io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		}, []string{"SOCKS5 handshake for the edge " + hostileEdge + " failed", "unexpected protocol version 72"}},
		{"no acceptable method", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
			c.Write([]byte{5, 0xff})
		}, []string{"SOCKS5 handshake for the edge " + hostileEdge + " failed", "no acceptable authentication methods"}},
		{"password refused", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
			c.Write([]byte{5, 2})
			u, p := readUserPass(r)
			mu.Lock()
			gotUser, gotPass = u, p
			mu.Unlock()
			c.Write([]byte{1, 1})
		}, []string{"SOCKS5 handshake for the edge " + hostileEdge + " failed", "username/password authentication failed"}},
		{"connection refused", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
			c.Write([]byte{5, 0})
			io.ReadFull(r, make([]byte, 4+1+len("edge.example.test")+2))
			c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		}, []string{"SOCKS5 handshake for the edge " + hostileEdge + " failed", "connection refused"}},
		{"closes after the greeting", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
		}, []string{"closed the connection during the SOCKS5 handshake for the edge " + hostileEdge}},
		{"half an answer", func(c net.Conn, r *bufio.Reader) {
			readGreeting(r)
			c.Write([]byte{5})
		}, []string{"closed the connection during the SOCKS5 handshake"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := socksPeer(t, tc.script)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			proxyFailure(t, ctx, proxyURL("socks5", addr), nil, tc.want...)
		})
	}
	mu.Lock()
	if gotUser != "agent" || gotPass != hostilePassword {
		t.Errorf("the SOCKS5 peer got user %q, password %q; want the URL's", gotUser, gotPass)
	}
	mu.Unlock()

	t.Run("silent", func(t *testing.T) {
		addr := socksPeer(t, func(c net.Conn, r *bufio.Reader) { io.Copy(io.Discard, r) })
		ctx, cancel := context.WithTimeout(context.Background(), silentProxyWait)
		defer cancel()
		err := proxyFailure(t, ctx, proxyURL("socks5h", addr), nil, "no answer in time to open the tunnel to the edge "+hostileEdge)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the error does not wrap context.DeadlineExceeded: %v", err)
		}
	})
	t.Run("nobody there", func(t *testing.T) {
		ln := testnet.Listen(t)
		addr := ln.Addr().String()
		ln.Close()
		proxyRetried(t, proxyURL("socks5", addr), "cannot connect to it", "connection refused")
	})
}
