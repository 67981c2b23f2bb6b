package edge_test

// Tenants are safe from each other: each test here is a row of the table
// of issue #9, tried as a hostile tenant would.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// tenantEdge runs an edge on which alice-token and bob-token are two
// identities, with HTTP and TLS listeners.
func tenantEdge(t testing.TB, srv *edge.Server) (*testEdge, *router.MemoryRouter) {
	t.Helper()
	rt, _ := srv.Router.(*router.MemoryRouter)
	if rt == nil {
		rt = &router.MemoryRouter{}
		srv.Router = rt
	}
	if srv.Domain == "" {
		srv.Domain = "example.test"
	}
	srv.Authenticate = tokens
	te := edgeOn(t, srv, listen(t), listen(t))
	tlsLn := listen(t)
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeSNI(tlsLn) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return te, rt
}

// tenant returns a client of the edge with who's token.
func tenant(t testing.TB, te *testEdge, who string) *agent.Client {
	t.Helper()
	c := &agent.Client{Addrs: []string{te.agentAddr}, Token: who + "-token", MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	t.Cleanup(func() { c.Close() })
	return c
}

// bind binds url with c, or fails the test.
func bind(t testing.TB, c *agent.Client, url string) *agent.Listener {
	t.Helper()
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatalf("binding %s: %v", url, err)
	}
	return l
}

// serve answers every request on l with name and the path.
func serve(t testing.TB, l net.Listener, name string) {
	done := make(chan struct{})
	go func() { defer close(done); http.Serve(l, nameHandler(name)) }()
	t.Cleanup(func() { l.Close(); <-done })
}

func TestTenantsCannotTakeEachOthersNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name             string
		alice, bob       string
		wantErr          error // what bob gets
		aliceStillServes string
	}{
		{"name under alice's wildcard", "http://*.w.example.test", "http://x.w.example.test", agent.ErrNameTaken, "x.w"},
		{"wildcard under alice's wildcard", "http://*.w.example.test", "http://*.x.w.example.test", agent.ErrNameTaken, "a.x.w"},
		{"alice's wildcard's base", "http://*.w.example.test", "http://w.example.test", agent.ErrNameTaken, "x.w"},
		{"wildcard over alice's name", "http://abc", "http://*.abc.example.test", agent.ErrNameTaken, "abc"},
		{"name under alice's name", "http://abc", "http://x.abc.example.test", agent.ErrNameTaken, "abc"},
		{"name above alice's", "http://x.y.example.test", "http://y.example.test", agent.ErrNameTaken, "x.y"},
		{"alice's http name over tls", "http://abc", "tls://abc.example.test", agent.ErrNameTaken, "abc"},
		{"alice's tls name over http", "tls://abc.example.test", "http://abc", agent.ErrNameTaken, ""},
		{"catch-all wildcard", "http://abc", "http://*.example.test", agent.ErrRefused, "abc"},
		{"bare star", "http://abc", "http://*", agent.ErrRefused, "abc"},
		{"alice's pool", "http://p", "http://p", agent.ErrNameTaken, "p"},
	} {
		t.Run(c.name, func(t *testing.T) {
			te, _ := tenantEdge(t, &edge.Server{})
			al, err := tenant(t, te, "alice").ListenEndpoint(context.Background(), agent.Endpoint{URL: c.alice, Pool: true})
			if err != nil {
				t.Fatal(err)
			}
			serve(t, al, "alice")
			_, err = tenant(t, te, "bob").ListenEndpoint(context.Background(), agent.Endpoint{URL: c.bob, Pool: true})
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("bob binding %s while alice holds %s: %v, want %v", c.bob, c.alice, err, c.wantErr)
			}
			if c.aliceStillServes != "" {
				if resp, body := get(t, te, te.url(c.aliceStillServes)+"/", nil); resp.StatusCode != 200 || body != "alice /" {
					t.Fatalf("%s: %d %q, want alice's app", c.aliceStillServes, resp.StatusCode, body)
				}
			}
		})
	}
}

func TestOneIdentityOverSeveralProtocolsAndNestedNames(t *testing.T) {
	t.Parallel()
	te, rt := tenantEdge(t, &edge.Server{})
	alice := tenant(t, te, "alice")
	for _, url := range []string{"http://abc", "tls://abc.example.test", "http://*.w.example.test", "http://x.w.example.test"} {
		if _, err := alice.Listen(context.Background(), url); err != nil {
			t.Fatalf("alice binding %s beside her other names: %v", url, err)
		}
	}
	for _, proto := range []string{"http", "tls"} {
		if routes, _ := rt.Lookup(context.Background(), proto, "abc.example.test"); len(routes) != 1 {
			t.Fatalf("%s abc: %d routes", proto, len(routes))
		}
	}
}

