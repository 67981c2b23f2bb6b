package agent_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// A draining edge of a cluster (one with an ID) asks its agents to move.
// The edges of these tests share no routes, so that a name moves to an
// edge where nobody holds it, or where another holds it.

// moveClient is a client of the edges at addrs, with its events.
func moveClient(t *testing.T, addrs ...string) (*agent.Client, events) {
	t.Helper()
	c, ev, _ := moveClientLogs(t, addrs...)
	return c, ev
}

// moveClientLogs is moveClient, with the client's logs.
func moveClientLogs(t *testing.T, addrs ...string) (*agent.Client, events, *testtools.Buffer) {
	t.Helper()
	ev := make(events, 1000)
	logs := new(testtools.Buffer)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the client's logs:\n%s", logs.String())
		}
	})
	return &agent.Client{Addrs: addrs, Logger: slog.New(slog.NewTextHandler(logs, nil)), OnEvent: ev.record,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, ev, logs
}

// startHTTPEdgeOn is startHTTPEdge with the agent listener given.
func startHTTPEdgeOn(t *testing.T, srv *edge.Server, agents net.Listener) *testEdge {
	t.Helper()
	if srv == nil {
		srv = &edge.Server{}
	}
	srv.Domain, srv.Router, srv.TicketKey = "example.test", &router.MemoryRouter{}, ticketKey
	public, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		agents.Close()
		t.Fatal(err)
	}
	_, srv.HTTPPort, _ = net.SplitHostPort(public.Addr().String())
	var wg sync.WaitGroup
	wg.Go(func() { srv.ServeAgents(agents) })
	wg.Go(func() { srv.ServeHTTPListener(public) })
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return &testEdge{srv: srv, agents: agents.Addr().String(), http: srv.HTTPPort}
}

// listenOn binds url on c, or fails the test.
func listenOn(t *testing.T, c *agent.Client, url string) *agent.Listener {
	t.Helper()
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// holdApp serves l: "/hold" answers once released, others at once.
func holdApp(t *testing.T, c *agent.Client, l net.Listener, arrived chan<- struct{}, release <-chan struct{}) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				arrived <- struct{}{}
				<-release
			}
			io.WriteString(w, "app "+r.URL.Path)
		}))
	}()
	t.Cleanup(func() { c.Close(); <-done })
}

// TestMoveOnDrain: the client's edge drains; the client opens a session to
// the next edge, binds both its endpoints there, says it moved, and the
// old edge's Drain ends. The listeners stay open, now under the new edge's
// port, and the client tells a Connected event, and no Disconnected one.
func TestMoveOnDrain(t *testing.T) {
	a, b := startHTTPEdge(t, &edge.Server{ID: "edge-a"}), startHTTPEdge(t, nil)
	c, ev := moveClient(t, a.agents, b.agents)
	l1, l2 := listenOn(t, c, "http://app"), listenOn(t, c, "http://two")
	serveEdgeApp(t, c, l1)
	serveEdgeApp(t, c, l2)
	if got := ev.nextConnected(t); got != a.agents {
		t.Fatalf("connected to %s, want %s", got, a.agents)
	}
	if err := a.srv.Drain(context.Background()); err != nil {
		t.Fatalf("Drain = %v", err)
	}
	movedTo(t, ev, b.agents)
	checkOn(t, l1, b)
	if body, err := getURL(t, l2.URL()+"/y"); urlPort(l2.URL()) != b.http || err != nil || body != "app /y" {
		t.Errorf("the second endpoint after the move: %s: %q %v", l2.URL(), body, err)
	}
}

// TestMoveRefusedStays: the next edge refuses the name (another identity
// holds it there): the client stays on its edge, whose requests keep
// reaching the app, and the listener does not fail; the edge ends the
// session once Timeouts.Move has passed, and the client then reconnects
// as after any end of a session.
func TestMoveRefusedStays(t *testing.T) {
	a, b := startHTTPEdge(t, &edge.Server{ID: "edge-a", Timeouts: edge.Timeouts{Move: -1}}), startHTTPEdge(t, nil)
	bob, _ := moveClient(t, b.agents)
	serveEdgeApp(t, bob, listenOn(t, bob, "http://app"))
	c, ev, logs := moveClientLogs(t, a.agents, b.agents)
	l := listenOn(t, c, "http://app")
	serveEdgeApp(t, c, l)
	ctx, cancel := context.WithCancel(context.Background())
	drained := make(chan error, 1)
	go func() { drained <- a.srv.Drain(ctx) }()
	// The move fails (bob holds the name on B); the endpoint still
	// answers through A.
	testwait.For(t, func() bool { return strings.Contains(logs.String(), "no other edge took the endpoints") })
	for len(ev) > 0 {
		if e := <-ev; e.Kind == agent.Connected && e.Addr == b.agents {
			t.Errorf("moved onto a name bob holds: %+v", e)
		}
	}
	if body, err := getURL(t, l.URL()+"/x"); urlPort(l.URL()) != a.http || err != nil || body != "app /x" {
		t.Errorf("through A while the move failed: %s: %q %v", l.URL(), body, err)
	}
	cancel()
	<-drained
}

