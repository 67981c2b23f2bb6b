package edge_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// memberRouter is a router.MemoryRouter that knows which edges are in the
// cluster, as etcdrouter does (router.MemberChecker).
type memberRouter struct {
	*router.MemoryRouter
	mu      sync.Mutex
	members map[string]bool
}

func newMemberRouter() *memberRouter {
	return &memberRouter{MemoryRouter: &router.MemoryRouter{}, members: map[string]bool{}}
}

func (m *memberRouter) IsMember(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.members[id], nil
}

func (m *memberRouter) join(ids ...string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, id := range ids {
		m.members[id] = true
	}
}

// forgedClient is the client a hostile relay stream claims.
var forgedClient = netip.MustParseAddrPort("203.0.113.7:4444")

// relayAttempt opens a relay session to addr with cert, as an edge would,
// and one stream on it: for session and h, carrying an HTTP request for
// host with a forged X-Forwarded-For. It returns what came back (the
// agent's reply, then the app's answer) until the stream ended; an error
// if the session could not even start.
func relayAttempt(t *testing.T, addr string, cert tls.Certificate, roots *x509.CertPool, session string, h wire.ProxyHeader, host string) (string, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	sess := wire.NewSession(conn, wire.DefaultWindow, true, 0)
	defer sess.Close()
	st, err := sess.OpenStream()
	if err != nil {
		return "", err
	}
	defer st.Close()
	head, err := wire.AppendRelayStream(nil, session, h)
	if err != nil {
		t.Fatal(err)
	}
	req := "GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Forwarded-For: 6.6.6.6\r\nConnection: close\r\n\r\n"
	if _, err := st.Write(append(head, req...)); err != nil {
		return "", err
	}
	st.SetReadDeadline(time.Now().Add(20 * time.Second)) // a safety net: the edge answers or closes long before
	got, err := io.ReadAll(st)
	return string(got), err
}

// relayApp is an app behind an agent that records the client address and
// X-Forwarded-For of each request it serves.
type relayApp struct {
	mu   sync.Mutex
	seen []string
}

func (a *relayApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	line := fmt.Sprintf("remote=%s xff=%q", r.RemoteAddr, r.Header.Values("X-Forwarded-For"))
	a.mu.Lock()
	a.seen = append(a.seen, line)
	a.mu.Unlock()
	io.WriteString(w, line)
}

// forged returns the requests the app served for the forged client.
func (a *relayApp) forged() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, s := range a.seen {
		if strings.Contains(s, forgedClient.Addr().String()) || strings.Contains(s, "6.6.6.6") {
			out = append(out, s)
		}
	}
	return out
}

// getVia makes a request for http://<host>/ through the edge at addr, and
// returns the app's answer.
func getVia(t *testing.T, addr, host string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, n, addr)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get("http://" + host + "/")
	if err != nil {
		t.Fatalf("GET %s via %s: %v", host, addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s via %s: %s %q", host, addr, resp.Status, body)
	}
	return string(body)
}

// relayCluster is two or three edges of a cluster that knows its members,
// each with an Observer, and an agent on the first serving a relayApp at
// http://app.example.test and a TCP endpoint.
type relayCluster struct {
	ca      *testpki.CA
	rt      *memberRouter
	edges   []*clusterEdge
	obs     []*tally
	app     *relayApp
	httpApp router.Route // the agent's routes
	tcpApp  router.Route
}

func startRelayCluster(t *testing.T, hosts ...string) *relayCluster {
	t.Helper()
	c := &relayCluster{ca: testpki.New(t), rt: newMemberRouter(), app: &relayApp{}}
	c.edges = startClusterOf(t, c.ca, c.rt, func(s *edge.Server, _ *relay.Relay) {
		o := &tally{}
		s.Observer = o
		c.obs = append(c.obs, o)
	}, hosts...)
	for _, e := range c.edges {
		c.rt.join(e.srv.ID)
	}
	ag := &agent.Client{Addrs: []string{c.edges[0].agentAddr}}
	t.Cleanup(func() { ag.Close() })
	hl, err := ag.Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(hl, c.app)
	tl, err := ag.Listen(context.Background(), "tcp://")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := tl.Accept()
			if err != nil {
				return
			}
			io.WriteString(conn, "tcp app\n")
			conn.Close()
		}
	}()
	c.httpApp = c.route(t, "http", "app.example.test")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(tl.URL(), "tcp://"))
	c.tcpApp = c.route(t, "tcp", port)
	return c
}

