package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testproxy"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// These tests run real proxies (internal/testproxy: tinyproxy for HTTP
// CONNECT, danted for SOCKS5) between agents and an in-process edge. The
// proxies' outgoing connections come from testproxy.Out (127.0.0.2), and the
// edge's agent port can refuse every other peer: an agent whose only way
// out is the proxy.

// proxyEdge is an edge whose public HTTP, TLS and TCP ports are on
// loopback, and whose agent port records its peers.
type proxyEdge struct {
	srv       *edge.Server
	agents    *peerListener
	agentAddr string
	agentPort int
	httpAddr  string
	tlsAddr   string
}

type proxyEdgeConfig struct {
	host      string        // the agent port's address; "": 127.0.0.1
	onlyFrom  netip.Addr    // valid: the agent port closes conns from elsewhere at once
	heartbeat time.Duration // the edge's HeartbeatInterval; zero: its default
}

func startProxyEdge(t *testing.T, cfg proxyEdgeConfig) *proxyEdge {
	t.Helper()
	host := cfg.host
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	agents := &peerListener{Listener: ln, from: cfg.onlyFrom}
	httpLn, tlsLn := testnet.Listen(t), testnet.Listen(t)
	_, httpPort, _ := net.SplitHostPort(httpLn.Addr().String())
	_, tlsPort, _ := net.SplitHostPort(tlsLn.Addr().String())
	srv := &edge.Server{
		Domain:   "example.test",
		HTTPPort: httpPort,
		TLSPort:  tlsPort,
		TCPPorts: edge.PortRange{Min: 1024, Max: 65535},
		Timeouts: edge.Timeouts{HeartbeatInterval: cfg.heartbeat},
	}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(httpLn) })
	wg.Go(func() { srv.ServeSNI(tlsLn) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &proxyEdge{
		srv:       srv,
		agents:    agents,
		agentAddr: ln.Addr().String(),
		agentPort: ln.Addr().(*net.TCPAddr).Port,
		httpAddr:  httpLn.Addr().String(),
		tlsAddr:   tlsLn.Addr().String(),
	}
}

// peerListener records the peer of each conn it accepts and, when from is
// valid, closes at once the conns from any other address.
type peerListener struct {
	net.Listener
	from netip.Addr

	mu      sync.Mutex
	peers   []netip.AddrPort
	refused int
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
		l.mu.Lock()
		l.peers = append(l.peers, peer)
		refuse := l.from.IsValid() && peer.Addr() != l.from
		if refuse {
			l.refused++
		}
		l.mu.Unlock()
		if !refuse {
			return c, nil
		}
		c.Close()
	}
}

// seen returns the peers accepted so far, and how many were refused.
func (l *peerListener) seen() ([]netip.AddrPort, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.peers), l.refused
}

// dialRecorder is a Client.DialContext that records the addresses dialled.
type dialRecorder struct {
	mu    sync.Mutex
	addrs []string
}

func (d *dialRecorder) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, addr)
	d.mu.Unlock()
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

func (d *dialRecorder) dialled() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.addrs)
}

// serveAll binds an http, a tls and a tcp endpoint on c and checks that
// each serves a public client of the edge: an HTTP request, a TLS
// handshake with the app's certificate, TCP bytes echoed.
func (e *proxyEdge) serveAll(t *testing.T, c *agent.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pki := testpki.New(t)

	hl, err := c.Listen(ctx, "http://app")
	if err != nil {
		t.Fatalf("http endpoint: %v", err)
	}
	go http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app via proxy, client %s", r.RemoteAddr)
	}))
	tl, err := c.Listen(ctx, "tls://app.example.test")
	if err != nil {
		t.Fatalf("tls endpoint: %v", err)
	}
	serveLines(tl, &tls.Config{Certificates: []tls.Certificate{pki.Issue(t, "app.example.test")}})
	cl, err := c.Listen(ctx, "tcp://")
	if err != nil {
		t.Fatalf("tcp endpoint: %v", err)
	}
	serveLines(cl, nil)

	// http
	_, port, _ := net.SplitHostPort(e.httpAddr)
	if hl.URL() != "http://app.example.test:"+port {
		t.Errorf("http URL = %q", hl.URL())
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.httpAddr+"/", nil)
	req.Host = "app.example.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET through the edge: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "app via proxy, client 127.0.0.1:") {
		t.Errorf("GET through the edge: %d %q", resp.StatusCode, body)
	}
	// tls, passed through to the app
	tc, err := (&tls.Dialer{Config: &tls.Config{ServerName: "app.example.test", RootCAs: pki.Pool}}).DialContext(ctx, "tcp", e.tlsAddr)
	if err != nil {
		t.Fatalf("TLS through the edge: %v", err)
	}
	if got := lineRoundTrip(t, tc, "ping"); got != "echo ping" {
		t.Errorf("TLS through the edge: %q", got)
	}
	// tcp
	u, err := url.Parse(cl.URL())
	if err != nil || u.Scheme != "tcp" || u.Port() == "" {
		t.Fatalf("tcp URL %q: %v", cl.URL(), err)
	}
	tcpConn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", u.Port()))
	if err != nil {
		t.Fatalf("TCP through the edge: %v", err)
	}
	if got := lineRoundTrip(t, tcpConn, "pong"); got != "echo pong" {
		t.Errorf("TCP through the edge: %q", got)
	}
}

