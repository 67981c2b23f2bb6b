package edge_test

// PROXY protocol headers are believed from the load balancers alone
// (Server.ProxyProtocolFrom): a client that reaches the edge directly
// cannot choose the address it appears to come from (issue #18).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/proxyproto"
)

// The peers of these tests: the load balancer, and a client that reaches
// the edge directly, both on loopback; and the address the client forges.
const (
	lbAddr     = "127.0.0.2"
	directAddr = "127.0.0.1"
	forgedAddr = "203.0.113.7:4000"
)

// untrustedHeaders is an edge.Observer that tallies everything and reports
// each ReasonProxyUntrusted refusal on a channel.
type untrustedHeaders struct {
	*tally
	refused chan struct{}
}

func (o untrustedHeaders) Refused(r edge.Reason) {
	o.tally.Refused(r)
	if r == edge.ReasonProxyUntrusted {
		o.refused <- struct{}{}
	}
}

// proxyLogs is a slog.Handler that sends the records of package proxyproto
// on a channel, at every level.
type proxyLogs chan slog.Record

func (h proxyLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h proxyLogs) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "proxyproto:") {
		h <- r
	}
	return nil
}
func (h proxyLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h proxyLogs) WithGroup(string) slog.Handler      { return h }

// next returns the next record, or fails the test if none comes within 10
// seconds.
func (h proxyLogs) next(t testing.TB, what string) slog.Record {
	t.Helper()
	select {
	case r := <-h:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing logged", what)
		return slog.Record{}
	}
}

// dialFrom connects to addr from the loopback address from.
func dialFrom(t testing.TB, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) // a bound for a failing test
	return c
}

// writeHeader writes a PROXY header of version v naming forgedAddr.
func writeHeader(t testing.TB, c net.Conn, v int) {
	t.Helper()
	if err := proxyproto.Write(c, v, netip.MustParseAddrPort(forgedAddr), netip.MustParseAddrPort("192.0.2.1:443")); err != nil {
		t.Fatal(err)
	}
}

// closedByEdge fails the test unless the edge closes c without a byte.
func closedByEdge(t testing.TB, c net.Conn, what string) {
	t.Helper()
	b := make([]byte, 512)
	n, err := c.Read(b)
	var ne net.Error
	if n != 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: read %q, %v; want the edge to close the connection", what, b[:n], err)
	}
}

