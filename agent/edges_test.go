package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// ticketKey is shared by the edges of a test, as by the edges of a
// cluster: a ticket from one is good on the others.
var ticketKey = []byte("0123456789abcdef0123456789abcdef")

// testEdge is an edge on loopback with an agent port and a public HTTP
// port. Its router is its own: edges in these tests share no routes.
type testEdge struct {
	srv    *edge.Server
	agents string // the agent address
	http   string // the public HTTP port
}

// startHTTPEdge runs srv (a default one when nil) on an agent port and a
// public HTTP port.
func startHTTPEdge(t *testing.T, srv *edge.Server) *testEdge {
	t.Helper()
	if srv == nil {
		srv = &edge.Server{}
	}
	srv.Domain = "example.test"
	srv.Router = &router.MemoryRouter{} // no restart grace: names are granted at once
	srv.TicketKey = ticketKey
	agents, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	public, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		agents.Close()
		t.Fatal(err)
	}
	// Set before an agent can bind, rather than by ServeHTTPListener.
	_, port, _ := net.SplitHostPort(public.Addr().String())
	srv.HTTPPort = port
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(public) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &testEdge{srv: srv, agents: agents.Addr().String(), http: port}
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// events records a client's events in order.
type events chan agent.Event

func (ev events) record(e agent.Event) {
	select {
	case ev <- e:
	default: // the test stopped reading; never block the client
	}
}

// nextConnected returns the edge of the next Connected event.
func (ev events) nextConnected(t *testing.T) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e := <-ev:
			if e.Kind == agent.Connected {
				return e.Addr
			}
		case <-timeout:
			t.Fatal("no Connected event within 20 s")
		}
	}
}

// serveEdgeApp serves HTTP on l until the test ends: "app " and the path.
func serveEdgeApp(t *testing.T, c *agent.Client, l net.Listener) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "app "+r.URL.Path)
		}))
	}()
	t.Cleanup(func() { c.Close(); <-done })
}

// getURL fetches u with its host resolved to loopback, as a public client
// of the edge whose HTTP port u names.
func getURL(t *testing.T, u string) (string, error) {
	t.Helper()
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status + ": " + string(b))
	}
	return string(b), err
}

// checkOn checks that l's URL names e's HTTP port and that a request
// through that port reaches the app.
func checkOn(t *testing.T, l *agent.Listener, e *testEdge) {
	t.Helper()
	testwait.For(t, func() bool { return urlPort(l.URL()) == e.http })
	if got := l.URL(); got != "http://app.example.test:"+e.http {
		t.Fatalf("URL = %q, want the edge's HTTP port %s", got, e.http)
	}
	body, err := getURL(t, l.URL()+"/x")
	if err != nil || body != "app /x" {
		t.Fatalf("GET through the edge on port %s: %q, %v", e.http, body, err)
	}
}

func urlPort(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return ""
	}
	return pu.Port()
}

// TestEdgesFirstDead: the first edge, listed twice, is a closed port; the
// client goes on to the first edge that takes the session, and logs both.
func TestEdgesFirstDead(t *testing.T) {
	dead := closedAddr(t)
	e := startHTTPEdge(t, nil)
	var logs testtools.Buffer
	c := &agent.Client{Addrs: []string{dead, dead, e.agents}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	serveEdgeApp(t, c, l)
	checkOn(t, l, e)
	for _, want := range []string{
		`level=WARN msg="connecting to edge failed" edge=` + dead + ` err=`,
		`level=INFO msg="connected to edge" edge=` + e.agents + ` `,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in the logs:\n%s", want, logs.String())
		}
	}
	if n := strings.Count(logs.String(), "edge="+dead); n != 1 {
		t.Errorf("the dead edge, listed twice, was tried %d times, want once:\n%s", n, logs.String())
	}
}

// TestEdgesNoneAnswers: rounds over edges that all fail, until the
// setup's context ends, return an error naming each, which errors.Is sees
// through. The context lasts 2 s: both edges must have been tried within
// it on a busy machine.
func TestEdgesNoneAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a, b, _ := listenWithNoEdge(t, ctx, 50*time.Millisecond)
	for _, bad := range []*agent.Client{{}, {Addrs: []string{a + "," + b}}, {Addrs: []string{"", ""}}} {
		if _, err := bad.Listen(context.Background(), "app"); err == nil || errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("Client{Addrs: %q}: Listen: %v, want an error about the addresses", bad.Addrs, err)
		}
		bad.Close()
	}
}

// listenWithNoEdge listens, within ctx, through a client of two closed
// addresses, a and b, retrying at most maxBackoff apart; it checks that
// the error names both edges, ECONNREFUSED and context.DeadlineExceeded.
func listenWithNoEdge(t *testing.T, ctx context.Context, maxBackoff time.Duration) (a, b string, err error) {
	t.Helper()
	a, b = closedAddr(t), closedAddr(t)
	c := &agent.Client{Addrs: []string{a, b}, MinBackoff: 10 * time.Millisecond, MaxBackoff: maxBackoff}
	defer c.Close()
	_, err = c.Listen(ctx, "app")
	if err == nil {
		t.Fatal("Listen succeeded with no edge up")
	}
	if !strings.Contains(err.Error(), a+": ") || !strings.Contains(err.Error(), b+": ") || !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want both edges named, ECONNREFUSED and context.DeadlineExceeded", err)
	}
	return a, b, err
}