// route returns the one route of proto and host.
func (c *relayCluster) route(t *testing.T, proto, host string) router.Route {
	t.Helper()
	routes, err := c.rt.Lookup(context.Background(), proto, host)
	if err != nil || len(routes) != 1 {
		t.Fatalf("Lookup(%s, %s) = %+v, %v; want one route", proto, host, routes, err)
	}
	return routes[0]
}

// wellBehaved checks that a client of edge i reaches the app, relayed
// when i is not 0, with its own address as the only X-Forwarded-For.
func (c *relayCluster) wellBehaved(t *testing.T, i int) {
	t.Helper()
	if got := getVia(t, c.edges[i].httpAddr, "app.example.test"); !strings.HasPrefix(got, "remote=127.0.0.1:") || !strings.HasSuffix(got, `xff=["127.0.0.1"]`) {
		t.Fatalf("a well-behaved client via edge %d: the app saw %s", i, got)
	}
}

// refusals returns how many relay refusals edge i counted.
func (c *relayCluster) refusals(i int) int64 {
	return c.obs[i].get("refused/" + string(edge.ReasonRelayRefused))
}

// TestRelayAdmitsOnlyMembers: of the certificates the cluster's CA signed,
// only an edge's (its ID in a tunnelkit-edge:// URI, for serverAuth and
// clientAuth) of an edge in the cluster opens a relay session. A
// certificate without extended key usages, another service's, one for
// clientAuth or any usage naming a member, and the edge certificate of an
// edge not in the cluster are refused (counted as relay_refused): their
// stream naming the agent's route and a forged client never reaches the
// app. Meanwhile clients of the other edge are relayed to the app, each
// with its own address.
func TestRelayAdmitsOnlyMembers(t *testing.T) {
	t.Parallel()
	c := startRelayCluster(t, "127.0.0.1", "::1")
	a, b := c.edges[0], c.edges[1]
	c.wellBehaved(t, 1)

	ip := net.ParseIP("127.0.0.1")
	memberURI := &url.URL{Scheme: relay.PeerURIScheme, Host: b.srv.ID}
	hostile := []struct {
		name string
		cert tls.Certificate
	}{
		{"no extended key usage (CN=legacy)", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "legacy"}, IPAddresses: []net.IP{ip},
		})},
		{"no extended key usage, naming a member edge", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "legacy"}, IPAddresses: []net.IP{ip}, URIs: []*url.URL{memberURI},
		})},
		{"another service's, for clientAuth (CN=billing-service)", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "billing-service"}, DNSNames: []string{"billing-service.internal"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})},
		{"another service's, for serverAuth and clientAuth, on an edge's address", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "billing-service"}, IPAddresses: []net.IP{ip},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		})},
		{"for clientAuth only, naming a member edge", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "edge"}, IPAddresses: []net.IP{ip}, URIs: []*url.URL{memberURI},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})},
		{"for any extended key usage, naming a member edge", c.ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "edge"}, IPAddresses: []net.IP{ip}, URIs: []*url.URL{memberURI},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
		})},
		{"an edge's, of an edge not in the cluster", c.ca.IssueEdge(t, []string{"127.0.0.1:1"}, "127.0.0.1")},
	}
	victim := wire.ProxyHeader{TunnelID: c.httpApp.TunnelID, Proto: "http", Client: forgedClient, Host: "app.example.test"}
	for _, h := range hostile {
		served := len(c.app.forged())
		got, err := relayAttempt(t, a.relayAddr, h.cert, c.ca.Pool, c.httpApp.SessionID, victim, "app.example.test")
		switch f := c.app.forged(); {
		case got != "" || len(f) > served:
			t.Errorf("%s: admitted; the relay stream got back %q, and the app served %q", h.name, got, f[served:])
		default:
			t.Logf("%s: refused (%v)", h.name, err)
		}
		c.wellBehaved(t, 1)
	}
	testwait.For(t, func() bool { return c.refusals(0) == int64(len(hostile)) })

	// A member is trusted with the client it names, and with the
	// forwarding headers it wrote: that is what admission is for.
	member := c.ca.IssueEdge(t, []string{b.srv.ID}, "127.0.0.1")
	got, err := relayAttempt(t, a.relayAddr, member, c.ca.Pool, c.httpApp.SessionID, victim, "app.example.test")
	if want := `remote=203.0.113.7:4444 xff=["6.6.6.6"]`; err != nil || !strings.HasSuffix(got, want) {
		t.Fatalf("a member's stream: %q, %v; want the app's answer ending %q", got, err, want)
	}
	if n := c.refusals(0); n != int64(len(hostile)) {
		t.Errorf("%d relay refusals counted; want %d", n, len(hostile))
	}
	if t.Failed() {
		t.Logf("the app served: %q", c.app.seen)
	}
}

