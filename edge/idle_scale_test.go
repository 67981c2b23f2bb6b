//go:build !race && unix

package edge_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2/frame"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// Idle agent sessions at scale (issue #22): an edge holding 100,000 of
// them over in-memory conns, and as many over loopback TCP as the
// process's file descriptors allow. Each session says hello (protocol
// version 3) and binds one HTTP endpoint, as an agent does; then nothing
// crosses it. The edge is real; each agent is a raw client that speaks the
// session's frames itself (muxado's frame package, wire's messages) and,
// once bound, keeps its conn and nothing else: no goroutine, no buffer. So
// the memory and the goroutines that the sessions add to this process are
// the edge's (but for the clients' conns, counted apart).
//
// They run without the race detector, which caps live goroutines at 8128
// (.ci/run runs the tests named Thousand that way), and not with -short.

// idleMaxBytes bounds an idle session's memory at the edge, heap and
// stacks: twice issue #22's goal of 20 KB, so that only a real regression
// fails the tests.
const idleMaxBytes = 40_000

// idleScaleServer is an edge for many idle sessions: no bound on the
// endpoints of one source (every client has the same address), heartbeats
// far apart, so that the edge writes nothing to the clients, which read
// nothing once bound, and an hour for a hello: on a busy machine, a
// session of the 100,000 waited more than the default 10 s for the edge
// to read its hello, and was closed.
func idleScaleServer() *edge.Server {
	return &edge.Server{
		Domain: "example.test",
		Limits: edge.Limits{EndpointsPerSource: -1, Endpoints: -1},
		Timeouts: edge.Timeouts{
			HeartbeatInterval: 24 * time.Hour,
			Handshake:         time.Hour,
		},
	}
}

// TestHundredThousandIdleSessions holds 100,000 idle sessions on one edge
// over net.Pipe conns.
func TestHundredThousandIdleSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 sessions: 4 GB of memory")
	}
	const n = 100_000
	start := time.Now()
	// The pipes first: they are the test's, not the edge's. The edge
	// accepts each as its client dials (a session that waits for its
	// preamble counts against Limits.PendingSessions).
	clients := make([]net.Conn, n)
	servers := make([]net.Conn, n)
	for i := range clients {
		clients[i], servers[i] = net.Pipe()
	}
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := idleScaleServer()
	served := make(chan struct{})
	before, g0 := memAfterGC()
	go func() { defer close(served); srv.ServeAgents(ln) }()
	t.Cleanup(func() { <-served })
	defer func() {
		// The clients go first: an edge session whose client reads
		// nothing would wait 250 ms to write its GOAWAY.
		for _, c := range clients {
			c.Close()
		}
		srv.Close()
	}()

	openIdleSessions(t, n, func(i int) (net.Conn, error) {
		select {
		case ln.conns <- servers[i]:
			return clients[i], nil
		case <-served:
			return nil, errors.New("the edge stopped accepting")
		}
	})
	opened := time.Since(start)
	after, g1 := memAfterGC()
	checkIdleSessions(t, "net.Pipe", n, before, after, g0, g1, 0)
	t.Logf("wall time: %v to open the sessions, %v in all", opened.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// TestThousandsOfIdleSessionsOverTCP holds as many idle sessions on one
// edge as this process's file descriptors allow (two each: the client's
// end and the edge's), over loopback TCP.
func TestThousandsOfIdleSessionsOverTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of sessions")
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	// Room for what is open already, the listeners, and the Go runtime.
	n := (int(min(lim.Cur, 1<<20)) - openFiles() - 100) / 2
	if n < 100 {
		t.Skipf("%d file descriptors: too few for the test", lim.Cur)
	}
	conn := loopbackConnHeap(t)

	start := time.Now()
	ln := listen(t)
	srv := idleScaleServer()
	served := make(chan struct{})
	before, g0 := memAfterGC()
	go func() { defer close(served); srv.ServeAgents(ln) }()
	t.Cleanup(func() { <-served })
	clients := make([]net.Conn, n)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
		srv.Close()
	}()
	openIdleSessions(t, n, func(i int) (net.Conn, error) {
		c, err := net.Dial("tcp", ln.Addr().String())
		clients[i] = c
		return c, err
	})
	opened := time.Since(start)
	after, g1 := memAfterGC()
	checkIdleSessions(t, "loopback TCP", n, before, after, g0, g1, conn)
	t.Logf("file descriptors: %d; wall time: %v to open the sessions", lim.Cur, opened.Round(time.Millisecond))
}