// TestMovePartly: of two endpoints, one moves and the other is refused by
// the next edge; the refused one stays on the old session, whose request
// in flight finishes, and once the old edge ends the session it is bound
// again on the client's session (the name is free by then).
func TestMovePartly(t *testing.T) {
	a, b := startHTTPEdge(t, &edge.Server{ID: "edge-a"}), startHTTPEdge(t, nil)
	bob, _ := moveClient(t, b.agents)
	held := listenOn(t, bob, "http://taken")
	c, ev := moveClient(t, a.agents, b.agents)
	free, taken := listenOn(t, c, "http://free"), listenOn(t, c, "http://taken")
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	serveEdgeApp(t, c, free)
	holdApp(t, c, taken, arrived, release)
	if got := ev.nextConnected(t); got != a.agents {
		t.Fatalf("connected to %s, want %s", got, a.agents)
	}
	slow := make(chan string, 1)
	go func() {
		body, err := getURL(t, taken.URL()+"/hold")
		slow <- body + " " + errString(err)
	}()
	<-arrived
	drained := make(chan error, 1)
	go func() { drained <- a.srv.Drain(context.Background()) }()
	if got := ev.nextConnected(t); got != b.agents {
		t.Fatalf("moved to %s, want %s", got, b.agents)
	}
	checkOnNamed(t, free, b, "free")
	if urlPort(taken.URL()) != a.http {
		t.Errorf("the endpoint B refused moved: %s", taken.URL())
	}
	held.Close() // bob lets the name go
	close(release)
	if got := <-slow; got != "app /hold " {
		t.Errorf("the request in flight on the old session: %q", got)
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
	testwait.For(t, func() bool { return urlPort(taken.URL()) == b.http })
	if body, err := getURL(t, taken.URL()+"/z"); err != nil || body != "app /z" {
		t.Errorf("the endpoint left on the old session, bound again: %q %v", body, err)
	}
}

// checkOnNamed is checkOn for an endpoint named name.
func checkOnNamed(t *testing.T, l *agent.Listener, e *testEdge, name string) {
	t.Helper()
	testwait.For(t, func() bool { return urlPort(l.URL()) == e.http })
	if got := l.URL(); got != "http://"+name+".example.test:"+e.http {
		t.Fatalf("URL = %q, want the edge's HTTP port %s", got, e.http)
	}
	if body, err := getURL(t, l.URL()+"/x"); err != nil || body != "app /x" {
		t.Fatalf("GET through the edge on port %s: %q, %v", e.http, body, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestMoveNowhere: the client knows no other edge (the other is down): it
// stays, and once the draining edge ended the session it reconnects as
// usual, to the other edge once it is up, with its listener open all
// along.
func TestMoveNowhere(t *testing.T) {
	a := startHTTPEdge(t, &edge.Server{ID: "edge-a", Timeouts: edge.Timeouts{Move: time.Millisecond}})
	later := closedAddr(t)
	c, ev := moveClient(t, a.agents, later)
	l := listenOn(t, c, "http://app")
	serveEdgeApp(t, c, l)
	if err := a.srv.Drain(context.Background()); err != nil {
		t.Fatalf("Drain = %v", err)
	}
	ln, err := net.Listen("tcp", later)
	if err != nil {
		t.Skipf("the closed address was taken meanwhile: %v", err)
	}
	b := startHTTPEdgeOn(t, nil, ln)
	if got := ev.nextConnected(t); got != a.agents {
		t.Fatalf("first connected to %s", got)
	}
	if got := ev.nextConnected(t); got != b.agents {
		t.Fatalf("reconnected to %s, want %s", got, b.agents)
	}
	checkOn(t, l, b)
}

// TestMoveWhileClosing: the client is closed while its edge asks it to
// move: Close returns, the edge's Drain ends, and no goroutine is left.
func TestMoveWhileClosing(t *testing.T) {
	testwait.NoLeak(t, 5)
	a, b := startHTTPEdge(t, &edge.Server{ID: "edge-a"}), startHTTPEdge(t, nil)
	c, _ := moveClient(t, a.agents, b.agents)
	l := listenOn(t, c, "http://app")
	go http.Serve(l, http.NotFoundHandler())
	drained := make(chan error, 1)
	go func() { drained <- a.srv.Drain(context.Background()) }()
	c.Close()
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
}

// goAwayEdge is an edge that grants the hello, every bind and unbind, and
// once it answered a request of op after, opens n goaway streams asking
// the agent to move; it answers moved requests, counting them.
func goAwayEdge(t *testing.T, n int, after string) (addr string, moved *atomic.Int32) {
	t.Helper()
	moved = new(atomic.Int32)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = testnet.Serve(t, ln, func(c net.Conn) {
		defer c.Close()
		window, err := wire.ReadPreamble(c)
		if err != nil || wire.WritePreamble(c, wire.ClampWindow(int(window))) != nil {
			return
		}
		sess := muxado.Server(c, wire.MuxConfig(wire.ClampWindow(int(window))))
		defer sess.Close()
		for {
			st, err := sess.Accept()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				var typ [1]byte
				if _, err := io.ReadFull(st, typ[:]); err != nil || wire.StreamType(typ[0]) != wire.StreamControl {
					return
				}
				var req wire.Request
				if wire.ReadMessage(st, &req) != nil {
					return
				}
				var resp wire.Response
				switch req.Op {
				case wire.OpHello:
					resp.HelloResp = &wire.HelloResp{Version: wire.Version, SessionID: "s1"}
				case wire.OpBind:
					resp.BindResp = &wire.BindResp{TunnelID: "t1", URL: "http://app.example.test"}
				case wire.OpMoved:
					moved.Add(1)
				}
				if req.Op == after {
					defer func() {
						for range n {
							g, err := sess.Open()
							if err != nil {
								return
							}
							wire.WriteMessage(g, []byte{byte(wire.StreamGoAway)}, wire.GoAway{Message: "drain", Move: true})
							g.Close()
						}
					}()
				}
				wire.WriteMessage(st, nil, resp)
			}()
		}
	})
	return addr, moved
}

// TestMoveAskedOften: an edge that asks the agent to move 50 times on one
// session gets one attempt: one try of the other edge (which closes the
// connection, and is probed once to tell why), and the agent stays.
func TestMoveAskedOften(t *testing.T) {
	addr, _ := goAwayEdge(t, 50, wire.OpBind)
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	testnet.Serve(t, other, func(c net.Conn) { dials.Add(1); c.Close() })
	c, _, logs := moveClientLogs(t, addr, other.Addr().String())
	defer c.Close()
	listenOn(t, c, "http://app")
	testwait.For(t, func() bool { return strings.Count(logs.String(), "asks the agent to move") == 50 })
	testwait.For(t, func() bool { return strings.Contains(logs.String(), "no other edge took the endpoints") })
	if n, tries := dials.Load(), strings.Count(logs.String(), "moving to another edge failed"); tries != 1 || n > 2 {
		t.Errorf("asked to move 50 times, the agent tried the other edge %d times (%d connections), want once", tries, n)
	}
}

// TestMoveNothingSaysMoved: an agent asked to move with no endpoint on the
// session says at once that it moved.
func TestMoveNothingSaysMoved(t *testing.T) {
	addr, moved := goAwayEdge(t, 1, wire.OpUnbind)
	c, _ := moveClient(t, addr, closedAddr(t))
	defer c.Close()
	listenOn(t, c, "http://app").Close() // unbound: the goaway comes then
	testwait.For(t, func() bool { return moved.Load() == 1 })
}

// roundRobin is a TCP load balancer in front of backends: each connection
// goes to the next backend that takes it.
func roundRobin(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var next atomic.Int32
	return testnet.Serve(t, ln, func(c net.Conn) {
		defer c.Close()
		for range backends {
			b, err := net.Dial("tcp", backends[int(next.Add(1)-1)%len(backends)])
			if err != nil {
				continue
			}
			defer b.Close()
			go func() { io.Copy(b, c); b.(*net.TCPConn).CloseWrite() }()
			io.Copy(c, b)
			return
		}
	})
}

// TestMoveBehindOneAddress: the client knows one address, a load balancer
// in front of two edges; the edge it is on drains, and the same address
// takes it to the other edge, where its endpoint moves.
func TestMoveBehindOneAddress(t *testing.T) {
	a, b := startHTTPEdge(t, &edge.Server{ID: "edge-a"}), startHTTPEdge(t, nil)
	lb := roundRobin(t, a.agents, b.agents)
	c, ev := moveClient(t, lb)
	l := listenOn(t, c, "http://app")
	serveEdgeApp(t, c, l)
	ev.nextConnected(t)
	checkOn(t, l, a) // the first connection goes to A
	if err := a.srv.Drain(context.Background()); err != nil {
		t.Fatalf("Drain = %v", err)
	}
	movedTo(t, ev, lb)
	checkOn(t, l, b)
}

// movedTo reads the client's events until Connected, which must be to
// addr, with no end of a session before it: a move, not a reconnection.
func movedTo(t *testing.T, ev events, addr string) {
	t.Helper()
	for {
		select {
		case got := <-ev:
			switch got.Kind {
			case agent.Disconnected:
				t.Fatalf("the move told as an end of the session: %+v", got)
			case agent.Connected:
				if got.Addr != addr {
					t.Errorf("moved to %s, want %s", got.Addr, addr)
				}
				return
			}
		case <-time.After(20 * time.Second):
			t.Fatal("no Connected event within 20 s")
		}
	}
}