func TestCatchAllOnlyWhenAllowed(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{AllowCatchAll: true})
	l, err := tenant(t, te, "bob").Listen(context.Background(), "http://*")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, "bob")
	if !strings.HasPrefix(l.URL(), "http://*.example.test") {
		t.Fatalf("URL %q", l.URL())
	}
	// The catch-all's owner owns every name: alice gets none.
	if _, err := tenant(t, te, "alice").Listen(context.Background(), "http://abc"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("alice under bob's catch-all: %v, want ErrNameTaken", err)
	}
	if resp, body := get(t, te, te.url("anything")+"/", nil); resp.StatusCode != 200 || body != "bob /" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}

func TestPoolsByConsent(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	first, err := tenant(t, te, "alice").Listen(context.Background(), "http://solo")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, first, "first")
	// A second agent of alice's asks to pool with an endpoint that did
	// not ask to share.
	_, err = tenant(t, te, "alice").ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://solo", Pool: true})
	if !errors.Is(err, agent.ErrNameTaken) || !strings.Contains(err.Error(), "not shared") {
		t.Fatalf("pool bind onto a non-pool endpoint: %v, want router.ErrNameTaken saying it is not shared", err)
	}
	// And the other way round.
	pooled, err := tenant(t, te, "alice").ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://shared", Pool: true})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, pooled, "pooled")
	_, err = tenant(t, te, "alice").Listen(context.Background(), "http://shared")
	if !errors.Is(err, agent.ErrNameTaken) || !strings.Contains(err.Error(), "pool") {
		t.Fatalf("non-pool bind onto a pool: %v, want router.ErrNameTaken saying it is a pool", err)
	}
	for range 6 {
		if resp, body := get(t, te, te.url("solo")+"/", nil); resp.StatusCode != 200 || body != "first /" {
			t.Fatalf("solo: %d %q", resp.StatusCode, body)
		}
	}
}

// TestEdgeRestartGivesNamesBackToOwners restarts an edge whose router is
// in memory, with a record of names: bob, asking first, does not get
// alice's name; alice does; bob's random name is granted meanwhile.
func TestEdgeRestartGivesNamesBackToOwners(t *testing.T) {
	t.Parallel()
	key, dir := []byte(strings.Repeat("k", 32)), t.TempDir()
	agentsLn, pubLn := listen(t), listen(t)
	agentsAddr := agentsLn.Addr().String()
	srv1 := &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test"}
	te1 := edgeOn(t, srv1, agentsLn, pubLn)

	var dials atomic.Int32
	gate := make(chan struct{})
	alice := &agent.Client{Addrs: []string{agentsAddr}, Token: "alice-token", MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				select {
				case <-gate: // reconnect only once bob has tried
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
	defer alice.Close()
	l := bind(t, alice, "http://app")
	serve(t, l, "alice")
	url := l.URL()

	// The same record, and an in-memory router: names held before the
	// restart go back only to their owners for Grace.
	te2 := te1.restart(t, &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test", Timeouts: edge.Timeouts{Grace: time.Minute}})
	bob := &agent.Client{Addrs: []string{agentsAddr}, Token: "bob-token"}
	defer bob.Close()
	if _, err := bob.Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob asking for alice's name right after the restart: %v, want ErrNameTaken", err)
	}
	if _, err := bob.Listen(context.Background(), ""); err != nil {
		t.Fatalf("a random name during the restart grace: %v", err)
	}
	close(gate)
	testwait.For(t, func() bool {
		resp, body := get(t, te2, url+"/", nil)
		return resp.StatusCode == 200 && body == "alice /"
	})
	if l.URL() != url {
		t.Fatalf("alice came back as %q, want %q", l.URL(), url)
	}
	if _, err := bob.Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob after alice came back: %v, want ErrNameTaken", err)
	}
}

// TestAgentSideDropTakesOverOldSession: only the agent's side of its
// connection drops; the agent reconnects at once, its session ticket makes
// the edge close the old session, and its endpoints, a pool member and a
// TCP port among them, come back with the same URLs.
func TestAgentSideDropTakesOverOldSession(t *testing.T) {
	t.Parallel()
	te, rt := tenantEdge(t, &edge.Server{TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Timeouts: edge.Timeouts{HeartbeatInterval: time.Hour}})
	r := newRelay(t, te.agentAddr)
	var connects atomic.Int32
	a := &agent.Client{Addrs: []string{r.ln.Addr().String()}, Token: "alice-token", MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		OnEvent: func(e agent.Event) {
			if e.Kind == agent.Connected {
				connects.Add(1)
			}
		}}
	defer a.Close()
	web := bind(t, a, "http://app")
	serve(t, web, "alice")
	member, err := a.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pool", Pool: true})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, member, "member")
	other, err := tenant(t, te, "alice").ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pool", Pool: true})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, other, "other")
	port := freePort(t)
	tcpL := bind(t, a, "tcp://:"+port)
	go func() {
		for {
			c, err := tcpL.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "tcp alice\n")
			c.Close()
		}
	}()
	urls := []string{web.URL(), member.URL(), tcpL.URL()}
	before, _ := rt.Lookup(context.Background(), "http", "app.example.test")
	if len(before) != 1 {
		t.Fatalf("before the drop: %d routes for app", len(before))
	}
	oldSession := before[0].SessionID

	r.cut()
	testwait.For(t, func() bool { return connects.Load() >= 2 })
	// The endpoints are back once the new session holds them: the pool's
	// two routes were there, the old session's member among them, until
	// the takeover closed the old session.
	renewed := func(host string, n int) bool {
		routes, _ := rt.Lookup(context.Background(), "http", host)
		for _, r := range routes {
			if r.SessionID == oldSession {
				return false
			}
		}
		return len(routes) == n
	}
	testwait.For(t, func() bool { return renewed("app.example.test", 1) && renewed("pool.example.test", 2) })
	for i, l := range []*agent.Listener{web, member, tcpL} {
		if l.URL() != urls[i] {
			t.Errorf("listener %d came back as %q, want %q", i, l.URL(), urls[i])
		}
	}
	if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("after the takeover: %d %q", resp.StatusCode, body)
	}
	// A keep-alive connection keeps its stream, so its requests stay with
	// one member: spread shows over new connections.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
	}}}
	seen := map[string]bool{}
	for range 4 {
		resp, err := fresh.Get(te.url("pool") + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen[string(body)] = true
	}
	if !seen["member /"] || !seen["other /"] {
		t.Fatalf("pool after the takeover served %v, want both members", seen)
	}
	conn, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(conn)
	conn.Close()
	if string(b) != "tcp alice\n" {
		t.Fatalf("tcp after the takeover: %q", b)
	}
}