// serveLines answers each line of each conn of l with "echo " and the
// line, over TLS when cfg is set, until l closes.
func serveLines(l net.Listener, cfg *tls.Config) {
	if cfg != nil {
		l = tls.NewListener(l, cfg)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256)
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				fmt.Fprintf(c, "echo %s", buf[:n])
			}()
		}
	}()
}

// lineRoundTrip writes s on c and returns all c answers, then closes c.
func lineRoundTrip(t *testing.T, c net.Conn, s string) string {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tlsFront serves TLS on loopback with a certificate for 127.0.0.1 from
// its own CA, and joins each connection to the proxy at to: an https://
// proxy made of a real one behind a TLS terminator, as deployments put
// stunnel or haproxy before squid. It returns its address and the CA.
func tlsFront(t *testing.T, to string) (string, *testpki.CA) {
	t.Helper()
	ca := testpki.New(t)
	ln := tls.NewListener(testnet.Listen(t), &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}})
	addr := testnet.Serve(t, ln, func(c net.Conn) {
		up, err := net.Dial("tcp", to)
		if err != nil {
			return
		}
		defer up.Close()
		pipe.Join(c, up)
	})
	return addr, ca
}

// TestProxyIsTheOnlyWayOut puts the edge's agent port where only the
// proxy's connections are taken (their source is testproxy.Out): an agent
// that dials directly is refused, and one with Client.Proxy set gets its
// URLs and serves http, tls and tcp endpoints, through tinyproxy (http://
// with Basic credentials), tinyproxy behind TLS (https://), and danted
// (socks5://, and socks5h:// with a username and password). DialContext
// dials the proxy.
func TestProxyIsTheOnlyWayOut(t *testing.T) {
	t.Parallel()
	t.Run("direct is refused", func(t *testing.T) {
		e := startProxyEdge(t, proxyEdgeConfig{onlyFrom: testproxy.Out})
		c := &agent.Client{Addrs: []string{e.agentAddr}, Proxy: agent.ProxyURL(nil)}
		defer c.Close()
		// A connection closed at once may be an edge that restarts: the
		// agent tries again until the setup's context ends.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Listen(ctx, "http://app")
		if err == nil {
			t.Fatal("an agent dialling the edge directly got its endpoint")
		}
		if errors.Is(err, agent.ErrProxy) {
			t.Errorf("no proxy, yet the error wraps ErrProxy: %v", err)
		}
		if _, refused := e.agents.seen(); refused == 0 {
			t.Errorf("the edge refused no connection (error %v)", err)
		}
	})

	for _, tc := range []struct {
		name  string
		proxy func(t *testing.T, edgePort int) (*url.URL, *tls.Config)
	}{
		{"tinyproxy http", func(t *testing.T, port int) (*url.URL, *tls.Config) {
			p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "agent", Password: "pr0xy-pass", ConnectPorts: []int{port}})
			return p.URL, nil
		}},
		{"tinyproxy behind TLS https", func(t *testing.T, port int) (*url.URL, *tls.Config) {
			p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "agent", Password: "pr0xy-pass", ConnectPorts: []int{port}})
			addr, ca := tlsFront(t, p.Addr)
			u := *p.URL
			u.Scheme, u.Host = "https", addr
			return &u, &tls.Config{RootCAs: ca.Pool}
		}},
		{"danted socks5", func(t *testing.T, port int) (*url.URL, *tls.Config) {
			return testproxy.Dante(t, testproxy.DanteConfig{}).URL, nil
		}},
		{"danted socks5h username", func(t *testing.T, port int) (*url.URL, *tls.Config) {
			u := *testproxy.Dante(t, testproxy.DanteConfig{Username: true}).URL
			u.Scheme = "socks5h"
			return &u, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startProxyEdge(t, proxyEdgeConfig{onlyFrom: testproxy.Out})
			u, tlsCfg := tc.proxy(t, e.agentPort)
			dials := &dialRecorder{}
			c := &agent.Client{Addrs: []string{e.agentAddr}, Proxy: agent.ProxyURL(u), ProxyTLSConfig: tlsCfg, DialContext: dials.DialContext}
			defer c.Close()
			e.serveAll(t, c)

			if got := dials.dialled(); len(got) != 1 || got[0] != u.Host {
				t.Errorf("DialContext dialled %q, want the proxy %s once", got, u.Host)
			}
			peers, refused := e.agents.seen()
			if len(peers) != 1 || peers[0].Addr() != testproxy.Out || refused != 0 {
				t.Errorf("the edge's agent port saw %v (%d refused), want one session from the proxy's %v", peers, refused, testproxy.Out)
			}
		})
	}
}

