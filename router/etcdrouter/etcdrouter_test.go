package etcdrouter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter/etcdtest"
	"github.com/tunnelkit/tunnelkit/router/routertest"
)

// TestRouterContract checks Router against the contract of router.Router,
// each router on a prefix of its own.
func TestRouterContract(t *testing.T) {
	routertest.Run(t, func(t *testing.T) router.Router { return newRouter(t, Config{}) })
}

// change is a route bound or unbound, as WatchRoutes tells it.
type change struct {
	route router.Route
	bound bool
}

// TestTwoEdges checks that two edges share one name space: what one binds,
// the other looks up (with the Edge of the first, and every field the
// route carries, AppProtocol and VerboseErrors included), watches, and
// cannot take.
func TestTwoEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"}) // through sockets
	changes := make(chan change, 16)
	stop := b.WatchRoutes(func(rt router.Route, bound bool) { changes <- change{rt, bound} })
	defer stop()
	expectChange := func(want change) {
		t.Helper()
		select {
		case got := <-changes:
			if got != want {
				t.Fatalf("WatchRoutes on edge-b: got %+v; want %+v", got, want)
			}
		case <-time.After(callTimeout):
			t.Fatalf("WatchRoutes on edge-b: no change after %v; want %+v", callTimeout, want)
		}
	}

	rt := router.Route{Proto: "http", Name: "App.Example.Test", Identity: "alice", SessionID: "s1", TunnelID: "t1", Pool: true, AppProtocol: "h2c", VerboseErrors: true}
	bind(t, a, rt)
	rt.Name = "app.example.test"
	want := at(rt, "edge-a")
	if !sees(t, a, "http", "app.example.test", want)() {
		t.Fatalf("edge-a: Lookup right after Bind = %+v; want %+v", lookup(t, a, "http", "app.example.test"), want)
	}
	testwait.Within(t, callTimeout, "edge-b sees the route bound through edge-a", sees(t, b, "http", "app.example.test", want))
	expectChange(change{want, true})

	// The name is alice's on either edge.
	bob := router.Route{Proto: "tls", Name: "x.app.example.test", Identity: "bob", SessionID: "s2", TunnelID: "t2"}
	if err := tryBind(b, bob); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-b: Bind of a name under alice's, bound through edge-a = %v; want ErrNameTaken", err)
	}
	// Alice's pool grows through edge-b.
	rb := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s3", TunnelID: "t3", Pool: true}
	bind(t, b, rb)
	expectChange(change{at(rb, "edge-b"), true})
	testwait.Within(t, callTimeout, "edge-a sees the pool of both edges", func() bool { return len(lookup(t, a, "http", "app.example.test")) == 2 })

	unbind(t, a, rt, 0)
	expectChange(change{want, false})
	testwait.Within(t, callTimeout, "edge-b sees the route of edge-a gone", sees(t, b, "http", "app.example.test", at(rb, "edge-b")))

	// A reservation made through edge-b holds on edge-a.
	unbind(t, b, rb, time.Minute)
	expectChange(change{at(rb, "edge-b"), false})
	if err := tryBind(a, bob); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-a: Bind of a name under alice's reservation made through edge-b = %v; want ErrNameTaken", err)
	}
	// edge-a's cache hears of edge-b's unbind through its watch.
	testwait.Within(t, callTimeout, "edge-a's Lookup of the reserved name finds nothing", func() bool { return len(lookup(t, a, "http", "app.example.test")) == 0 })

	// A route of another edge is not bound through this one.
	if err := tryBind(a, at(bob, "edge-b")); err == nil || errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("edge-a: Bind of a route with Edge edge-b = %v; want an error, not ErrNameTaken", err)
	}
}