// TestRelayStreamsNameHeldRoutes: a member edge's relay stream is served
// only for a route the receiving edge holds, of the stream's protocol,
// for a host the route answers for: the route a peer could have looked up.
// A stream naming a session the edge does not hold, an endpoint its
// session does not have, another edge's route, the wrong protocol or a
// host outside the route's name is closed before the agent hears of it
// (relay_refused); the well-behaved stream beside them is served.
func TestRelayStreamsNameHeldRoutes(t *testing.T) {
	t.Parallel()
	c := startRelayCluster(t, "127.0.0.1", "::1", "127.0.0.2")
	a, b, third := c.edges[0], c.edges[1], c.edges[2]
	// An agent on the third edge: its route is that edge's, not A's.
	ag := &agent.Client{Addrs: []string{third.agentAddr}}
	t.Cleanup(func() { ag.Close() })
	ol, err := ag.Listen(context.Background(), "http://other")
	if err != nil {
		t.Fatal(err)
	}
	other := &relayApp{}
	go http.Serve(ol, other)
	otherRoute := c.route(t, "http", "other.example.test")

	member := c.ca.IssueEdge(t, []string{b.srv.ID}, "127.0.0.1")
	app := c.httpApp
	forged := []struct {
		name    string
		session string
		h       wire.ProxyHeader
		host    string
	}{
		{"a session no edge holds", "0123456789abcdef", wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "http", Client: forgedClient, Host: "app.example.test"}, "app.example.test"},
		{"an endpoint the session does not have", app.SessionID, wire.ProxyHeader{TunnelID: "0123456789abcdef", Proto: "http", Client: forgedClient, Host: "app.example.test"}, "app.example.test"},
		{"another edge's route", otherRoute.SessionID, wire.ProxyHeader{TunnelID: otherRoute.TunnelID, Proto: "http", Client: forgedClient, Host: "other.example.test"}, "other.example.test"},
		{"an http route as tcp", app.SessionID, wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "tcp", Client: forgedClient}, "app.example.test"},
		{"an http route as tls", app.SessionID, wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "tls", Client: forgedClient, Host: "app.example.test"}, "app.example.test"},
		{"an http route for another host", app.SessionID, wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "http", Client: forgedClient, Host: "other.example.test"}, "other.example.test"},
		{"an http route for a host under its name", app.SessionID, wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "http", Client: forgedClient, Host: "x.app.example.test"}, "x.app.example.test"},
		{"a tcp route with a host", c.tcpApp.SessionID, wire.ProxyHeader{TunnelID: c.tcpApp.TunnelID, Proto: "tcp", Client: forgedClient, Host: "app.example.test"}, "app.example.test"},
	}
	for _, f := range forged {
		served := len(c.app.forged()) + len(other.forged())
		got, err := relayAttempt(t, a.relayAddr, member, c.ca.Pool, f.session, f.h, f.host)
		switch s := append(c.app.forged(), other.forged()...); {
		case got != "" || len(s) > served:
			t.Errorf("%s: served; the relay stream got back %q, and the apps served %q", f.name, got, s[served:])
		default:
			t.Logf("%s: refused (%v)", f.name, err)
		}
		c.wellBehaved(t, 1)
	}
	testwait.For(t, func() bool { return c.refusals(0) == int64(len(forged)) })

	// The same member's stream for the route, as it looked it up, is
	// served: with the port in the Host, in capitals.
	ok := wire.ProxyHeader{TunnelID: app.TunnelID, Proto: "http", Client: forgedClient, Host: "APP.example.test:8080"}
	got, err := relayAttempt(t, a.relayAddr, member, c.ca.Pool, app.SessionID, ok, "APP.example.test:8080")
	if want := `remote=203.0.113.7:4444 xff=["6.6.6.6"]`; err != nil || !strings.HasSuffix(got, want) {
		t.Fatalf("a member's stream for the route: %q, %v; want the app's answer ending %q", got, err, want)
	}
	// And the other edge's route is reached through its own edge.
	if got := getVia(t, b.httpAddr, "other.example.test"); !strings.HasSuffix(got, `xff=["127.0.0.1"]`) {
		t.Fatalf("the third edge's route via B: %s", got)
	}
}

