package edge_test

// Quotas of endpoints (issue #19, item 3): one identity, the anonymous
// agents of one address, or everyone together cannot make the edge hold
// endpoints without bound; a well-behaved tenant is served meanwhile.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// listenRefused asks c to bind url, which the edge refuses for now: the
// agent tries again until its setup's context ends, and returns the last
// refusal. The context ends once obs counted two more refusals of key
// (the agent had the first answer before it asked again), not after a
// time that a busy machine might need for the first.
func listenRefused(c *agent.Client, url string, obs *tally, key string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := obs.get(key)
	go func() {
		defer cancel()
		bound := time.Now().Add(time.Minute) // only a failing test waits for it
		for obs.get(key) < before+2 && ctx.Err() == nil && time.Now().Before(bound) {
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := c.Listen(ctx, url)
	return err
}

// TestEndpointQuotaPerIdentity: bob binds over two sessions until his
// identity's quota refuses him, on either session; alice binds and is
// served; an endpoint bob lets go frees a place for him.
func TestEndpointQuotaPerIdentity(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	te, _ := tenantEdge(t, &edge.Server{Observer: obs, Limits: edge.Limits{EndpointsPerIdentity: 6, EndpointsPerSession: 5}})
	first, second := tenant(t, te, "bob"), tenant(t, te, "bob")
	for i := range 4 {
		bind(t, first, fmt.Sprintf("http://first%d", i))
	}
	var last *agent.Listener
	for i := range 2 {
		last = bind(t, second, fmt.Sprintf("http://second%d", i))
	}
	for _, c := range []*agent.Client{first, second} {
		err := listenRefused(c, "http://one-too-many", obs, "refused/"+string(edge.ReasonIdentityEndpointLimit))
		if !errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "this identity") {
			t.Fatalf("bob's bind past his quota: %v, want ErrUnavailable naming the quota per identity", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonIdentityEndpointLimit)); n < 2 {
		t.Fatalf("%d refusals counted as %s, want 2 or more (one per attempt)", n, edge.ReasonIdentityEndpointLimit)
	}
	al := bind(t, tenant(t, te, "alice"), "http://alice")
	serve(t, al, "alice")
	if resp, body := get(t, te, te.url("alice")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("alice beside bob at his quota: %d %q", resp.StatusCode, body)
	}
	last.Close()
	if _, err := second.Listen(context.Background(), "http://again"); err != nil {
		t.Fatalf("bob's bind once one of his endpoints went: %v", err)
	}
}

// TestEndpointQuotaPerSource: anonymous agents from one address, each an
// identity of its own, bind until their address's quota refuses them; an
// anonymous agent from another address binds and is served.
func TestEndpointQuotaPerSource(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	srv := &edge.Server{Domain: "example.test", Observer: obs, Limits: edge.Limits{EndpointsPerSource: 5}}
	te := edgeOn(t, srv, listen(t), listen(t))
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	go srv.ServeAgents(ln6)
	var agents []*agent.Client
	t.Cleanup(func() {
		for _, c := range agents {
			c.Close()
		}
	})
	for i := range 6 {
		c := &agent.Client{Addrs: []string{te.agentAddr}}
		agents = append(agents, c)
		url := fmt.Sprintf("http://flood%d", i)
		if i < 5 {
			if _, err := c.Listen(context.Background(), url); err != nil {
				t.Fatalf("anonymous agent %d: %v", i, err)
			}
			continue
		}
		err := listenRefused(c, url, obs, "refused/"+string(edge.ReasonSourceEndpointLimit))
		if !errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "anonymous agents from 127.0.0.1") {
			t.Fatalf("the sixth anonymous agent from one address: %v, want ErrUnavailable naming the quota per source", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonSourceEndpointLimit)); n < 1 {
		t.Fatalf("%d refusals counted as %s, want 1 or more (one per attempt)", n, edge.ReasonSourceEndpointLimit)
	}
	good := &agent.Client{Addrs: []string{ln6.Addr().String()}}
	defer good.Close()
	l := bind(t, good, "http://good")
	serve(t, l, "good")
	if resp, body := get(t, te, te.url("good")+"/", nil); resp.StatusCode != 200 || body != "good /" {
		t.Fatalf("an agent from another address: %d %q", resp.StatusCode, body)
	}
}

// TestEndpointQuotaPerEdge: past the edge's quota every bind is refused,
// whoever asks; the endpoints held are served, and one that goes frees a
// place.
func TestEndpointQuotaPerEdge(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	te, _ := tenantEdge(t, &edge.Server{Observer: obs, Limits: edge.Limits{Endpoints: 4}})
	alice, bob := tenant(t, te, "alice"), tenant(t, te, "bob")
	al := bind(t, alice, "http://alice")
	serve(t, al, "alice")
	var last *agent.Listener
	for i := range 3 {
		last = bind(t, bob, fmt.Sprintf("http://bob%d", i))
	}
	for _, c := range []*agent.Client{alice, bob} {
		err := listenRefused(c, "http://more", obs, "refused/"+string(edge.ReasonEdgeEndpointLimit))
		if !errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "every agent's together") {
			t.Fatalf("a bind past the edge's quota: %v, want ErrUnavailable naming it", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonEdgeEndpointLimit)); n < 2 {
		t.Fatalf("%d refusals counted as %s, want 2 or more (one per attempt)", n, edge.ReasonEdgeEndpointLimit)
	}
	if resp, body := get(t, te, te.url("alice")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("alice with the edge at its quota: %d %q", resp.StatusCode, body)
	}
	last.Close()
	if _, err := alice.Listen(context.Background(), "http://more"); err != nil {
		t.Fatalf("a bind once an endpoint went: %v", err)
	}
}

// TestGraceNamesCountAgainstQuotas (issue #32, item 7): the names that
// an ended session leaves reserved for its identity (Timeouts.Grace)
// count against the identity's quota of endpoints, the one of the
// anonymous agents of its source, and the edge's, until they are free.
// Rounds of "bind up to the quota, disconnect": while the grace keeps the
// names, a bind of the next session is refused for the quota, so that
// the names held, bound or kept, are never more than the quota; once the
// grace ends, the quota is whole again. An agent that reconnects (the
// edge has not seen it go; its session ticket says which session it
// had) gets its names back, each counted once: a bind past them is
// refused, and one it lets go makes room for one.
func TestGraceNamesCountAgainstQuotas(t *testing.T) {
	t.Parallel()
	const quota = 3
	for _, c := range []struct {
		name      string
		limits    edge.Limits
		anonymous bool   // no Authenticate: each agent an identity of its own, counted by its source
		refusal   string // in the message of a bind past the quota
	}{
		{"identity", edge.Limits{EndpointsPerIdentity: quota}, false, "this identity"},
		{"source", edge.Limits{EndpointsPerSource: quota}, true, "anonymous agents from 127.0.0.1"},
		{"edge", edge.Limits{Endpoints: quota}, false, "every agent's together"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := &fakeClock{t: time.Now()}
			rt := &router.MemoryRouter{Clock: clock.Now}
			srv := &edge.Server{Domain: "example.test", Router: rt, Clock: clock.Now, Limits: c.limits, Timeouts: edge.Timeouts{Grace: time.Hour}}
			token := ""
			if !c.anonymous {
				srv.Authenticate, token = tokens, "bob-token"
			}
			te := edgeOn(t, srv, listen(t), listen(t))
			var names []string // every name bound
			bindOK := func(a *rawAgent, name, ticket string) *wire.BindResp {
				t.Helper()
				resp := a.bind(name, ticket)
				if resp.Error != nil {
					t.Fatalf("bind %s: %+v", name, resp.Error)
				}
				u, err := url.Parse(resp.BindResp.URL)
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, u.Hostname())
				return resp.BindResp
			}
			refused := func(a *rawAgent, name, when string) {
				t.Helper()
				resp := a.bind(name, "")
				if e := resp.Error; e == nil || e.Code != wire.CodeUnavailable || !strings.Contains(e.Message, c.refusal) {
					t.Fatalf("%s: a bind past the quota: %+v, want %s naming the quota (%q)", when, e, wire.CodeUnavailable, c.refusal)
				}
			}
			// held counts the names bound here that someone holds, with
			// routes or reserved.
			held := func(reservedOnly bool) int {
				n := 0
				for _, name := range names {
					_, until, ok := rt.Holder(wire.ProtoHTTP, name)
					if ok && (!reservedOnly || !until.IsZero()) {
						n++
					}
				}
				return n
			}
			for round := range 3 {
				a, _ := dialRaw(t, te.agentAddr, token, "")
				for i := range quota {
					bindOK(a, fmt.Sprintf("r%d-%d", round, i), "")
				}
				refused(a, fmt.Sprintf("r%d-more", round), fmt.Sprintf("round %d, the session at its quota", round))
				a.s.Close()
				testwait.For(t, func() bool { return held(true) == quota }) // the edge saw the session end
				b, _ := dialRaw(t, te.agentAddr, token, "")
				refused(b, fmt.Sprintf("r%d-next", round), fmt.Sprintf("round %d, the names of the session that ended in their grace", round))
				if n := held(false); n > quota {
					t.Fatalf("round %d: %d names held, past the quota of %d", round, n, quota)
				}
				b.s.Close()
				clock.Add(time.Hour + time.Second) // the grace ends
			}

			a, hello := dialRaw(t, te.agentAddr, token, "")
			var own []*wire.BindResp
			for i := range quota {
				own = append(own, bindOK(a, fmt.Sprintf("own%d", i), ""))
			}
			b, _ := dialRaw(t, te.agentAddr, token, hello.Ticket) // the edge closes a, keeping its names
			var back []*wire.BindResp
			for i, was := range own {
				got := bindOK(b, fmt.Sprintf("own%d", i), was.Ticket)
				if got.URL != was.URL {
					t.Fatalf("reconnected, own%d came back as %s, want %s", i, got.URL, was.URL)
				}
				back = append(back, got)
			}
			refused(b, "own-more", "reconnected, with its names back")
			if resp := b.call(wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: back[0].TunnelID}}); resp.Error != nil {
				t.Fatalf("unbind: %+v", resp.Error)
			}
			bindOK(b, "another", "")
			refused(b, "another-more", "reconnected, one name let go and another bound")
		})
	}
}