// TestRaceAcrossEdges binds conflicting names of two identities through two
// edges at once, 100 times: exactly one wins each time, and both edges
// agree on it.
func TestRaceAcrossEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"}) // through sockets
	for i := range 100 {
		n := fmt.Sprintf("r%d.example.test", i)
		ra := router.Route{Proto: "http", Name: n, Identity: "alice", SessionID: "sa", TunnelID: fmt.Sprint(i)}
		rb := router.Route{Proto: "http", Name: n, Identity: "bob", SessionID: "sb", TunnelID: fmt.Sprint(i)}
		switch i % 3 {
		case 1: // one namespace for host names
			rb.Proto = "tls"
		case 2: // a name owns its tree
			ra.Name = "*." + n
			rb.Name = "x." + n
		}
		var errA, errB error
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() { <-start; errA = tryBind(a, ra) })
		wg.Go(func() { <-start; errB = tryBind(b, rb) })
		close(start)
		wg.Wait()
		for _, err := range []error{errA, errB} {
			if err != nil && !errors.Is(err, router.ErrNameTaken) {
				t.Fatalf("round %d: Bind = %v; want success or ErrNameTaken", i, err)
			}
		}
		if (errA == nil) == (errB == nil) {
			t.Fatalf("round %d: alice's Bind through edge-a = %v, bob's through edge-b = %v; want exactly one to succeed", i, errA, errB)
		}
		win, winEdge, winRouter := ra, "edge-a", a
		if errB == nil {
			win, winEdge, winRouter = rb, "edge-b", b
		}
		host := strings.TrimPrefix(win.Name, "*.")
		if strings.HasPrefix(win.Name, "*.") {
			host = "x." + host
		}
		if !sees(t, winRouter, win.Proto, host, at(win, winEdge))() {
			t.Fatalf("round %d: the winner's edge does not see its route", i)
		}
		for _, r := range []*Router{a, b} {
			testwait.Within(t, callTimeout, fmt.Sprintf("round %d: %s sees the winner's route", i, r.edge), sees(t, r, win.Proto, host, at(win, winEdge)))
		}
	}
}

// TestDeadEdge kills an edge without revoking its lease: its routes vanish
// from the other edge's lookups once the lease's TTL passed, and the
// reservations it made stay until they lapse.
func TestDeadEdge(t *testing.T) {
	prefix := uniquePrefix(t)
	cliA := newClient(t, sharedEndpoint)
	a := newRouter(t, Config{Client: cliA, Prefix: prefix, Edge: "edge-a", TTL: 2 * time.Second})
	b := newRouter(t, Config{Prefix: prefix, Edge: "edge-b"})

	live := router.Route{Proto: "http", Name: "live.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	res := router.Route{Proto: "tcp", Name: "20001", Identity: "alice", SessionID: "s1", TunnelID: "t2"}
	bind(t, a, live)
	bind(t, a, res)
	const reserve = 6 * time.Second
	unbind(t, a, res, reserve)
	testwait.Within(t, callTimeout, "edge-b sees edge-a's route", sees(t, b, "http", "live.example.test", at(live, "edge-a")))

	cliA.Close() // as kill -9 would: no revocation, no more keep-alives
	killed := time.Now()
	testwait.Within(t, 20*time.Second, "edge-b rid of the routes of edge-a, whose lease expired", sees(t, b, "http", "live.example.test"))
	t.Logf("edge-a's routes vanished %v after it died (TTL 2s, etcd's minimum)", time.Since(killed).Round(time.Millisecond))

	bobRes := router.Route{Proto: "tcp", Name: "20001", Identity: "bob", SessionID: "s2", TunnelID: "t3"}
	if err := tryBind(b, bobRes); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("Bind of a port reserved for %v by a dead edge = %v; want ErrNameTaken until the reservation lapses", reserve, err)
	}
	testwait.Within(t, 20*time.Second, "the reservation of the dead edge lapsed", func() bool { return tryBind(b, bobRes) == nil })
	if err := tryBind(b, router.Route{Proto: "http", Name: "live.example.test", Identity: "bob", SessionID: "s2", TunnelID: "t4"}); err != nil {
		t.Fatalf("Bind of the name of a dead edge's route = %v", err)
	}
}

