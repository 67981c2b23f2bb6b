package edge_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// clusterKey is the ticket key the edges of a cluster share.
var clusterKey = []byte("the ticket key of a test cluster.")

// slowApp answers "/" at once and "/slow" once released, telling when a
// slow request arrived.
type slowApp struct {
	arrived chan struct{} // one value per slow request
	release chan struct{}
}

func newSlowApp() *slowApp {
	return &slowApp{arrived: make(chan struct{}, 16), release: make(chan struct{})}
}

func (a *slowApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/slow" {
		a.arrived <- struct{}{}
		<-a.release
		io.WriteString(w, "slow done")
		return
	}
	io.WriteString(w, "ok")
}

// getThrough sends GET path for host to the edge's HTTP address with client,
// and returns the status and body, or the error.
func getThrough(client *http.Client, addr, host, path string) (int, string, error) {
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// trafficLoad sends requests for host through addr from n clients until stop is
// closed, and counts those that got 200 "ok" and the others, with the
// first failure.
type trafficLoad struct {
	ok, failed atomic.Int64
	first      atomic.Pointer[string]
	stop       chan struct{}
	wg         sync.WaitGroup
}

func startLoad(addr, host string, n int) *trafficLoad {
	l := &trafficLoad{stop: make(chan struct{})}
	for range n {
		l.wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			defer client.CloseIdleConnections()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				code, body, err := getThrough(client, addr, host, "/")
				if err == nil && code == 200 && body == "ok" {
					l.ok.Add(1)
					continue
				}
				l.failed.Add(1)
				why := fmt.Sprintf("%d %q %v", code, body, err)
				l.first.CompareAndSwap(nil, &why)
			}
		})
	}
	return l
}

// end stops the load and reports any failure.
func (l *trafficLoad) end(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	if n := l.failed.Load(); n > 0 {
		t.Errorf("%d of %d requests failed; the first: %s", n, n+l.ok.Load(), *l.first.Load())
	}
}