// TestTenThousandIdleSessionsOverTLS holds 10,000 idle sessions of real
// agent.Clients, over loopback TLS, from a process of their own (so that
// all this process gains is the edge's), each with one endpoint, as the
// scale harness's agents (examples/bench/scale) do on a cluster: the
// per-session figure of docs/cluster.md's Scaling out, measured here with
// TLS and the agents' own keepalive (PING frames, which the edge answers
// without a timer or a goroutine of the session's). It fails past 2
// goroutines a session (muxado's reader and writer) or idleMaxBytes.
func TestTenThousandIdleSessionsOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 sessions")
	}
	const n = 10_000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < n+1000 {
		t.Skipf("%d file descriptors: too few for %d sessions", lim.Cur, n)
	}
	srv := &edge.Server{
		Domain: "example.test",
		// Every agent is anonymous, from 127.0.0.1.
		Limits: edge.Limits{EndpointsPerSource: -1, PendingSessionsPerSource: -1, PendingSessions: -1},
	}
	start := time.Now()
	d := measureIdleSessions(t, srv, n, true)
	bytes := (d.heapAlloc + d.stackInuse) / n
	t.Logf("%d idle sessions over TLS: %.0f B each at the edge (heap %.0f + stacks %.0f), %.3f goroutines each; %v in all",
		n, bytes, d.heapAlloc/n, d.stackInuse/n, d.goroutines/n, time.Since(start).Round(time.Millisecond))
	if d.goroutines > 2*n+100 {
		t.Errorf("%.0f goroutines for %d sessions: more than 2 each", d.goroutines, n)
	}
	if bytes > idleMaxBytes {
		t.Errorf("%.0f B per idle session, over %d", bytes, idleMaxBytes)
	}
}

// checkIdleSessions logs what n sessions added to the process, the client
// conns' heap (clientConn bytes each) aside, and fails when a session
// takes more than 2 goroutines (muxado's reader and writer: no goroutine
// waits to accept a stream), or idleMaxBytes, or when an edge
// goroutine waits to write to a client (which reads nothing).
func checkIdleSessions(t *testing.T, link string, n int, before, after runtime.MemStats, g0, g1 int, clientConn float64) {
	t.Helper()
	heap := (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / float64(n)
	heap -= clientConn
	stack := (float64(after.StackInuse) - float64(before.StackInuse)) / float64(n)
	goroutines := float64(g1-g0) / float64(n)
	t.Logf("%d idle sessions over %s: %.0f B each at the edge (heap %.0f + stacks %.0f), %.3f goroutines each; the process: heap %d MiB, stacks %d MiB",
		n, link, heap+stack, heap, stack, goroutines, after.HeapAlloc>>20, after.StackInuse>>20)
	if g1-g0 > 2*n+100 {
		t.Errorf("%d goroutines for %d sessions: more than 2 each", g1-g0, n)
	}
	if heap+stack > idleMaxBytes {
		t.Errorf("%.0f B per idle session, over %d", heap+stack, idleMaxBytes)
	}
	var dump bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&dump, 1)
	if w := strings.Count(dump.String(), "net.(*pipe).write"); w > 0 {
		t.Errorf("%d goroutine stacks write to a client's pipe: the edge sent something on an idle session", w)
	}
}

// openIdleSessions opens n sessions, 64 at a time, each on the conn
// dial(i) returns, and checks that each got its URL.
func openIdleSessions(t testing.TB, n int, dial func(i int) (net.Conn, error)) {
	t.Helper()
	var (
		next     atomic.Int64
		bound    atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	for range 64 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				c, err := dial(i)
				if err == nil {
					err = idleAgent(c, i)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("session %d: %w", i, err) })
					return
				}
				bound.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	if got := bound.Load(); got != int64(n) {
		t.Fatalf("%d sessions bound, want %d", got, n)
	}
}