// TestProxyHeaderBelievedFromLoadBalancersOnly: on the HTTP port, the TLS
// port and a TCP endpoint, the load balancer's header sets the client's
// address and the load balancer must send one; a direct client keeps its
// own address, and one that forges a header is closed on HTTP and TLS
// (counted as proxy_untrusted, logged at Debug) and passed through,
// header bytes and all, on TCP, where a server that speaks first is not
// kept waiting.
func TestProxyHeaderBelievedFromLoadBalancersOnly(t *testing.T) {
	t.Parallel()
	obs := untrustedHeaders{&tally{}, make(chan struct{}, 16)}
	logs := make(proxyLogs, 64)
	e := startProxiedEdge(t, &edge.Server{
		Domain:            "example.test",
		TCPPorts:          edge.PortRange{Min: 1024, Max: 65535},
		ProxyProtocolFrom: []netip.Prefix{netip.MustParsePrefix(lbAddr + "/32")},
		Observer:          obs,
		Logger:            slog.New(logs),
	})
	ac := &agent.Client{Addrs: []string{e.agentAddr}}
	t.Cleanup(func() { ac.Close() })
	// Each app says what address the edge gave its client.
	hl := bind(t, ac, "http://who")
	go http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s|%s", r.RemoteAddr, r.Header.Get("X-Forwarded-For"))
	}))
	tl := bind(t, ac, "tls://who.example.test")
	go acceptEach(tl, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		// Then read what the client sent (its ClientHello) until it
		// closes: an app that closes with bytes unread resets the
		// stream, as a socket does, and its line may be lost.
		io.Copy(io.Discard, c)
	})
	cl := bind(t, ac, "tcp://")
	go acceptEach(cl, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr()) // first, as SMTP or SSH servers do
		io.Copy(c, c)
	})
	tcpAddr := tcpAddrOf(t, cl.URL())

	// untrusted waits for the refusal and the Debug record of a forged
	// header.
	untrusted := func(t *testing.T, what string) {
		t.Helper()
		select {
		case <-obs.refused:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no proxy_untrusted refusal", what)
		}
		if r := logs.next(t, what); r.Level != slog.LevelDebug {
			t.Errorf("%s: logged %q at %v, want DEBUG only", what, r.Message, r.Level)
		}
	}
	httpGet := func(t *testing.T, c net.Conn) string {
		t.Helper()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: who.example.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	line := func(t *testing.T, c net.Conn) string {
		t.Helper()
		s, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("read %q, %v", s, err)
		}
		return strings.TrimSuffix(s, "\n")
	}
	hello := clientHelloFor(t, "who.example.test")

	t.Run("HTTP", func(t *testing.T) {
		for _, v := range []int{1, 2} {
			c := dialFrom(t, directAddr, e.httpAddr)
			writeHeader(t, c, v)
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: who.example.test\r\n\r\n")
			closedByEdge(t, c, fmt.Sprintf("direct client with a v%d header", v))
			untrusted(t, fmt.Sprintf("HTTP, v%d", v))
		}
		c := dialFrom(t, directAddr, e.httpAddr)
		if got, want := httpGet(t, c), c.LocalAddr().String()+"|"+directAddr; got != want {
			t.Errorf("direct client: the app saw %q, want %q", got, want)
		}
		c = dialFrom(t, lbAddr, e.httpAddr)
		writeHeader(t, c, 2)
		if got, want := httpGet(t, c), forgedAddr+"|203.0.113.7"; got != want {
			t.Errorf("through the load balancer: the app saw %q, want %q", got, want)
		}
		c = dialFrom(t, lbAddr, e.httpAddr)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: who.example.test\r\n\r\n")
		closedByEdge(t, c, "load balancer without a header")
		if r := logs.next(t, "HTTP load balancer without a header"); r.Level != slog.LevelWarn {
			t.Errorf("load balancer without a header: logged at %v, want WARN", r.Level)
		}
	})

	t.Run("TLS", func(t *testing.T) {
		c := dialFrom(t, directAddr, e.tlsAddr)
		writeHeader(t, c, 1)
		c.Write(hello)
		closedByEdge(t, c, "direct client with a header")
		untrusted(t, "TLS")
		c = dialFrom(t, directAddr, e.tlsAddr)
		c.Write(hello)
		if got := line(t, c); got != c.LocalAddr().String() {
			t.Errorf("direct client: the app saw %s, want %s", got, c.LocalAddr())
		}
		c = dialFrom(t, lbAddr, e.tlsAddr)
		writeHeader(t, c, 1)
		c.Write(hello)
		if got := line(t, c); got != forgedAddr {
			t.Errorf("through the load balancer: the app saw %s, want %s", got, forgedAddr)
		}
		c = dialFrom(t, lbAddr, e.tlsAddr)
		c.Write(hello)
		closedByEdge(t, c, "load balancer without a header")
		logs.next(t, "TLS load balancer without a header")
	})

	t.Run("TCP", func(t *testing.T) {
		// The app speaks first, before the client sends a byte.
		c := dialFrom(t, directAddr, tcpAddr)
		br := bufio.NewReader(c)
		if got, _ := br.ReadString('\n'); got != c.LocalAddr().String()+"\n" {
			t.Errorf("direct client: the app saw %q, want %s", got, c.LocalAddr())
		}
		writeHeader(t, c, 1)
		io.WriteString(c, "payload")
		c.(*net.TCPConn).CloseWrite()
		echo, _ := io.ReadAll(br)
		if want := "PROXY TCP4 203.0.113.7 192.0.2.1 4000 443\r\npayload"; string(echo) != want {
			t.Errorf("direct client's header: the app got %q, want it as bytes, %q", echo, want)
		}
		c = dialFrom(t, lbAddr, tcpAddr)
		writeHeader(t, c, 2)
		if got := line(t, c); got != forgedAddr {
			t.Errorf("through the load balancer: the app saw %s, want %s", got, forgedAddr)
		}
		c = dialFrom(t, lbAddr, tcpAddr)
		io.WriteString(c, "payload")
		closedByEdge(t, c, "load balancer without a header")
		logs.next(t, "TCP load balancer without a header")
	})

	if n := obs.get("refused/" + string(edge.ReasonProxyUntrusted)); n != 3 {
		t.Errorf("%d proxy_untrusted refusals, want 3 (two HTTP, one TLS)", n)
	}
}

// acceptEach runs handle on each conn of l, closing it afterwards, until l
// is closed.
func acceptEach(l net.Listener, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

func TestProxyProtocolFromInvalidPrefix(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", ProxyProtocolFrom: []netip.Prefix{{}}}
	err := srv.Start(edge.Listeners{HTTP: listen(t)})
	if err == nil || !strings.Contains(err.Error(), "ProxyProtocolFrom") {
		t.Fatalf("Start with an invalid prefix: %v, want an error naming ProxyProtocolFrom", err)
	}
}