// TestDrainMovesAgents: two edges of a cluster; an agent on edge A, which
// drains while clients of edge B send requests, and a request through A
// is in flight. A stops taking agents at once and reports itself
// draining; the agent moves to B and binds its name there, which takes
// the route over from A in one step; the request in flight finishes over
// A's session, and only then does Drain return. Not one request fails.
func TestDrainMovesAgents(t *testing.T) {
	t.Parallel()
	// The edges of a cluster share their ticket key: the agent's session
	// ticket from A shows B that the endpoints are its own.
	edges := startClusterOf(t, testpki.New(t), &router.MemoryRouter{}, func(s *edge.Server, _ *relay.Relay) {
		s.TicketKey = clusterKey
	}, "127.0.0.1", "127.0.0.1")
	a, b := edges[0], edges[1]
	connected := make(chan string, 8)
	c := &agent.Client{Addrs: []string{a.agentAddr, b.agentAddr}, OnEvent: func(e agent.Event) {
		if e.Kind == agent.Connected {
			connected <- e.Addr
		}
	}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-connected; got != a.agentAddr {
		t.Fatalf("connected to %s, want edge A's %s", got, a.agentAddr)
	}
	app := newSlowApp()
	go http.Serve(l, app)
	const host = "app.example.test"

	ld := startLoad(b.httpAddr, host, 4)
	testwait.Within(t, 10*time.Second, "requests through B reach the agent on A", func() bool { return ld.ok.Load() > 0 })
	slow := make(chan string, 1)
	go func() {
		code, body, err := getThrough(&http.Client{}, a.httpAddr, host, "/slow")
		slow <- fmt.Sprintf("%d %s %v", code, body, err)
	}()
	<-app.arrived

	if a.srv.Draining() {
		t.Fatal("Draining before Drain")
	}
	// Drain has 30 s to finish what is in flight: the relayed requests of
	// B's clients, whose connections to the agent's session on A (idle
	// after the move) B closes once the route moved.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- a.srv.Drain(ctx) }()
	if got := <-connected; got != b.agentAddr {
		t.Fatalf("the agent moved to %s, want edge B's %s", got, b.agentAddr)
	}
	if !a.srv.Draining() {
		t.Error("edge A does not report itself draining")
	}
	if conn, err := net.Dial("tcp", a.agentAddr); err == nil {
		conn.Close()
		t.Error("edge A still takes agent connections while draining")
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with a request in flight", err)
	default:
	}
	close(app.release)
	if got := <-slow; got != "200 slow done <nil>" {
		t.Errorf("the request in flight through A: %s, want 200 slow done", got)
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
	// Served from B alone now, under B's port.
	before := ld.ok.Load()
	testwait.Within(t, 10*time.Second, "requests through B after A stopped", func() bool { return ld.ok.Load() > before+100 })
	ld.end(t)
	if _, port, _ := net.SplitHostPort(b.httpAddr); l.URL() != "http://"+host+":"+port {
		t.Errorf("the listener's URL is %s, want B's", l.URL())
	}
	if err := a.srv.Drain(context.Background()); !errors.Is(err, edge.ErrServerClosed) {
		t.Errorf("Drain again = %v, want ErrServerClosed", err)
	}
}

// TestDrainLoneEdge: an edge without a cluster drains by finishing what
// is in flight: it stops taking agents, reports itself draining (and
// tells its watchers), asks no agent to move, and returns once the
// request in flight is answered.
func TestDrainLoneEdge(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	events := make(chan view.Event, 64)
	stop := te.srv.Watch(func(e view.Event) {
		if e.Kind == view.Drain {
			events <- e
		}
	})
	defer stop()
	app := newSlowApp()
	te.serveApp(t, "app", app)
	slow := make(chan string, 1)
	go func() {
		code, body, err := getThrough(&http.Client{}, te.httpAddr, "app.example.test", "/slow")
		slow <- fmt.Sprintf("%d %s %v", code, body, err)
	}()
	<-app.arrived
	drained := make(chan error, 1)
	go func() { drained <- te.srv.Drain(context.Background()) }()
	testwait.Within(t, 10*time.Second, "the edge reports itself draining", te.srv.Draining)
	<-events // a control plane hears of it
	testwait.Within(t, 10*time.Second, "the agent port closes", func() bool {
		conn, err := net.Dial("tcp", te.agentAddr)
		if err == nil {
			conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with a request in flight", err)
	default:
	}
	close(app.release)
	if got := <-slow; got != "200 slow done <nil>" {
		t.Errorf("the request in flight: %s, want 200 slow done", got)
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
}

// rawDrainAgent is a hand-written agent of a given protocol version, with
// the goaway messages the edge sends it.
type rawDrainAgent struct {
	*rawAgent
	goaways chan wire.GoAway
}

// dialRawVersion opens a session to addr and says hello with version, or
// fails the test; the goaway streams the edge opens are read into
// goaways.
func dialRawVersion(t *testing.T, addr string, version int) *rawDrainAgent {
	t.Helper()
	a := &rawDrainAgent{rawAgent: &rawAgent{t, rawSession(t, addr)}, goaways: make(chan wire.GoAway, 4)}
	go answerStreams(a.s, func(st muxado.Stream, typ wire.StreamType) {
		var g wire.GoAway
		if typ == wire.StreamGoAway && wire.ReadMessage(st, &g) == nil {
			a.goaways <- g
		}
	})
	resp := a.call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: version}})
	if resp.HelloResp == nil || resp.HelloResp.Version != version {
		t.Fatalf("hello of version %d: %+v, %+v", version, resp.HelloResp, resp.Error)
	}
	return a
}

// TestDrainAsksOnlyNewAgentsToMove: in a cluster, Drain asks agents of
// version 4 to move and waits for them to say they did, and does not wait
// for those of version 3, which it asks nothing (they ignore the field
// anyway). Meanwhile it refuses binds and hellos as unavailable, and a
// hello that came before the drain gets no session either.
func TestDrainAsksOnlyNewAgentsToMove(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", ID: "edge-a", Timeouts: edge.Timeouts{Move: -1}} // wait for as long as it takes
	te := edgeOn(t, srv, listen(t), listen(t))
	old := dialRawVersion(t, te.agentAddr, wire.MoveVersion-1)
	cur := dialRawVersion(t, te.agentAddr, wire.MoveVersion)
	idle := dialRawVersion(t, te.agentAddr, wire.MoveVersion) // no endpoint: nothing to wait for
	for i, a := range []*rawDrainAgent{old, cur} {
		if resp := a.bind(fmt.Sprint("app", i), ""); resp.BindResp == nil {
			t.Fatalf("bind: %+v", resp.Error)
		}
	}
	late := &rawAgent{t, rawSession(t, te.agentAddr)} // connected, no hello yet

	drained := make(chan error, 1)
	go func() { drained <- srv.Drain(context.Background()) }()
	if g := <-old.goaways; g.Move {
		t.Errorf("a version %d agent was asked to move: %+v", wire.MoveVersion-1, g)
	}
	for _, a := range []*rawDrainAgent{cur, idle} {
		if g := <-a.goaways; !g.Move {
			t.Errorf("a version %d agent was not asked to move: %+v", wire.MoveVersion, g)
		}
	}
	for _, a := range []*rawAgent{old.rawAgent, cur.rawAgent} {
		if resp := a.bind("more", ""); resp.Error == nil || resp.Error.Code != wire.CodeUnavailable {
			t.Errorf("a bind while draining: %+v, %+v; want unavailable", resp.BindResp, resp.Error)
		}
	}
	if resp := late.call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version}}); resp.Error == nil || resp.Error.Code != wire.CodeUnavailable {
		t.Errorf("a hello while draining: %+v, %+v; want unavailable", resp.HelloResp, resp.Error)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) before the version 4 agent said it moved", err)
	default:
	}
	if resp := cur.call(wire.Request{Op: wire.OpMoved}); resp.Error != nil {
		t.Fatalf("moved: %+v", resp.Error)
	}
	if err := <-drained; err != nil {
		t.Errorf("Drain = %v", err)
	}
}

