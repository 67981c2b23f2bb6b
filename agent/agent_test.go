package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// startEdge runs an edge whose router the test can query, and returns it
// with its agent address.
func startEdge(t *testing.T) (*edge.Server, *router.MemoryRouter, string) {
	t.Helper()
	rt := &router.MemoryRouter{}
	srv := &edge.Server{Domain: "example.test", Router: rt}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeAgents(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return srv, rt, ln.Addr().String()
}

// dialEndpoint opens a raw connection to the agent behind name, as the edge
// does for a public client at client.
func dialEndpoint(t *testing.T, srv *edge.Server, rt *router.MemoryRouter, name string, client netip.AddrPort) net.Conn {
	t.Helper()
	routes, _ := rt.Lookup(context.Background(), "http", name)
	if len(routes) == 0 {
		t.Fatalf("no route for %s", name)
	}
	c, err := srv.DialRoute(context.Background(), routes[0], edge.ConnInfo{Client: client, Host: name})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConnRemoteAddrAndHost(t *testing.T) {
	srv, rt, addr := startEdge(t)
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("[2001:db8::7]:40000")
	pc := dialEndpoint(t, srv, rt, "app.example.test", client)
	defer pc.Close()
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.RemoteAddr().String(); got != "[2001:db8::7]:40000" {
		t.Fatalf("RemoteAddr = %q", got)
	}
	ac := conn.(*agent.Conn)
	if ac.Host() != "app.example.test" || ac.Proto() != "http" {
		t.Fatalf("Host, Proto = %q, %q", ac.Host(), ac.Proto())
	}
	// The edge's stream reaches the agent before any client byte: a
	// server-speaks-first app can greet.
	io.WriteString(conn, "220 hello\r\n")
	buf := make([]byte, 11)
	if _, err := io.ReadFull(pc, buf); err != nil || string(buf) != "220 hello\r\n" {
		t.Fatalf("greeting: %q, %v", buf, err)
	}
}

func TestCloseEndsListeners(t *testing.T) {
	_, rt, addr := startEdge(t)
	c := &agent.Client{Addrs: []string{addr}}
	l1, err := c.Listen(context.Background(), "one")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := c.Listen(context.Background(), "two")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, l := range []net.Listener{l1, l2} {
		wg.Go(func() {
			if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Accept: %v, want net.ErrClosed", err)
			}
		})
	}
	c.Close()
	wg.Wait()
	c.Close() // idempotent
	l1.Close()
	for _, name := range []string{"one.example.test", "two.example.test"} {
		waitNoRoute(t, rt, name)
	}
	if _, err := c.Listen(context.Background(), "three"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Listen after Close: %v", err)
	}
}

func waitNoRoute(t *testing.T, rt *router.MemoryRouter, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		routes, _ := rt.Lookup(context.Background(), "http", name)
		if len(routes) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("route %s still there", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEdgeGoneListenerStaysUntilClose(t *testing.T) {
	srv, _, addr := startEdge(t)
	var events sync.Map
	c := &agent.Client{Addrs: []string{addr}, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		OnEvent: func(e agent.Event) { events.Store(e.Kind, true) }}
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	waitEvent := func(k agent.EventKind) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := events.Load(k); ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %v event", k)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitEvent(agent.Disconnected)
	waitEvent(agent.Reconnecting)
	accepted := make(chan error, 1)
	go func() { _, err := l.Accept(); accepted <- err }()
	select {
	case err := <-accepted:
		t.Fatalf("Accept returned %v while the client reconnects", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.Close()
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

func TestListenErrors(t *testing.T) {
	_, _, addr := startEdge(t)
	for _, ep := range []string{"tcp://x", "tls://a.example.test/path", "http://a/path?q", "http://user@a", "::::"} {
		if _, err := agent.Listen(context.Background(), addr, ep); err == nil {
			t.Errorf("Listen(%q) succeeded", ep)
		}
	}
	// Nothing listening: the agent waits for its edge, trying again, until
	// the setup's context ends; the error says why the attempts failed.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // time for an attempt on a busy machine
	_, err := agent.Listen(ctx, dead, "x")
	cancel()
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Listen to a closed port: %v, want ECONNREFUSED and context.DeadlineExceeded", err)
	}
	// A context that ends bounds the setup.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := agent.Listen(ctx, addr, "x"); err == nil {
		t.Error("Listen with a cancelled context succeeded")
	}
	// An edge that accepts TCP but never answers the hello.
	silent, _ := net.Listen("tcp", "127.0.0.1:0")
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := agent.Listen(ctx, silent.Addr().String(), "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Listen to a silent edge: %v, want context.DeadlineExceeded", err)
	}
}

// TestReconnectWhileStreamsWait: a public connection nobody accepts must
// not keep the client from noticing its session died and reconnecting.
func TestReconnectWhileStreamsWait(t *testing.T) {
	srv, rt, addr := startEdge(t)
	var conn atomic.Pointer[net.Conn]
	connected := make(chan struct{}, 4)
	c := &agent.Client{Addrs: []string{addr}, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Connected {
				connected <- struct{}{}
			}
		},
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			nc, err := (&net.Dialer{}).DialContext(ctx, network, a)
			if err == nil {
				conn.Store(&nc)
			}
			return nc, err
		}}
	defer c.Close()
	l, err := c.Listen(context.Background(), "app")
	if err != nil {
		t.Fatal(err)
	}
	<-connected
	pc := dialEndpoint(t, srv, rt, "app.example.test", netip.MustParseAddrPort("192.0.2.1:1"))
	defer pc.Close()
	pc.Write([]byte("x")) // a stream waits in deliver: nobody calls Accept
	(*conn.Load()).Close()
	select {
	case <-connected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection while a stream waited for Accept")
	}
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "app.example.test")
		return len(routes) == 1
	})
	_ = l
}