// TestGracePoolMemberNotKept: a session of a pool ends while another
// session of the identity still serves the pool: the name has routes, so
// nothing is kept, and the ended member's endpoint counts no more at
// once; once the last member ends, the name is kept, and counts once.
func TestGracePoolMemberNotKept(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	te := edgeOn(t, &edge.Server{Domain: "example.test", Router: rt, Authenticate: tokens, Limits: edge.Limits{EndpointsPerIdentity: 2}, Timeouts: edge.Timeouts{Grace: time.Hour}}, listen(t), listen(t))
	member := func(a *rawAgent) {
		t.Helper()
		if resp := a.call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: "pool", Pool: true}}); resp.Error != nil {
			t.Fatalf("joining the pool: %+v", resp.Error)
		}
	}
	a, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	b, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	member(a)
	member(b)
	if resp := b.bind("solo", ""); resp.Error == nil {
		t.Fatal("a third endpoint past the quota of 2 was granted")
	}
	a.s.Close()
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), wire.ProtoHTTP, "pool.example.test")
		return len(routes) == 1
	})
	if resp := b.bind("solo", ""); resp.Error != nil {
		t.Fatalf("a bind once a pool member of two ended: %+v; the pool's name, which has routes, is not kept", resp.Error)
	}
	b.s.Close()
	testwait.For(t, func() bool {
		_, until, ok := rt.Holder(wire.ProtoHTTP, "pool.example.test")
		return ok && !until.IsZero()
	})
	c, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	if resp := c.bind("other", ""); resp.Error == nil {
		t.Fatal("a bind while the pool's name and solo are kept, past the quota of 2, was granted")
	}
	member(c) // the pool's name taken back: one place
	if resp := c.bind("other", ""); resp.Error == nil {
		t.Fatal("a bind while solo is kept and the pool bound, past the quota of 2, was granted")
	}
}