// TestOutage stops etcd for a while: lookups go on from the caches, Binds
// fail when their ctx ends, and afterwards both edges bind and agree again.
func TestOutage(t *testing.T) {
	// Started first, etcd stops last (after the Routers, which revoke
	// their leases, and the clients).
	e := etcdtest.Start(t)
	endpoint := e.Endpoint
	a := newRouter(t, Config{Client: newClient(t, endpoint), Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, endpoint), Prefix: a.prefix, Edge: "edge-b"})

	r1 := router.Route{Proto: "http", Name: "one.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	bind(t, a, r1)
	testwait.Within(t, callTimeout, "edge-b sees edge-a's route", sees(t, b, "http", "one.example.test", at(r1, "edge-a")))

	// Close refuses new calls at once, but waits for the streams (the
	// Routers' watches and keep-alives) up to its request timeout (7s)
	// before it cuts them.
	probe := newClient(t, endpoint)
	stopped := make(chan struct{})
	go func() { e.Stop(); close(stopped) }()
	testwait.Within(t, callTimeout, "etcd refuses calls", func() bool {
		// Time enough for an etcd still up to answer on a busy machine:
		// a probe that timed out would not tell that it went down.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := probe.Get(ctx, "probe")
		return err != nil
	})
	// While etcd is down, Binds and Unbinds fail when their ctx ends, and
	// lookups answer from the caches all along.
	r2 := router.Route{Proto: "http", Name: "two.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t2"}
	r3 := router.Route{Proto: "tls", Name: "three.example.test", Identity: "bob", SessionID: "s3", TunnelID: "t3"}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	took := make([]time.Duration, 3)
	calls := []func(ctx context.Context) error{
		func(ctx context.Context) error { return a.Bind(ctx, r2) },
		func(ctx context.Context) error { return b.Bind(ctx, r3) },
		func(ctx context.Context) error { return b.Unbind(ctx, r3, 0) },
	}
	for i, call := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			errs[i] = call(ctx)
			took[i] = time.Since(start)
		})
	}
	done := make(chan struct{})
	go func(done chan struct{}) { wg.Wait(); close(done) }(done)
	lookups := 0
	for done != nil || stopped != nil {
		select {
		case <-done:
			done = nil
		case <-stopped:
			stopped = nil
		case <-time.After(20 * time.Millisecond):
		}
		lookups++
		for _, r := range []*Router{a, b} {
			if !sees(t, r, "http", "one.example.test", at(r1, "edge-a"))() {
				t.Fatalf("etcd down: %s's Lookup = %+v; want the route from its cache", r.edge, lookup(t, r, "http", "one.example.test"))
			}
		}
	}
	for i, err := range errs {
		if err == nil || errors.Is(err, router.ErrNameTaken) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("etcd down: call %d = %v; want an error wrapping context.DeadlineExceeded, not ErrNameTaken", i, err)
		}
		t.Logf("etcd down: call %d failed after %v (ctx 2s): %v", i, took[i].Round(time.Millisecond), err)
	}
	t.Logf("etcd down: %d rounds of lookups on both edges answered from their caches until it stopped", lookups)

	t0 := time.Now()
	e.Restart(t)
	t.Logf("etcd restarted in %v", time.Since(t0).Round(time.Millisecond))
	// Binds go through again once the clients reconnect, and both edges
	// agree.
	testwait.Within(t, 30*time.Second, "a Bind through edge-a succeeds after etcd came back", func() bool { return tryBind(a, r2) == nil })
	t.Logf("a Bind went through %v after etcd came back", time.Since(t0).Round(time.Millisecond))
	testwait.Within(t, callTimeout, "edge-b sees the route bound through edge-a after the outage", sees(t, b, "tls", "two.example.test"))
	testwait.Within(t, callTimeout, "edge-b sees the route bound through edge-a after the outage", sees(t, b, "http", "two.example.test", at(r2, "edge-a")))
	bind(t, b, r3)
	testwait.Within(t, callTimeout, "edge-a sees the route bound through edge-b after the outage", sees(t, a, "tls", "three.example.test", at(r3, "edge-b")))
	for _, r := range []*Router{a, b} {
		if !sees(t, r, "http", "one.example.test", at(r1, "edge-a"))() {
			t.Fatalf("after the outage: %s's Lookup = %+v; want the route bound before", r.edge, lookup(t, r, "http", "one.example.test"))
		}
	}
	if err := tryBind(a, router.Route{Proto: "http", Name: "three.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t4"}); !errors.Is(err, router.ErrNameTaken) {
		t.Fatalf("after the outage: Bind through edge-a of bob's name bound through edge-b = %v; want ErrNameTaken", err)
	}
}