// TestProxyRefusesCredentials gives the proxies wrong credentials, or none:
// Listen fails with ErrProxy, and a message that names the proxy, says what
// it answered, and holds no password.
func TestProxyRefusesCredentials(t *testing.T) {
	e := startProxyEdge(t, proxyEdgeConfig{onlyFrom: testproxy.Out})
	const wrong = "wr0ng-secret"
	tiny := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "agent", Password: "pr0xy-pass", ConnectPorts: []int{e.agentPort}})
	dante := testproxy.Dante(t, testproxy.DanteConfig{Username: true})

	withUser := func(u *url.URL, user *url.Userinfo) *url.URL {
		v := *u
		v.User = user
		return &v
	}
	for _, tc := range []struct {
		name  string
		proxy *url.URL
		want  []string
		log   string // what the proxy logs for it
	}{
		{"tinyproxy wrong password", withUser(tiny.URL, url.UserPassword("agent", wrong)),
			// tinyproxy answers wrong credentials with 401, not 407.
			[]string{"agent: proxy http://" + tiny.Addr + ": ", `refused the credentials of the proxy URL's user "agent"`, "401 Unauthorized"}, ""},
		{"tinyproxy no credentials", withUser(tiny.URL, nil),
			[]string{"agent: proxy http://" + tiny.Addr + ": ", "asks for credentials", "407 Proxy Authentication Required", "scheme://user:password@host:port"}, ""},
		{"danted wrong password", withUser(dante.URL, url.UserPassword(testproxy.SOCKSUser, wrong)),
			[]string{"agent: proxy socks5://" + dante.Addr + ": ", "SOCKS5 handshake for the edge " + e.agentAddr + " failed", "username/password authentication failed"},
			"password authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &agent.Client{Addrs: []string{e.agentAddr}, Proxy: agent.ProxyURL(tc.proxy)}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := c.Listen(ctx, "http://app")
			if err == nil {
				t.Fatal("Listen succeeded")
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, agent.ErrProxy) {
				t.Errorf("the error does not wrap ErrProxy: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q: %v", w, err)
				}
			}
			if strings.Contains(err.Error(), wrong) || strings.Contains(err.Error(), "pr0xy-pass") {
				t.Errorf("the error shows a password: %v", err)
			}
			if peers, _ := e.agents.seen(); len(peers) != 0 {
				t.Errorf("the edge saw sessions %v", peers)
			}
		})
	}
	if err := dante.WaitLog("password authentication failed"); err != nil {
		t.Errorf("danted: %v", err)
	}
}