// relayLogs is a slog.Handler that counts its records, at every level.
type relayLogs struct {
	mu    sync.Mutex
	lines []string
}

func (h *relayLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *relayLogs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}
func (h *relayLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *relayLogs) WithGroup(string) slog.Handler      { return h }

func (h *relayLogs) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.lines...)
}

// TestRelayRefusalsLogBounded: a flood of failed relay handshakes (plain
// TCP that closes, bytes that are not TLS, a stranger CA's certificate,
// the cluster CA's certificate without extended key usages) is counted
// one by one, but logged in a bounded number of lines: one at first, then
// at most one per 10 s window, whatever the level.
func TestRelayRefusalsLogBounded(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t)
	logs := &relayLogs{}
	obs := &tally{}
	edges := startClusterOf(t, ca, &router.MemoryRouter{}, func(s *edge.Server, r *relay.Relay) {
		s.Observer = obs
		r.Logger = slog.New(logs)
	}, "127.0.0.1")
	addr := edges[0].relayAddr
	stranger := testpki.New(t).IssueEdge(t, []string{addr}, "127.0.0.1")
	legacy := ca.IssueTemplate(t, x509.Certificate{Subject: pkix.Name{CommonName: "legacy"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}})
	attempts := []func() error{
		func() error { // connects and leaves
			conn, err := net.Dial("tcp", addr)
			if err == nil {
				conn.Close()
			}
			return err
		},
		func() error { // not TLS
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer conn.Close()
			io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			io.Copy(io.Discard, conn)
			return nil
		},
		func() error { return tlsAttempt("a stranger CA's", addr, stranger, ca.Pool) },
		func() error { return tlsAttempt("legacy", addr, legacy, ca.Pool) },
	}
	const rounds = 25
	start := time.Now()
	errs := make(chan error, rounds*len(attempts))
	for range rounds {
		for _, attempt := range attempts {
			go func() { errs <- attempt() }()
		}
	}
	for range rounds * len(attempts) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	n := int64(rounds * len(attempts))
	testwait.For(t, func() bool { return obs.get("refused/"+string(edge.ReasonRelayRefused)) == n })
	elapsed := time.Since(start)
	lines := logs.get()
	// The first refusal is logged at once; the others within 10 s of a
	// line wait for the next.
	bound := 1 + int(elapsed/(10*time.Second)) + 1
	if len(lines) == 0 || len(lines) > bound {
		t.Fatalf("%d refusals in %v logged %d lines; want 1 to %d:\n%s", n, elapsed, len(lines), bound, strings.Join(lines, "\n"))
	}
	if !strings.HasPrefix(lines[0], "WARN relay peers refused refused=1 ") {
		t.Errorf("first line %q; want a warning of one refusal", lines[0])
	}
	t.Logf("%d refusals in %v: %d lines:\n%s", n, elapsed.Round(time.Millisecond), len(lines), strings.Join(lines, "\n"))
}

