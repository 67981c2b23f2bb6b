package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// l4Edge is an edge with SNI and TCP endpoints on loopback.
type l4Edge struct {
	srv       *edge.Server
	router    *router.MemoryRouter
	agentAddr string
	tlsAddr   string
}

func startL4Edge(t testing.TB) *l4Edge {
	t.Helper()
	rt := &router.MemoryRouter{}
	// Agents with the same token are one identity, and may share a pool.
	agents, pub := listen(t), listen(t)
	_, tlsPort, _ := net.SplitHostPort(pub.Addr().String())
	srv := &edge.Server{Domain: "example.test", TLSPort: tlsPort, TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Router: rt, Authenticate: identityIsToken}
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeSNI(pub) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &l4Edge{srv: srv, router: rt, agentAddr: agents.Addr().String(), tlsAddr: pub.Addr().String()}
}

// serveTLSApp binds url with its own agent and serves TLS with cert on the
// listener: the app terminates TLS and answers each line with name + line.
func (e *l4Edge) serveTLSApp(t testing.TB, url, name string, cert tls.Certificate) *agent.Client {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 256)
				n, _ := conn.Read(buf)
				fmt.Fprintf(conn, "%s: %s", name, buf[:n])
			}()
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return c
}

// tlsRoundTrip dials the edge's TLS port as serverName, verifying the
// certificate against pool, and returns the app's answer to "ping".
func tlsRoundTrip(addr, serverName string, pool *x509.CertPool) (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{ServerName: serverName, RootCAs: pool})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "ping"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(conn)
	return string(b), err
}

func TestTLSBySNIThroughTunnel(t *testing.T) {
	t.Parallel()
	pki := testpki.New(t)
	e := startL4Edge(t)
	e.serveTLSApp(t, "tls://app.example.test", "app", pki.Issue(t, "app.example.test"))
	e.serveTLSApp(t, "tls://other.example.test", "other", pki.Issue(t, "other.example.test"))
	e.serveTLSApp(t, "tls://*.wild.example.test", "wild", pki.Issue(t, "*.wild.example.test"))

	for _, c := range []struct{ name, want string }{
		{"app.example.test", "app: ping"},
		{"other.example.test", "other: ping"},
		{"x.wild.example.test", "wild: ping"},
		{"APP.example.test", "app: ping"},
	} {
		got, err := tlsRoundTrip(e.tlsAddr, c.name, pki.Pool)
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	// A name nobody bound: the edge closes the connection.
	if _, err := tlsRoundTrip(e.tlsAddr, "nobody.example.test", pki.Pool); err == nil {
		t.Error("unknown name: handshake succeeded")
	}
	// Not TLS: closed at once, without waiting for a timeout.
	conn, err := net.Dial("tcp", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\n")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := conn.Read(make([]byte, 10)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("not-TLS conn: read %d, %v; want closed at once", n, err)
	}
}

func TestTLSWithOpenSSL(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl not installed")
	}
	pki := testpki.New(t)
	e := startL4Edge(t)
	e.serveTLSApp(t, "tls://app.example.test", "app", pki.Issue(t, "app.example.test"))
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pki.PEM, 0o600)
	cmd := exec.Command("openssl", "s_client", "-connect", e.tlsAddr, "-servername", "app.example.test",
		"-CAfile", ca, "-verify_return_error", "-verify_hostname", "app.example.test", "-quiet")
	cmd.Stdin = strings.NewReader("ping")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("openssl s_client: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "app: ping") {
		t.Fatalf("openssl s_client got %q", out)
	}
}

// startEchoUpstream runs a TCP server on loopback that echoes every byte
// until EOF, then closes its write half.
func startEchoUpstream(t testing.TB) string {
	t.Helper()
	return testnet.Serve(t, listen(t), func(c net.Conn) {
		io.Copy(c, c)
		c.(*net.TCPConn).CloseWrite()
	})
}