// TestRestartKeptNamesCountAgainstQuota: the names a restart keeps for
// the identity that held them when the edge stopped (Server.StateDir)
// count against its quota until they are free, as those of a session
// that ended do: the identity binds no new name past its quota
// meanwhile, takes its own back each counted once, and has its quota
// whole again once the restart's grace ended.
func TestRestartKeptNamesCountAgainstQuota(t *testing.T) {
	t.Parallel()
	key, dir := []byte(strings.Repeat("q", 32)), t.TempDir()
	clock := &fakeClock{t: time.Now()}
	server := func() *edge.Server {
		return &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test", Clock: clock.Now,
			Limits: edge.Limits{EndpointsPerIdentity: 2}, Timeouts: edge.Timeouts{Grace: time.Hour}}
	}
	te1 := edgeOn(t, server(), listen(t), listen(t))
	a, _ := dialRaw(t, te1.agentAddr, "bob-token", "")
	var tickets []string
	for _, name := range []string{"one", "two"} {
		resp := a.bind(name, "")
		if resp.Error != nil {
			t.Fatalf("bind %s: %+v", name, resp.Error)
		}
		tickets = append(tickets, resp.BindResp.Ticket)
	}
	te2 := te1.restart(t, server())
	b, _ := dialRaw(t, te2.agentAddr, "bob-token", "")
	refused := func(name, when string) {
		t.Helper()
		if resp := b.bind(name, ""); resp.Error == nil || !strings.Contains(resp.Error.Message, "this identity") {
			t.Fatalf("%s: a bind past the quota: %+v, want one refused for the identity's quota", when, resp.Error)
		}
	}
	refused("three", "after the restart, both names kept")
	if resp := b.bind("one", tickets[0]); resp.Error != nil {
		t.Fatalf("taking a kept name back: %+v", resp.Error)
	}
	refused("three", "one name taken back, the other kept")
	clock.Add(time.Hour + time.Second) // the restart's grace ends
	if resp := b.bind("three", ""); resp.Error != nil {
		t.Fatalf("a bind once the restart's grace ended: %+v", resp.Error)
	}
	refused("four", "one name taken back, and one new")
}