// TestLeaseExpired has an edge's lease expire under it: the edge grants a
// new one, registers itself as a member again and binds its routes again,
// but for one whose name another owner took meanwhile, which it drops with
// a warning.
func TestLeaseExpired(t *testing.T) {
	prefix := uniquePrefix(t)
	lost := make(chan struct{})
	resume := make(chan struct{})
	logs := new(logBuffer)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a", TTL: 2 * time.Second, Logger: testLogger(t, logs),
		testHookLeaseLost: func() {
			lost <- struct{}{}
			<-resume
		}})
	b := newRouter(t, Config{Prefix: prefix, Edge: "edge-b"})
	keep := router.Route{Proto: "http", Name: "keep.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	taken := router.Route{Proto: "http", Name: "taken.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t2"}
	bind(t, a, keep)
	bind(t, a, taken)
	testwait.Within(t, callTimeout, "edge-b sees edge-a's route", sees(t, b, "http", "taken.example.test", at(taken, "edge-a")))

	// The lease goes (as if its keep-alives had failed for its TTL).
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := sharedClient.Revoke(ctx, a.currentLease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(20 * time.Second):
		t.Fatal("edge-a did not notice its lease was gone")
	}
	testwait.Within(t, callTimeout, "edge-b rid of edge-a's routes", sees(t, b, "http", "keep.example.test"))
	testwait.Within(t, callTimeout, "edge-a no member for edge-b while its lease is gone", isMember(t, b, "edge-a", false))
	bobs := router.Route{Proto: "tls", Name: "taken.example.test", Identity: "bob", SessionID: "s2", TunnelID: "t3"}
	bind(t, b, bobs)
	close(resume)

	testwait.Within(t, 20*time.Second, "edge-b sees edge-a's route bound again", sees(t, b, "http", "keep.example.test", at(keep, "edge-a")))
	testwait.Within(t, callTimeout, "edge-a a member again for edge-b, under its new lease", isMember(t, b, "edge-a", true))
	testwait.Within(t, callTimeout, "edge-a rid of its route whose name bob took", sees(t, a, "http", "taken.example.test"))
	testwait.Within(t, callTimeout, "edge-a warned of the route it dropped", func() bool {
		return strings.Contains(logs.String(), "level=WARN msg=\"etcdrouter: route dropped") && strings.Contains(logs.String(), "taken.example.test")
	})
	if a.owns(a.keysOf(at(taken, "edge-a")).route) {
		t.Fatal("edge-a still counts the route whose name bob took as its own")
	}
	// bob's route reaches edge-a's cache through its watch.
	testwait.Within(t, callTimeout, "edge-a sees bob's route", sees(t, a, "tls", "taken.example.test", at(bobs, "edge-b")))
	// The new lease holds: binding and unbinding go on.
	more := router.Route{Proto: "http", Name: "more.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t4"}
	bind(t, a, more)
	unbind(t, a, keep, 0)
	testwait.Within(t, callTimeout, "edge-b sees edge-a's routes after the new lease", func() bool {
		return sees(t, b, "http", "more.example.test", at(more, "edge-a"))() && sees(t, b, "http", "keep.example.test")()
	})
}