// lateContext is a context whose deadline passes before it says so: its
// Done closes later than its Deadline, as a context's timer may fire after
// a dial's own timer for the same deadline on a loaded machine.
type lateContext struct {
	context.Context // ends later
	deadline        time.Time
}

func (c lateContext) Deadline() (time.Time, bool) { return c.deadline, true }

// TestEdgesNoneAnswersAtTheDeadline: attempts that fail at the setup's
// deadline (a dial's i/o timeout), before the context says it ended, do
// not hide what the edges answered before it. The deadline is 1.5 s away,
// so that both edges were tried before it on a busy machine.
func TestEdgesNoneAnswersAtTheDeadline(t *testing.T) {
	later, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _, err := listenWithNoEdge(t, lateContext{later, time.Now().Add(1500 * time.Millisecond)}, 20*time.Millisecond)
	if strings.Contains(err.Error(), "i/o timeout") {
		t.Fatalf("err = %v: an attempt cut short by the deadline hides an edge's answer", err)
	}
}

// TestEdgesFailover: when the edge the client is on goes away, or only the
// client's connection to it, the client moves on to the next edge, wrapping
// around and skipping dead ones; its listener is bound there again and
// keeps accepting, under the URL the new edge answered.
func TestEdgesFailover(t *testing.T) {
	a, b, c := startHTTPEdge(t, nil), startHTTPEdge(t, nil), startHTTPEdge(t, nil)
	ev := make(events, 1000)
	var conns sync.Map // edge address -> the client's latest net.Conn to it
	var logs testtools.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the client's logs:\n%s", logs.String())
		}
	})
	cl := &agent.Client{Addrs: []string{a.agents, b.agents, c.agents}, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, OnEvent: ev.record,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				conns.Store(addr, nc)
			}
			return nc, err
		}}
	l, err := cl.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	serveEdgeApp(t, cl, l)
	if got := ev.nextConnected(t); got != a.agents {
		t.Fatalf("connected to %s, want the first edge %s", got, a.agents)
	}
	checkOn(t, l, a)

	a.srv.Close()
	if got := ev.nextConnected(t); got != b.agents {
		t.Fatalf("after the first edge closed, connected to %s, want the next %s", got, b.agents)
	}
	checkOn(t, l, b)

	// Only the client's connection drops: it still moves on.
	nc, _ := conns.Load(b.agents)
	nc.(net.Conn).Close()
	if got := ev.nextConnected(t); got != c.agents {
		t.Fatalf("after its connection to the second edge dropped, connected to %s, want the next %s", got, c.agents)
	}
	checkOn(t, l, c)

	// From the last edge, around to the first (closed), then the second.
	c.srv.Close()
	if got := ev.nextConnected(t); got != b.agents {
		t.Fatalf("after the last edge closed, connected to %s, want %s (the first is closed)", got, b.agents)
	}
	checkOn(t, l, b)
}

// TestEdgesAllDownBacksOff: with every edge down, the client goes on
// trying each in turn, with the backoff between rounds: no busy loop.
func TestEdgesAllDownBacksOff(t *testing.T) {
	t.Parallel()
	e := startHTTPEdge(t, nil)
	// Two edges that take the TCP connection and close it at once.
	var accepts [2]atomic.Int32
	var addrs [2]string
	first := make(chan int, 2)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		t.Cleanup(func() { ln.Close(); <-done })
		go func() {
			defer close(done)
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conn.Close()
				if accepts[i].Add(1) == 1 {
					first <- i
				}
			}
		}()
		addrs[i] = ln.Addr().String()
	}
	c := &agent.Client{Addrs: []string{e.agents, addrs[0], addrs[1]}, MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	defer c.Close()
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Close()
	for range addrs {
		select {
		case <-first:
		case <-time.After(20 * time.Second):
			t.Fatalf("not every edge was tried: %d and %d attempts", accepts[0].Load(), accepts[1].Load())
		}
	}
	before := accepts[0].Load() + accepts[1].Load()
	time.Sleep(time.Second)
	n := accepts[0].Load() + accepts[1].Load() - before
	t.Logf("%d attempts on the two refusing edges in 1 s", n)
	if n >= 50 {
		t.Fatalf("%d attempts in 1 s: no backoff between rounds", n)
	}
	accepted := make(chan error, 1)
	go func() { _, err := l.Accept(); accepted <- err }()
	c.Close()
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// TestEdgesTLSServerNamePerEdge: with a TLSConfig without ServerName, each
// edge's certificate is checked against the host of its own address.
func TestEdgesTLSServerNamePerEdge(t *testing.T) {
	ca := testpki.New(t)
	tlsEdge := func(name string) *testEdge {
		cert := ca.Issue(t, name)
		return startHTTPEdge(t, &edge.Server{AgentTLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	}
	byName, byIP := tlsEdge("localhost"), tlsEdge("127.0.0.1")
	_, port, _ := net.SplitHostPort(byName.agents)
	local := net.JoinHostPort("localhost", port)
	ev := make(events, 1000)
	c := &agent.Client{Addrs: []string{local, byIP.agents}, TLSConfig: &tls.Config{RootCAs: ca.Pool},
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, OnEvent: ev.record}
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	serveEdgeApp(t, c, l)
	if got := ev.nextConnected(t); got != local {
		t.Fatalf("connected to %s, want %s", got, local)
	}
	checkOn(t, l, byName)
	byName.srv.Close()
	if got := ev.nextConnected(t); got != byIP.agents {
		t.Fatalf("connected to %s, want %s", got, byIP.agents)
	}
	checkOn(t, l, byIP)
}