// BenchmarkEndpointsAtQuota binds endpoints by hand (no agent-side
// state) until the edge's quotas refuse: one identity up to its own
// (Limits.EndpointsPerIdentity), or identity after identity up to the
// edge's (Limits.Endpoints), with the default quotas. It reports the
// endpoints bound and the edge's heap growth, in all and per endpoint, and
// on Linux the process's resident memory growth (the hand-written agents'
// few sessions included).
// Give it 1x:
//
//	go test ./edge -run '^$' -bench EndpointsAtQuota -benchtime 1x
func BenchmarkEndpointsAtQuota(b *testing.B) {
	for _, c := range []struct {
		name       string
		identities int
	}{{"identity", 1}, {"edge", 1 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			var endpoints, heap, rss float64
			for range b.N {
				rss0 := residentBytes()
				n, grew := bindToQuota(b, c.identities)
				rss += float64(residentBytes() - rss0)
				endpoints += float64(n)
				heap += float64(grew)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(endpoints/float64(b.N), "endpoints")
			b.ReportMetric(heap/float64(b.N)/(1<<20), "heap-MiB")
			b.ReportMetric(heap/endpoints, "heap-B/endpoint")
			if rss != 0 {
				b.ReportMetric(rss/float64(b.N)/(1<<20), "rss-MiB")
			}
		})
	}
}

// BenchmarkGraceRounds measures issue #32's item 7: at the edge's
// default quotas and grace (but EndpointsPerSession, lifted so that one
// session binds up to the identity's quota), one identity binds as many
// random names as it is granted, up to 4096, and disconnects; once the
// edge saw the session end, it does so again, 16 rounds in all. It
// reports the most names the identity held at once, bound or kept for
// it, the names it was granted in all, and the seconds the rounds took.
// Give it 1x:
//
//	go test ./edge -run '^$' -bench GraceRounds -benchtime 1x
func BenchmarkGraceRounds(b *testing.B) {
	var most, granted, took float64
	for range b.N {
		rt := &router.MemoryRouter{}
		te := edgeOn(b, &edge.Server{Domain: "example.test", Router: rt, Authenticate: tokens, Limits: edge.Limits{EndpointsPerSession: -1}}, listen(b), listen(b))
		var names []string
		held := func(from int, reservedOnly bool) int {
			n := 0
			for _, name := range names[from:] {
				if _, until, ok := rt.Holder(wire.ProtoHTTP, name); ok && (!reservedOnly || !until.IsZero()) {
					n++
				}
			}
			return n
		}
		start := time.Now()
		peak := 0
		for range 16 {
			a, _ := dialRaw(b, te.agentAddr, "bob-token", "")
			from := len(names)
			for range edge.DefaultEndpointsPerIdentity {
				resp := a.bind("", "")
				if resp.Error != nil {
					break
				}
				u, err := url.Parse(resp.BindResp.URL)
				if err != nil {
					b.Fatal(err)
				}
				names = append(names, u.Hostname())
			}
			peak = max(peak, held(0, false))
			a.s.Close()
			bound := len(names) - from
			testwait.Within(b, time.Minute, "the edge saw the session end", func() bool { return held(from, true) == bound })
		}
		took += time.Since(start).Seconds()
		most += float64(peak)
		granted += float64(len(names))
		b.Logf("%d names held at most at once, %d granted in all, in %v", peak, len(names), time.Since(start).Round(time.Millisecond))
	}
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(most/n, "names-held-at-most")
	b.ReportMetric(granted/n, "names-granted")
	b.ReportMetric(took/n, "s")
}

// bindToQuota binds http endpoints on a new edge, for up to identities
// identities each up to its quota, until the edge's quota refuses, and
// returns how many it bound and how much the heap grew.
func bindToQuota(b *testing.B, identities int) (endpoints int, heapGrowth uint64) {
	srv := &edge.Server{Domain: "example.test", Authenticate: identityIsToken}
	te := edgeOn(b, srv, listen(b), listen(b))
	before := heapAlloc()
	for id := range identities {
		for {
			a, _ := dialRaw(b, te.agentAddr, fmt.Sprint("id", id), "")
			resp := wire.Response{}
			for resp.Error == nil {
				resp = a.bind(fmt.Sprintf("e%d", endpoints), "")
				if resp.Error == nil {
					endpoints++
				}
			}
			switch msg := resp.Error.Message; {
			case strings.Contains(msg, "every agent's together"):
				return endpoints, heapAlloc() - before
			case strings.Contains(msg, "this identity"):
			case strings.Contains(msg, "this session"):
				continue // another session of the identity
			default:
				b.Fatalf("bind %d: %v", endpoints, resp.Error)
			}
			break
		}
	}
	return endpoints, heapAlloc() - before
}

// residentBytes returns the process's resident memory on Linux, and 0
// elsewhere.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize())
}

// heapAlloc returns the bytes of live heap objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