// TestReloadAfterCompaction cuts an edge off etcd while another edge
// changes the routes and the history is compacted: when the edge gets back,
// its watch cannot resume, and it loads the routes again, telling its
// watchers what changed.
func TestReloadAfterCompaction(t *testing.T) {
	prefix := uniquePrefix(t)
	proxy := newCutProxy(t, strings.TrimPrefix(sharedEndpoint, "http://"))
	logs := new(logBuffer)
	a := newRouter(t, Config{Prefix: prefix, Edge: "edge-a"})
	b := newRouter(t, Config{Client: newClient(t, proxy.endpoint()), Prefix: prefix, Edge: "edge-b", Logger: testLogger(t, logs)})
	changes := make(chan change, 16)
	stop := b.WatchRoutes(func(rt router.Route, bound bool) { changes <- change{rt, bound} })
	defer stop()

	gone := router.Route{Proto: "http", Name: "gone.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t1"}
	stays := router.Route{Proto: "tcp", Name: "20001", Identity: "alice", SessionID: "s1", TunnelID: "t2"}
	comes := router.Route{Proto: "tls", Name: "comes.example.test", Identity: "alice", SessionID: "s1", TunnelID: "t3"}
	bind(t, a, gone)
	bind(t, a, stays)
	for range 2 {
		<-changes
	}

	proxy.cut()
	unbind(t, a, gone, 0)
	bind(t, a, comes)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := sharedClient.Get(ctx, "compact")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sharedClient.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	proxy.restore()

	want := map[change]bool{{at(gone, "edge-a"), false}: true, {at(comes, "edge-a"), true}: true}
	for len(want) > 0 {
		select {
		case c := <-changes:
			if !want[c] {
				t.Fatalf("WatchRoutes after the reload: %+v; want %+v", c, want)
			}
			delete(want, c)
		case <-time.After(20 * time.Second):
			t.Fatalf("WatchRoutes: still waiting for %+v after the edge got back", want)
		}
	}
	for _, c := range []struct {
		proto, host string
		want        []router.Route
	}{
		{"http", "gone.example.test", nil},
		{"tcp", "20001", []router.Route{at(stays, "edge-a")}},
		{"tls", "comes.example.test", []router.Route{at(comes, "edge-a")}},
	} {
		if !sees(t, b, c.proto, c.host, c.want...)() {
			t.Fatalf("after the reload: Lookup(%q, %q) = %+v; want %+v", c.proto, c.host, lookup(t, b, c.proto, c.host), c.want)
		}
	}
	if !strings.Contains(logs.String(), "compacted") {
		t.Errorf("the edge's logs do not say its watch's revision was compacted:\n%s", logs)
	}
}

// TestForeignWrites checks that writes outside the prefix, which the
// Router's watch does not see but which advance etcd's revision, never make
// a call wait for the cache to reach a revision it cannot see.
func TestForeignWrites(t *testing.T) {
	r := newRouter(t, Config{})
	rt := router.Route{Proto: "http", Name: "a.example.test", Identity: "alice", SessionID: "s", TunnelID: "1"}
	bind(t, r, rt)
	foreign := func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if _, err := sharedClient.Put(ctx, "/elsewhere/"+t.Name(), "x"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		call func(context.Context) error
	}{
		{"Bind of a route bound already", func(ctx context.Context) error { return r.Bind(ctx, rt) }},
		{"Unbind of an absent route", func(ctx context.Context) error { return r.Unbind(ctx, at(rt, "edge-b"), 0) }},
		{"Unbind of an absent route, with a reservation", func(ctx context.Context) error { return r.Unbind(ctx, at(rt, "edge-b"), time.Minute) }},
		{"Unbind", func(ctx context.Context) error { return r.Unbind(ctx, rt, 0) }},
		{"Unbind of a route unbound already", func(ctx context.Context) error { return r.Unbind(ctx, rt, 0) }},
	} {
		foreign()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.call(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s after a write outside the prefix = %v", c.name, err)
		}
	}
}

