package edge_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
)

// Loopback sources: every test client is one or the other. Linux answers
// the whole of 127.0.0.0/8 on the loopback interface.
const (
	hostileIP = "127.0.0.1"
	goodIP    = "127.0.0.2"
)

// dialSource dials addr from the loopback address ip.
func dialSource(ctx context.Context, ip, addr string) (net.Conn, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return d.DialContext(ctx, "tcp", addr)
}

// clientFrom returns an HTTP client whose every connection goes to addr
// from ip: over TLS trusting e's CA when tlsTo, with HTTP/2 when h2.
func (e *httpsEdge) clientFrom(t testing.TB, ip string, tlsTo, h2 bool) *http.Client {
	addr := e.httpAddr
	p := new(http.Protocols)
	switch {
	case tlsTo && h2:
		p.SetHTTP2(true)
	case h2:
		p.SetUnencryptedHTTP2(true)
	default:
		p.SetHTTP1(true)
	}
	if tlsTo {
		addr = e.tlsAddr
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialSource(ctx, ip, addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.pki.Pool},
		Protocols:       p,
		MaxConnsPerHost: 0,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// serveBoth binds http://name and https://name with one agent, and
// serves h on both.
func (e *httpsEdge) serveBoth(t testing.TB, name string, h http.Handler) {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	var servers []*http.Server
	var wg sync.WaitGroup
	for _, url := range []string{"http://" + name, "https://" + name} {
		l, err := c.Listen(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: h}
		servers = append(servers, hs)
		wg.Go(func() { hs.Serve(l) })
	}
	t.Cleanup(func() {
		c.Close()
		for _, hs := range servers {
			hs.Close()
		}
		wg.Wait()
	})
}

// heldConn opens a connection from ip to the edge's HTTP port (or TLS
// port, tlsTo), starting with a PROXY header naming client if it is
// valid, gets one response on it, and leaves it open, idle: the edge has
// accepted it and counts it.
func (e *httpsEdge) heldConn(t *testing.T, ip string, client netip.AddrPort, tlsTo bool) (net.Conn, error) {
	t.Helper()
	addr := e.httpAddr
	if tlsTo {
		addr = e.tlsAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialSource(ctx, ip, addr)
	if err != nil {
		t.Fatal(err)
	}
	if client.IsValid() {
		if err := proxyproto.Write(c, 2, client, netip.MustParseAddrPort("192.0.2.1:443")); err != nil {
			t.Fatal(err)
		}
	}
	if tlsTo {
		tc := tls.Client(c, &tls.Config{ServerName: "app.example.test", RootCAs: e.pki.Pool, NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /held HTTP/1.1\r\nHost: app.example.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	c.SetDeadline(time.Time{})
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// TestConnsPerSource: one source holds Limits.ConnsPerSource idle
// keep-alive connections on the HTTP port, and on the TLS port; its next
// one on each is closed at once (conn_limit), while a client from another
// address is served; once the source closes one, it gets one again.
// Behind a load balancer sending PROXY protocol headers, the source is the
// client the header names: two clients of the one load balancer each have
// their own bound.
func TestConnsPerSource(t *testing.T) {
	t.Parallel()
	const bound = 4
	const lb = "127.0.0.3"
	hostile, good := netip.MustParseAddrPort("203.0.113.7:4000"), netip.MustParseAddrPort("203.0.113.8:4000")
	for _, c := range []struct {
		name    string
		proxied bool
		tlsTo   bool
	}{
		{"http", false, false},
		{"tls", false, true},
		{"http-behind-load-balancer", true, false},
		{"tls-behind-load-balancer", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var obs tally
			e := startHTTPSEdge(t, func(s *edge.Server) {
				s.Limits.ConnsPerSource = bound
				s.Observer = &obs
				if c.proxied {
					s.ProxyProtocolFrom = []netip.Prefix{netip.MustParsePrefix(lb + "/32")}
				}
			})
			e.serveBoth(t, "app", echoInfo)
			// open opens a held connection from the hostile source, or the
			// good one.
			open := func(bad bool) (net.Conn, error) {
				switch {
				case c.proxied && bad:
					return e.heldConn(t, lb, hostile, c.tlsTo)
				case c.proxied:
					return e.heldConn(t, lb, good, c.tlsTo)
				case bad:
					return e.heldConn(t, hostileIP, netip.AddrPort{}, c.tlsTo)
				}
				return e.heldConn(t, goodIP, netip.AddrPort{}, c.tlsTo)
			}

			var held []net.Conn
			for i := range bound {
				conn, err := open(true)
				if err != nil {
					t.Fatalf("connection %d of %d: %v", i+1, bound, err)
				}
				held = append(held, conn)
			}
			if _, err := open(true); err == nil {
				t.Fatalf("connection %d from one source served; want it closed", bound+1)
			}
			if n := obs.get("refused/conn_limit"); n != 1 {
				t.Errorf("%d refusals counted as conn_limit, want 1", n)
			}
			// Another source is served meanwhile.
			if _, err := open(false); err != nil {
				t.Errorf("a client at another address: %v", err)
			}
			// The source gets its place back once it closes a connection
			// (the edge sees the close in its own time).
			held[0].Close()
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err := open(true)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after closing one of its connections, the source still gets none: %v", err)
				}
			}
		})
	}
}

// TestHandshakesPerSource: one source has Limits.HandshakesPerSource TLS
// handshakes under way (a ClientHello each, then silence, as a slow client
// or an attacker holding handshakes open); its next connection for an
// https name waits, its hello unread, while a client from another address
// completes its own and is served; once one of the source's handshakes
// ends, the waiting connection's starts. One still waiting when the edge
// closes never has a handshake (see TestSourceCountWaits for the waits).
func TestHandshakesPerSource(t *testing.T) {
	t.Parallel()
	const bound = 3
	var obs tally
	e := startHTTPSEdge(t, func(s *edge.Server) {
		s.Limits.HandshakesPerSource = bound
		s.Observer = &obs
	})
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	hello := clientHelloFor(t, "app.example.test")

	// send sends a ClientHello from ip; started returns once the edge
	// answered it with the first byte of its flight (its handshake is under
	// way, waiting for the client's), or the error when the edge closed it.
	send := func(ip string) net.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := dialSource(ctx, ip, e.tlsAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write(hello)
		return c
	}
	started := func(c net.Conn) error {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return err
		}
		if b[0] != 0x16 { // a handshake record
			return fmt.Errorf("the edge answered a record of type %d", b[0])
		}
		return nil
	}
	var held []net.Conn
	for i := range bound {
		c := send(hostileIP)
		if err := started(c); err != nil {
			t.Fatalf("handshake %d of %d: %v", i+1, bound, err)
		}
		held = append(held, c)
	}
	waiting := send(hostileIP)
	if body := mustRead(t)(e.clientFrom(t, goodIP, true, true).Get("https://app.example.test/good")); !strings.Contains(body, "path=/good") {
		t.Errorf("a client at another address got %q", body)
	}
	// A handshake that ends gives its place to the one waiting.
	held[0].Close()
	if err := started(waiting); err != nil {
		t.Fatalf("the connection waiting for a handshake: %v", err)
	}
	// The source holds its bound again: the next one waits until the edge
	// closes, and gives up then.
	last := send(hostileIP)
	e.srv.Close()
	if err := started(last); err == nil {
		t.Fatal("a handshake past the bound started as the edge closed")
	}
	// It gave up waiting (handshake_limit), unless the edge closed it
	// before it read its hello.
	if n := obs.get("refused/handshake_limit"); n > 1 {
		t.Errorf("%d refusals counted as handshake_limit, want at most 1", n)
	}
}

// TestBrowserMeetsNoSourceBound: with the default bounds, what a browser
// does from one address (eight HTTP/1.1 connections at once, on the TLS
// port and on the HTTP port, and one HTTP/2 connection carrying a hundred
// requests at once) is served whole, and nothing is refused.
func TestBrowserMeetsNoSourceBound(t *testing.T) {
	t.Parallel()
	var obs tally
	e := startHTTPSEdge(t, func(s *edge.Server) { s.Observer = &obs })
	const parallel = 8
	var mu sync.Mutex
	arrived := map[string]int{}
	release := map[string]chan struct{}{}
	// Each path's requests wait until the first `parallel` of them have
	// arrived, so that the HTTP/1.1 client really holds that many
	// connections at once.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/warm" {
			return
		}
		mu.Lock()
		ch := release[r.URL.Path]
		if ch == nil {
			ch = make(chan struct{})
			release[r.URL.Path] = ch
		}
		if arrived[r.URL.Path]++; arrived[r.URL.Path] == parallel {
			close(ch)
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-r.Context().Done():
		}
		io.WriteString(w, "ok")
	})
	e.serveBoth(t, "app", h)

	for _, c := range []struct {
		name      string
		tlsTo, h2 bool
		requests  int
	}{
		{"https-h1", true, false, parallel},
		{"http-h1", false, false, parallel},
		{"https-h2", true, true, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := e.clientFrom(t, hostileIP, c.tlsTo, c.h2)
			scheme := map[bool]string{false: "http", true: "https"}[c.tlsTo]
			if c.h2 {
				// A browser's one HTTP/2 connection (a Go client with
				// no connection yet dials one per request it starts at
				// once).
				mustRead(t)(client.Get(scheme + "://app.example.test/warm"))
			}
			var wg sync.WaitGroup
			errs := make(chan error, c.requests)
			for range c.requests {
				wg.Go(func() {
					resp, err := client.Get(scheme + "://app.example.test/" + c.name)
					if err != nil {
						errs <- err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
	for _, r := range []string{"conn_limit", "handshake_limit"} {
		if n := obs.get("refused/" + r); n != 0 {
			t.Errorf("%d refusals as %s for a browser's connections", n, r)
		}
	}
}