// TestTransientBindErrorRetried: after an edge restart the agent's port is
// briefly held by someone else; the bind fails as unavailable and is tried
// again until the port is free, and the listener stays open meanwhile.
func TestTransientBindErrorRetried(t *testing.T) {
	t.Parallel()
	agentsLn := listen(t)
	agentsAddr := agentsLn.Addr().String()
	srv1 := &edge.Server{Domain: "example.test", TCPPorts: edge.PortRange{Min: 1024, Max: 65535}}
	te1 := edgeOn(t, srv1, agentsLn, listen(t))
	a := &agent.Client{Addrs: []string{agentsAddr}, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}
	defer a.Close()
	port := freePort(t)
	l := bind(t, a, "tcp://:"+port)
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			io.WriteString(c, "back\n")
			c.Close()
		}
		accepted <- err
	}()
	srv1.Close()
	<-te1.serveDone
	squatter, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	agentsLn2, err := net.Listen("tcp", agentsAddr)
	if err != nil {
		t.Fatal(err)
	}
	rt := &router.MemoryRouter{}
	var warned atomic.Int32
	edgeOn(t, &edge.Server{Domain: "example.test", TCPPorts: edge.PortRange{Min: 1024, Max: 65535}, Router: rt,
		Logger: logCounter(&warned, "tcp endpoint")}, agentsLn2, listen(t))
	testwait.For(t, func() bool { return warned.Load() >= 2 }) // refused twice at least, as unavailable
	select {
	case err := <-accepted:
		t.Fatalf("the listener ended while its port was busy: %v", err)
	default:
	}
	squatter.Close()
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "tcp", port)
		return len(routes) == 1
	})
	conn, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(conn)
	conn.Close()
	if string(b) != "back\n" || <-accepted != nil {
		t.Fatalf("after the port came free: %q", b)
	}
	if l.URL() != "tcp://127.0.0.1:"+port {
		t.Fatalf("URL %q", l.URL())
	}
}

// TestClosedListenerGetsNoMoreRequests: alice closes her listener while her
// session lives on, bob binds the name, and a client whose keep-alive
// connection carried alice's requests now reaches bob only.
func TestClosedListenerGetsNoMoreRequests(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	alice := tenant(t, te, "alice")
	keep, err := alice.Listen(context.Background(), "http://keep") // keeps the session alive
	if err != nil {
		t.Fatal(err)
	}
	serve(t, keep, "keep")
	l := bind(t, alice, "http://app")
	var aliceHits atomic.Int32
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aliceHits.Add(1)
		io.WriteString(w, "alice")
	}))
	for range 5 { // over one keep-alive client connection
		if _, body := get(t, te, te.url("app")+"/", nil); body != "alice" {
			t.Fatalf("before: %q", body)
		}
	}
	l.Close()
	bl, err := tenant(t, te, "bob").Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatalf("bob binding a name alice released: %v", err)
	}
	serve(t, bl, "bob")
	hits := aliceHits.Load()
	for range 20 {
		if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 || body != "bob /" {
			t.Fatalf("after alice left: %d %q", resp.StatusCode, body)
		}
	}
	if aliceHits.Load() != hits {
		t.Fatalf("alice's closed listener got %d more requests", aliceHits.Load()-hits)
	}
}