// TestWatchRoutes checks the replay, a stop that waits for the call in
// progress, and Close ending every watch and goroutine.
func TestWatchRoutes(t *testing.T) {
	r := newRouter(t, Config{})
	routes := []router.Route{
		{Proto: "http", Name: "a.example.test", Identity: "alice", SessionID: "s", TunnelID: "1"},
		{Proto: "tcp", Name: "20001", Identity: "alice", SessionID: "s", TunnelID: "2"},
	}
	for _, rt := range routes {
		bind(t, r, rt)
	}
	replayed := make(chan change, 4)
	stop := r.WatchRoutes(func(rt router.Route, bound bool) { replayed <- change{rt, bound} })
	seen := map[router.Route]bool{}
	for range routes {
		c := <-replayed
		seen[c.route] = c.bound
	}
	for _, rt := range routes {
		if !seen[at(rt, "edge-a")] {
			t.Fatalf("WatchRoutes replayed %+v; want every route bound", seen)
		}
	}

	// stop waits for the call of f in progress.
	inF, release := make(chan struct{}, 1), make(chan struct{})
	stop2 := r.WatchRoutes(func(router.Route, bool) {
		select {
		case inF <- struct{}{}:
			<-release
		default:
		}
	})
	<-inF
	stopped := make(chan struct{})
	go func() { stop2(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while f was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-stopped
	stop()
	stop() // again: nothing

	// Close ends the watches and every goroutine of the Router.
	r.WatchRoutes(func(router.Route, bool) {})
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close = %v; want nil", err)
	}
	if g := routerGoroutines(); g != "" {
		t.Fatalf("goroutines still running after Close:\n%s", g)
	}
	if err := r.Bind(context.Background(), routes[0]); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Bind after Close = %v; want net.ErrClosed", err)
	}
	if _, err := r.Lookup(context.Background(), "http", "a.example.test"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Lookup after Close = %v; want net.ErrClosed", err)
	}
	// Close revoked the lease: the routes went at once.
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := sharedClient.Get(ctx, r.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("after Close, %d keys are left under the prefix; want none", len(resp.Kvs))
	}
}

// TestMoveAcrossEdges moves an agent's route back and forth between two
// edges' sessions, each Move made through the edge the route moves to,
// while a third edge looks the name up through its own watch: it always
// finds a route, the old or the new, and at the end the last one alone.
// The old edge then unbinds its moved route, with a reservation, as a
// session that ends does: the name keeps its route.
func TestMoveAcrossEdges(t *testing.T) {
	prefix := uniquePrefix(t)
	edges := []*Router{
		newRouter(t, Config{Prefix: prefix, Edge: "edge-a"}),
		newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-b"}),
	}
	c := newRouter(t, Config{Client: newClient(t, sharedEndpoint), Prefix: prefix, Edge: "edge-c"})
	var _ interface {
		Move(context.Context, router.Route, string) error
	} = edges[0] // router.Mover
	const name = "moving.example.test"
	cur := router.Route{Proto: "http", Name: name, Identity: "alice", SessionID: "s0", TunnelID: "t0"}
	bind(t, edges[0], cur)
	cur = at(cur, "edge-a")
	testwait.Within(t, callTimeout, "edge-c sees the route", sees(t, c, "http", name, cur))

	var (
		stop          atomic.Bool
		empty, looked atomic.Int64
		wg            sync.WaitGroup
	)
	wg.Go(func() {
		for !stop.Load() {
			if routes, err := c.Lookup(context.Background(), "http", name); err == nil && len(routes) == 0 {
				empty.Add(1)
			}
			looked.Add(1)
		}
	})
	const moves = 600
	for i := 1; i <= moves; i++ {
		to := edges[i%2]
		next := router.Route{Proto: "http", Name: name, Identity: "alice", SessionID: fmt.Sprint("s", i), TunnelID: fmt.Sprint("t", i)}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := to.Move(ctx, next, cur.SessionID)
		cancel()
		if err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("move %d: Move(%+v, %q) through %s = %v", i, next, cur.SessionID, to.edge, err)
		}
		prev := cur
		cur = at(next, to.edge)
		if i == 1 {
			// The edge moved from unbinds its route as a session's end
			// does, with a reservation: nothing changes.
			unbind(t, edges[0], prev, time.Minute)
		}
	}
	testwait.Within(t, callTimeout, "edge-c sees the last route alone", sees(t, c, "http", name, cur))
	stop.Store(true)
	wg.Wait()
	if n := empty.Load(); n > 0 {
		t.Errorf("%d of %d lookups through edge-c during %d moves found no route", n, looked.Load(), moves)
	}
	for _, r := range edges {
		testwait.Within(t, callTimeout, r.edge+" sees the last route alone", sees(t, r, "http", name, cur))
	}
	// The name is alice's, and no reservation of the moved-from route
	// lingers once the last route goes.
	unbind(t, edges[moves%2], cur, 0)
	bind(t, c, router.Route{Proto: "http", Name: name, Identity: "bob", SessionID: "sb", TunnelID: "tb"})
}