// nonLoopback returns an address of this machine that is not loopback, for
// an edge that the environment's proxy applies to (never one on loopback).
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr()
		if ip.Is4() && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			if ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0")); err == nil {
				ln.Close()
				return ip.String()
			}
		}
	}
	testtools.Missing(t, "no IPv4 address other than loopback on this machine, for an edge that the environment's proxy applies to")
	return ""
}

// clearProxyEnv empties the proxy variables for the test.
func clearProxyEnv(t *testing.T) {
	for _, v := range []string{"HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"} {
		t.Setenv(v, "")
	}
}

// TestProxyFromEnvironment runs agents without Client.Proxy against an
// edge on a non-loopback address (the environment's proxy never applies to
// loopback): HTTPS_PROXY or ALL_PROXY sends the session through the proxy,
// NO_PROXY covering the edge sends it direct, and an explicit Proxy wins
// over the environment either way.
func TestProxyFromEnvironment(t *testing.T) {
	host := nonLoopback(t)
	tcpPorts := func(e *proxyEdge) []int { return []int{e.agentPort} }

	// The edge speaks plaintext, which an agent assumes only on loopback.
	through := func(t *testing.T, e *proxyEdge, c *agent.Client) {
		t.Helper()
		defer c.Close()
		c.Plaintext = true
		e.serveAll(t, c)
		peers, refused := e.agents.seen()
		if len(peers) != 1 || peers[0].Addr() != testproxy.Out || refused != 0 {
			t.Errorf("the edge's agent port saw %v (%d refused), want one session from the proxy's %v", peers, refused, testproxy.Out)
		}
	}
	t.Run("HTTPS_PROXY", func(t *testing.T) {
		clearProxyEnv(t)
		e := startProxyEdge(t, proxyEdgeConfig{host: host, onlyFrom: testproxy.Out})
		p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "agent", Password: "pr0xy-pass", ConnectPorts: tcpPorts(e)})
		t.Setenv("HTTPS_PROXY", p.URL.String())
		through(t, e, &agent.Client{Addrs: []string{e.agentAddr}})
	})
	t.Run("ALL_PROXY", func(t *testing.T) {
		clearProxyEnv(t)
		e := startProxyEdge(t, proxyEdgeConfig{host: host, onlyFrom: testproxy.Out})
		p := testproxy.Dante(t, testproxy.DanteConfig{})
		t.Setenv("ALL_PROXY", p.URL.String())
		through(t, e, &agent.Client{Addrs: []string{e.agentAddr}})
	})
	t.Run("explicit proxy wins over HTTPS_PROXY", func(t *testing.T) {
		clearProxyEnv(t)
		e := startProxyEdge(t, proxyEdgeConfig{host: host, onlyFrom: testproxy.Out})
		p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{ConnectPorts: tcpPorts(e)})
		t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1") // nobody there
		t.Setenv("NO_PROXY", host)                    // nor does this count
		through(t, e, &agent.Client{Addrs: []string{e.agentAddr}, Proxy: agent.ProxyURL(p.URL)})
	})

	direct := func(t *testing.T, c *agent.Client, p *testproxy.Proxy) {
		t.Helper()
		defer c.Close()
		e := startProxyEdge(t, proxyEdgeConfig{host: host})
		c.Addrs, c.Plaintext = []string{e.agentAddr}, true
		e.serveAll(t, c)
		peers, _ := e.agents.seen()
		if len(peers) != 1 || peers[0].Addr() == testproxy.Out {
			t.Errorf("the edge's agent port saw %v, want one session from the agent itself", peers)
		}
		if p != nil && strings.Contains(p.Log(), "Established connection") {
			t.Errorf("the proxy opened a tunnel:\n%s", p.Log())
		}
	}
	t.Run("NO_PROXY", func(t *testing.T) {
		clearProxyEnv(t)
		p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{})
		t.Setenv("HTTPS_PROXY", p.URL.String())
		t.Setenv("NO_PROXY", "example.com,"+host)
		direct(t, &agent.Client{}, p)
	})
	t.Run("ProxyURL(nil) wins over HTTPS_PROXY", func(t *testing.T) {
		clearProxyEnv(t)
		p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{})
		t.Setenv("HTTPS_PROXY", p.URL.String())
		direct(t, &agent.Client{Proxy: agent.ProxyURL(nil)}, p)
	})
}