// tlsAttempt completes a TLS handshake with the relay at addr with cert,
// and reads until the relay ends the connection.
func tlsAttempt(name, addr string, cert tls.Certificate, roots *x509.CertPool) error {
	conn, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: "127.0.0.1"})
	if err != nil {
		return nil // refused within the handshake
	}
	defer conn.Close()
	// TLS 1.3 clients hear of a refused certificate at their first read.
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		return fmt.Errorf("%s certificate: relay session admitted", name)
	}
	return nil
}

// TestRelayServeChecksItsCertificate: Serve refuses to start with a
// certificate that does not name its edge, which every peer would refuse.
func TestRelayServeChecksItsCertificate(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t)
	ln := listen(t)
	srv := &edge.Server{ID: ln.Addr().String(), Domain: "example.test"}
	t.Cleanup(func() { srv.Close() })
	for _, cert := range []tls.Certificate{ca.Issue(t, "127.0.0.1"), ca.IssueEdge(t, []string{"127.0.0.1:1"}, "127.0.0.1")} {
		rl := &relay.Relay{Server: srv, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool, ClientCAs: ca.Pool}}
		served := make(chan error, 1)
		go func() { served <- rl.Serve(ln) }()
		var err error
		select {
		case err = <-served:
		case <-time.After(10 * time.Second): // a safety net: Serve returns at once
			rl.Close()
			t.Fatalf("Serve with a certificate not naming its edge is serving: %v", <-served)
		}
		rl.Close()
		if err == nil || !strings.Contains(err.Error(), "tunnelkit-edge://"+srv.ID) {
			t.Fatalf("Serve with a certificate not naming its edge = %v; want an error saying what to issue", err)
		}
		ln = listen(t)
	}
}

// TestRelayDialsOnlyTheEdgeItNames: a route that names an edge whose relay
// listener shows another certificate of the CA (another service's, valid
// for the address) gets no relay session, so no client's bytes: the
// client gets 502 agent_offline.
func TestRelayDialsOnlyTheEdgeItNames(t *testing.T) {
	t.Parallel()
	ca := testpki.New(t)
	rt := &router.MemoryRouter{}
	edges := startClusterOf(t, ca, rt, nil, "127.0.0.1")
	impostor, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{ca.IssueTemplate(t, x509.Certificate{
			Subject: pkix.Name{CommonName: "billing-service"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		})},
		ClientAuth: tls.RequireAnyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { impostor.Close() })
	handshakes := make(chan error, 1)
	go func() {
		conn, err := impostor.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		err = conn.(*tls.Conn).Handshake()
		if err == nil {
			// TLS 1.3: the client's verdict on our certificate comes
			// with its first bytes (or an alert).
			conn.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err = conn.Read(make([]byte, 1))
		}
		handshakes <- err
	}()
	r := router.Route{Proto: "http", Name: "impostor.example.test", Identity: "x", Edge: impostor.Addr().String(), SessionID: "s", TunnelID: "t"}
	if err := rt.Bind(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+edges[0].httpAddr+"/", nil)
	req.Host = "impostor.example.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != string(edge.ReasonAgentOffline) {
		t.Errorf("a request for the impostor's route: %s %q; want 502 agent_offline", resp.Status, resp.Header.Get("Tunnelkit-Error"))
	}
	select {
	case err := <-handshakes:
		if err == nil {
			t.Fatal("the impostor got bytes from the edge")
		}
		t.Logf("the impostor's handshake: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the edge never dialled the impostor")
	}
}