// TestDrainWaitsForMovesAtMostMove: an agent asked to move that never says
// it did holds Drain for Timeouts.Move, and no longer; then its session
// is closed, its name kept for it.
func TestDrainWaitsForMovesAtMostMove(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Domain: "example.test", ID: "edge-a", Timeouts: edge.Timeouts{Move: time.Millisecond}}
	te := edgeOn(t, srv, listen(t), listen(t))
	a := dialRawVersion(t, te.agentAddr, wire.MoveVersion)
	if resp := a.bind("stays", ""); resp.BindResp == nil {
		t.Fatalf("bind: %+v", resp.Error)
	}
	if err := srv.Drain(context.Background()); err != nil {
		t.Errorf("Drain = %v", err)
	}
	if g := <-a.goaways; !g.Move {
		t.Errorf("not asked to move: %+v", g)
	}
}

// TestMovedBeforeHelloRefused: the moved request is for sessions that said
// hello, like any but the hello.
func TestMovedBeforeHelloRefused(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	a := &rawAgent{t, rawSession(t, te.agentAddr)}
	if resp := a.call(wire.Request{Op: wire.OpMoved}); resp.Error == nil || resp.Error.Code != wire.CodeBadRequest {
		t.Errorf("moved before hello: %+v", resp)
	}
}

// TestDrainPacesItsMoves: Drain has at most its window of agents moving at
// once (SetMovesInFlight; 256 by default): it asks the next agent once one
// of those asked said it moved, so that a drain of thousands does not send
// them all to the other edges at once. Once Timeouts.Move has passed, it
// asks the rest at once.
func TestDrainPacesItsMoves(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		move time.Duration
	}{{"every agent moves", -1}, {"none moves, Move passes", 300 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &edge.Server{Domain: "example.test", ID: "edge-a", Timeouts: edge.Timeouts{Move: tc.move}}
			edge.SetMovesInFlight(srv, 2)
			te := edgeOn(t, srv, listen(t), listen(t))
			const n = 5
			agents := make([]*rawDrainAgent, n)
			asked := make(chan int, n)
			for i := range agents {
				agents[i] = dialRawVersion(t, te.agentAddr, wire.MoveVersion)
				if resp := agents[i].bind(fmt.Sprint("app", i), ""); resp.BindResp == nil {
					t.Fatalf("bind: %+v", resp.Error)
				}
				go func() {
					if g := <-agents[i].goaways; g.Move {
						asked <- i
					}
				}()
			}
			drained := make(chan error, 1)
			go func() { drained <- srv.Drain(context.Background()) }()
			next := func() int {
				select {
				case i := <-asked:
					return i
				case <-time.After(time.Minute):
					t.Fatal("no agent asked to move within a minute")
					return -1
				}
			}
			if tc.move > 0 {
				// Nobody moves: two asked, and once Move passed, the rest.
				for range n {
					next()
				}
				if err := <-drained; err != nil {
					t.Errorf("Drain = %v", err)
				}
				return
			}
			moving := []int{next(), next()}
			for done := 0; done < n; done++ {
				select {
				case i := <-asked:
					t.Fatalf("agent %d asked to move while %v were moving, past the window of 2", i, moving)
				case <-time.After(100 * time.Millisecond):
				}
				// The first of those moving says it moved: the next is asked.
				if resp := agents[moving[0]].call(wire.Request{Op: wire.OpMoved}); resp.Error != nil {
					t.Fatalf("moved: %+v", resp.Error)
				}
				moving = moving[1:]
				if done+2 < n {
					moving = append(moving, next())
				}
			}
			if err := <-drained; err != nil {
				t.Errorf("Drain = %v", err)
			}
		})
	}
}