// forwardTCP binds a TCP endpoint with its own agent, forwarding to to.
func (e *l4Edge) forwardTCP(t testing.TB, ep agent.Endpoint, to string, proxyProto int) (*agent.Listener, *agent.Client) {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	l, err := c.ListenEndpoint(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		forward.Bytes{To: to, ProxyProtocol: proxyProto}.Serve(l)
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return l, c
}

// identityIsToken accepts every agent, with its token as its identity:
// agents with the same token (none, say) are one tenant.
func identityIsToken(_ context.Context, token string) (string, error) { return "token:" + token, nil }

// freePort returns a TCP port free on loopback now (testtools.FreePort).
func freePort(t testing.TB) string {
	t.Helper()
	p, err := testtools.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(p)
}

func tcpAddrOf(t testing.TB, url string) string {
	t.Helper()
	rest, ok := strings.CutPrefix(url, "tcp://")
	if !ok {
		t.Fatalf("URL %q is not tcp://", url)
	}
	return rest
}

// TestTCPEchoHalfClose: 16 MiB through a TCP endpoint to an echo app and
// back, and the client's half-close after them, arrive whole and in
// order. The bytes are many times what the windows and socket buffers on
// the way hold (a few MiB): the half-close waits behind bytes in flight.
func TestTCPEchoHalfClose(t *testing.T) {
	t.Parallel()
	const size = int64(16 << 20)
	e := startL4Edge(t)
	l, _ := e.forwardTCP(t, agent.Endpoint{URL: "tcp://"}, startEchoUpstream(t), 0)
	conn, err := net.Dial("tcp", tcpAddrOf(t, l.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	want := sha256.New()
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, io.TeeReader(pattern(size), want))
		if err == nil {
			err = conn.(*net.TCPConn).CloseWrite()
		}
		sent <- err
	}()
	got := sha256.New()
	n, err := io.Copy(got, conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("echoed %d of %d bytes; same bytes in order: %v", n, size, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
}

func TestTCPEndpointLifetime(t *testing.T) {
	t.Parallel()
	e := startL4Edge(t)
	port := freePort(t)
	l, c := e.forwardTCP(t, agent.Endpoint{URL: "tcp://:" + port}, startEchoUpstream(t), 0)
	if l.URL() != "tcp://127.0.0.1:"+port {
		t.Fatalf("URL = %q", l.URL())
	}
	// Taken by another agent, outside the range, in use.
	other := &agent.Client{Addrs: []string{e.agentAddr}}
	defer other.Close()
	if _, err := other.Listen(context.Background(), "tcp://:"+port); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("second bind without pool: %v, want ErrNameTaken", err)
	}
	if _, err := other.Listen(context.Background(), "tcp://:80"); err == nil {
		t.Error("port outside the range was granted")
	}
	// The edge stops listening when the binding ends.
	c.Close()
	testwait.For(t, func() bool {
		conn, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
}

// TestPoolSpreadAndFailover binds one TCP port from three agents; new
// connections spread over all three; one agent dies abruptly (its TCP
// connection to the edge is cut, and it never comes back) while clients
// keep connecting, and once the edge has noticed, no new connection fails.
func TestPoolSpreadAndFailover(t *testing.T) {
	t.Parallel()
	e := startL4Edge(t)
	type member struct {
		c    *agent.Client
		conn net.Conn // the agent's connection to the edge
		dead atomic.Bool
		hits atomic.Int32
	}
	members := make([]*member, 3)
	var url string
	port := freePort(t)
	for i := range members {
		m := &member{}
		members[i] = m
		m.c = &agent.Client{Addrs: []string{e.agentAddr}, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if m.dead.Load() {
				return nil, errors.New("this agent is gone")
			}
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			m.conn = c
			return c, err
		}}
		l, err := m.c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "tcp://:" + port, Pool: true})
		if err != nil {
			t.Fatal(err)
		}
		url = l.URL()
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				m.hits.Add(1)
				fmt.Fprintf(conn, "member %d\n", i)
				conn.Close()
			}
		}()
		t.Cleanup(func() { m.c.Close() })
	}
	addr := tcpAddrOf(t, url)
	dial := func() (string, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(conn)
		if err == nil && len(b) == 0 {
			err = errors.New("closed without an answer")
		}
		return string(b), err
	}
	for range 30 {
		if _, err := dial(); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range members {
		if m.hits.Load() != 10 {
			t.Errorf("member %d got %d of 30 connections, want 10", i, m.hits.Load())
		}
	}

	// Clients keep connecting while member 1 dies.
	stop := make(chan struct{})
	var during sync.WaitGroup
	var served atomic.Int32
	for range 4 {
		during.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := dial(); err == nil {
					served.Add(1)
				}
			}
		})
	}
	members[1].dead.Store(true)
	members[1].conn.Close()
	testwait.For(t, func() bool {
		routes, _ := e.router.Lookup(context.Background(), "tcp", port)
		return len(routes) == 2
	})
	close(stop)
	during.Wait()
	t.Logf("%d connections served while member 1 died", served.Load())

	before := members[1].hits.Load()
	for range 60 {
		got, err := dial()
		if err != nil {
			t.Fatalf("after member 1 was gone: %v", err)
		}
		if got == "member 1\n" {
			t.Fatal("a connection reached the dead member")
		}
	}
	if members[1].hits.Load() != before {
		t.Fatal("the dead member accepted connections")
	}
	if members[0].hits.Load() == 10 || members[2].hits.Load() == 10 {
		t.Errorf("the survivors did not share the load: %d, %d", members[0].hits.Load(), members[2].hits.Load())
	}
}