// idleAgent opens a session on c as an agent does: the preamble, a hello
// on stream 1, a bind of http://idle<i> on stream 3, each answered, and
// both streams closed both ways. It checks the endpoint's URL. Then it
// leaves c as it is: nothing more is read from it, or written.
func idleAgent(c net.Conn, i int) error {
	c.SetDeadline(time.Now().Add(time.Minute))
	defer c.SetDeadline(time.Time{})
	if err := wire.WritePreamble(c, wire.DefaultWindow); err != nil {
		return err
	}
	if _, err := wire.ReadPreamble(c); err != nil {
		return err
	}
	fr := frame.NewFramer(c, c)
	var resp wire.Response
	hello := wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Agent: "idle-scale-test"}}
	if err := idleCall(fr, 1, hello, &resp); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	if resp.Error != nil || resp.HelloResp == nil || resp.HelloResp.Version != wire.Version {
		return fmt.Errorf("hello answered %+v", resp)
	}
	resp = wire.Response{}
	bind := wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: fmt.Sprintf("idle%d", i)}}
	if err := idleCall(fr, 3, bind, &resp); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if resp.Error != nil || resp.BindResp == nil {
		return fmt.Errorf("bind answered %+v", resp)
	}
	if want := fmt.Sprintf("http://idle%d.example.test", i); resp.BindResp.URL != want && !strings.HasPrefix(resp.BindResp.URL, want+":") {
		return fmt.Errorf("bound %q, want %q (and the edge's HTTP port, if it has one)", resp.BindResp.URL, want)
	}
	return nil
}

// idleCall sends req on a new stream id, in one DATA frame that opens the
// stream, reads the answer into resp until the edge closes its half, then
// closes its own (an empty DATA frame with FIN), as an agent's call does.
// (A first frame with both SYN and FIN would not do: muxado v2.0.2 then
// takes the stream as closed for writing at the accepting end too.)
func idleCall(fr frame.Framer, id frame.StreamId, req wire.Request, resp *wire.Response) error {
	var msg bytes.Buffer
	if err := wire.WriteMessage(&msg, []byte{byte(wire.StreamControl)}, req); err != nil {
		return err
	}
	var d frame.Data
	if err := d.Pack(id, msg.Bytes(), false, true); err != nil {
		return err
	}
	if err := fr.WriteFrame(&d); err != nil {
		return err
	}
	var got bytes.Buffer
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *frame.Data:
			if f.StreamId() != id {
				if _, err := io.Copy(io.Discard, f.Reader()); err != nil {
					return err
				}
				continue
			}
			if _, err := io.Copy(&got, f.Reader()); err != nil {
				return err
			}
			if f.Fin() {
				if err := d.Pack(id, nil, true, false); err != nil {
					return err
				}
				if err := fr.WriteFrame(&d); err != nil {
					return err
				}
				return wire.ReadMessage(&got, resp)
			}
		case *frame.Rst:
			if f.StreamId() == id {
				return fmt.Errorf("stream reset, code %d", f.ErrorCode())
			}
		case *frame.GoAway:
			return errors.New("the edge sent GOAWAY")
		case *frame.Unknown:
			if _, err := io.Copy(io.Discard, f.PayloadReader()); err != nil {
				return err
			}
		}
	}
}

// pipeListener hands the edge the conns sent on conns until it is closed.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// loopbackConnHeap returns the heap of one end of an idle loopback TCP
// conn: half of what a pair takes, measured over 500 pairs.
func loopbackConnHeap(t *testing.T) float64 {
	const pairs = 500
	ln := listen(t)
	defer ln.Close()
	conns := make([]net.Conn, 0, 2*pairs)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	before, _ := memAfterGC()
	for range pairs {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c, s)
	}
	after, _ := memAfterGC()
	return (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / (2 * pairs)
}

// openFiles returns how many file descriptors the process has open, or 0
// where /proc does not tell.
func openFiles() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(fds)
}