func TestIDNALabels(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	alice := tenant(t, te, "alice")
	for label, ok := range map[string]bool{
		"xn--bcher-kva":  true,  // bücher
		"xn--fiqs8s":     true,  // 中国
		"xn--pple-43d":   false, // Cyrillic а, then Latin pple: a homograph of apple
		"xn--80ak6aa92e": true,  // аррӏе, all Cyrillic: one script (a whole-script lookalike; see the note on checkLabel in edge/internal/names)
		"xn--a":          false, // not punycode of anything valid
		"xn--zz-":        false,
		"xn--ls8h":       false, // an emoji
		"ab--cd":         false, // '--' in the third and fourth place is reserved
		"a--b":           true,
	} {
		_, err := alice.Listen(context.Background(), "http://"+label)
		if ok && err != nil {
			t.Errorf("%s refused: %v", label, err)
		}
		if !ok && !errors.Is(err, agent.ErrRefused) {
			t.Errorf("%s: %v, want ErrRefused", label, err)
		}
	}
}

// logCounter returns a logger that counts the records whose message is
// msg, and discards everything.
func logCounter(n *atomic.Int32, msg string) *slog.Logger {
	return slog.New(countHandler{n, msg})
}

type countHandler struct {
	n   *atomic.Int32
	msg string
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// TestLostNameEndsListener: while alice is away past her grace period, bob
// takes her name; when alice comes back, that refusal ends her listener,
// and Accept says why.
func TestLostNameEndsListener(t *testing.T) {
	t.Parallel()
	te, rt := tenantEdge(t, &edge.Server{Timeouts: edge.Timeouts{Grace: 50 * time.Millisecond}})
	var conn atomic.Pointer[net.Conn]
	gate := make(chan struct{})
	var dials atomic.Int32
	alice := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token", MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				<-gate
			}
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				conn.Store(&c)
			}
			return c, err
		}}
	defer alice.Close()
	l := bind(t, alice, "http://app")
	(*conn.Load()).Close()
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "app.example.test")
		return len(routes) == 0
	})
	var bl *agent.Listener
	testwait.For(t, func() bool { // once alice's reservation lapsed
		var err error
		bl, err = tenant(t, te, "bob").Listen(context.Background(), "http://app")
		return err == nil
	})
	serve(t, bl, "bob")
	close(gate)
	_, err := l.Accept()
	if !errors.Is(err, agent.ErrNameTaken) || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("alice's Accept after bob took her name: %v, want router.ErrNameTaken and net.ErrClosed", err)
	}
}

// TestLyingAgentReplies: an agent answers proxy streams with replies that
// lie about their length or status. The edge answers its clients with an
// error, and goes on serving.
func TestLyingAgentReplies(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	s := rawSession(t, te.agentAddr)
	call := func(req wire.Request) wire.Response { return rawCall(t, s, req) }
	if resp := call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version}}); resp.HelloResp == nil {
		t.Fatalf("hello: %+v", resp.Error)
	}
	lies := [][]byte{
		{0, 0xff, 0xff},        // a message longer than any reply
		{7, 0, 2, 'h', 'i'},    // an unknown status
		{0},                    // a reply cut short
		{1, 0, 3, 0xff, 0, 10}, // a refusal with bytes that are no text
	}
	var n atomic.Int32
	go answerStreams(s, func(st muxado.Stream, _ wire.StreamType) { // lie on every proxy stream
		wire.ReadProxyHeader(st)
		st.Write(lies[int(n.Add(1))%len(lies)])
	})
	if resp := call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: "http", Name: "liar"}}); resp.BindResp == nil {
		t.Fatalf("bind: %+v", resp.Error)
	}
	for range 8 {
		resp, body := get(t, te, te.url("liar")+"/", nil)
		if resp.StatusCode != 502 || !strings.Contains(body, "app_") {
			t.Fatalf("a lying agent: %d %q, want 502", resp.StatusCode, body)
		}
	}
	te.serveApp(t, "honest", nameHandler("honest"))
	if resp, body := get(t, te, te.url("honest")+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after the lies: %d %q", resp.StatusCode, body)
	}
}