// proxyProtoUpstream reads a PROXY header from each conn and answers with
// the source it names, then echoes the rest.
func proxyProtoUpstream(t testing.TB) string {
	t.Helper()
	return testnet.Serve(t, listen(t), func(c net.Conn) {
		br := bufio.NewReader(c)
		h, err := proxyproto.Read(br)
		if err != nil {
			fmt.Fprintf(c, "no header: %v\n", err)
			return
		}
		fmt.Fprintf(c, "v%d from %s\n", h.Version, h.Source)
		io.Copy(c, br)
	})
}

func TestProxyProtocolToUpstream(t *testing.T) {
	t.Parallel()
	e := startL4Edge(t)
	up := proxyProtoUpstream(t)
	for _, v := range []int{1, 2} {
		l, _ := e.forwardTCP(t, agent.Endpoint{URL: "tcp://"}, up, v)
		conn, err := net.Dial("tcp", tcpAddrOf(t, l.URL()))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "payload after the header")
		conn.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(conn)
		conn.Close()
		want := fmt.Sprintf("v%d from %s\npayload after the header", v, conn.LocalAddr())
		if err != nil || string(got) != want {
			t.Errorf("PROXY v%d: upstream answered %q, %v; want %q", v, got, err, want)
		}
	}
}

// TestProxyProtocolFromLoadBalancer puts a load balancer's PROXY header in
// front of the edge's public listeners: the client address it names is the
// one the agent and the upstream see.
func TestProxyProtocolFromLoadBalancer(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	srv := &edge.Server{Domain: "example.test", TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Router: rt, ProxyProtocolFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	agents, pubHTTP := listen(t), listen(t)
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(pubHTTP) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	e := &l4Edge{srv: srv, router: rt, agentAddr: agents.Addr().String()}

	lbClient := netip.MustParseAddrPort("203.0.113.9:5555")
	l, _ := e.forwardTCP(t, agent.Endpoint{URL: "tcp://"}, proxyProtoUpstream(t), 2)
	conn, err := net.Dial("tcp", tcpAddrOf(t, l.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	proxyproto.Write(conn, 1, lbClient, netip.MustParseAddrPort("192.0.2.1:20000"))
	conn.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(conn)
	if want := "v2 from 203.0.113.9:5555\n"; string(got) != want {
		t.Fatalf("upstream saw %q, want %q", got, want)
	}

	// Without a header, the edge closes the connection.
	conn2, err := net.Dial("tcp", tcpAddrOf(t, l.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	io.WriteString(conn2, "GET / HTTP/1.1\r\n\r\n")
	conn2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(conn2); len(b) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("conn without a PROXY header: read %q, %v", b, err)
	}

	// HTTP: the header's client is the one in X-Forwarded-For.
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	hl, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s", r.RemoteAddr, r.Header.Get("X-Forwarded-For"))
	}))
	hc, err := net.Dial("tcp", pubHTTP.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	proxyproto.Write(hc, 2, lbClient, netip.MustParseAddrPort("192.0.2.1:80"))
	io.WriteString(hc, "GET / HTTP/1.1\r\nHost: app.example.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(hc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "203.0.113.9:5555|203.0.113.9" {
		t.Fatalf("app saw %q", body)
	}
}

func TestNotTLSFallback(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", NotTLS: func(c net.Conn) {
		defer c.Close()
		line, _ := bufio.NewReader(c).ReadString('\n')
		fmt.Fprintf(c, "fallback got %q", line)
	}}
	pub := listen(t)
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeSNI(pub) }()
	t.Cleanup(func() { srv.Close(); <-done })
	c, err := net.Dial("tcp", pub.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET / HTTP/1.1\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if want := `fallback got "GET / HTTP/1.1\r\n"`; string(b) != want {
		t.Fatalf("got %q, %v; want %q", b, err, want)
	}
}

// TestHTTPPool spreads new client connections over the agents of one HTTP
// name, and fails over when one is gone.
func TestHTTPPool(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", Authenticate: identityIsToken}, listen(t), listen(t))
	var clients []*agent.Client
	for i := range 2 {
		c := &agent.Client{Addrs: []string{te.agentAddr}}
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pool", Pool: true})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		go http.Serve(l, nameHandler(fmt.Sprint("member", i)))
		t.Cleanup(func() { c.Close() })
	}
	fresh := func() string {
		// A new client connection each time: the edge keeps one stream per
		// client connection, so spreading is per connection.
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
		}}}
		resp, err := c.Get(te.url("pool") + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d %q", resp.StatusCode, b)
		}
		return string(b)
	}
	seen := map[string]int{}
	for range 10 {
		seen[fresh()]++
	}
	if seen["member0 /"] != 5 || seen["member1 /"] != 5 {
		t.Fatalf("spread %v, want 5 each", seen)
	}
	clients[0].Close()
	for range 6 {
		if got := fresh(); got != "member1 /" {
			t.Fatalf("after member0 left: %q", got)
		}
	}
}
