package edge_test

// The control plane's view of an edge and its lever (issue #34, item 1):
// Sessions, Endpoints, Disconnect and Watch.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
)

// viewEdge is an edge on loopback with agent, HTTP and TLS listeners, on
// which alice-token and bob-token are two identities; its clock stands
// still at viewNow.
type viewEdge struct {
	*testEdge
	tlsAddr string
}

var viewNow = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func startViewEdge(t testing.TB, configure func(*edge.Server)) *viewEdge {
	t.Helper()
	srv := &edge.Server{Domain: "example.test", Authenticate: tokens, Clock: func() time.Time { return viewNow }}
	if configure != nil {
		configure(srv)
	}
	tlsLn := listen(t)
	_, srv.TLSPort, _ = net.SplitHostPort(tlsLn.Addr().String())
	te := edgeOn(t, srv, listen(t), listen(t))
	done := make(chan struct{})
	go func() { defer close(done); srv.ServeSNI(tlsLn) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return &viewEdge{te, tlsLn.Addr().String()}
}

// agentOf binds ep with a new agent of who's, and serves h on it, unless
// h is nil (the caller serves the listener).
func (e *viewEdge) agentOf(t testing.TB, who string, ep agent.Endpoint, h http.Handler) *agent.Listener {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: who + "-token", MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	l, err := c.ListenEndpoint(context.Background(), ep)
	if err != nil {
		t.Fatalf("%s binding %s: %v", who, ep.URL, err)
	}
	if h == nil {
		t.Cleanup(func() { c.Close() })
		return l
	}
	hs := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(l) }()
	t.Cleanup(func() { c.Close(); hs.Close(); <-done })
	return l
}

// endpointOf returns the endpoint of eps with url and session (any session
// when empty), failing the test when there is not exactly one.
func endpointOf(t testing.TB, eps []view.Endpoint, url, session string) view.Endpoint {
	t.Helper()
	var found []view.Endpoint
	for _, e := range eps {
		if e.URL == url && (session == "" || e.Session == session) {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d endpoints %s of session %q in %+v, want one", len(found), url, session, eps)
	}
	return found[0]
}

// sessionOf returns the session of ss with id.
func sessionOf(t testing.TB, ss []view.Session, id string) view.Session {
	t.Helper()
	for _, s := range ss {
		if s.ID == id {
			return s
		}
	}
	t.Fatalf("no session %s in %+v", id, ss)
	return view.Session{}
}

// TestSessionsAndEndpoints: four sessions of two identities, each field
// of each session and endpoint, the traffic counted as it passes (HTTP
// requests, a request in flight, a TLS connection passed through), and a
// pool of two.
func TestSessionsAndEndpoints(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	_, httpPort, _ := net.SplitHostPort(e.httpAddr)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)

	if got := e.srv.Sessions(); len(got) != 0 {
		t.Fatalf("Sessions of an edge without agents: %+v", got)
	}
	// alice: a raw session (its ID and address known) binding r, and an
	// agent binding a with a policy and slow; bob: a pool of two.
	raw, hello := dialRaw(t, e.agentAddr, "alice-token", "")
	resp := raw.bind("r", "")
	if resp.BindResp == nil {
		t.Fatalf("bind r: %+v", resp.Error)
	}
	allow := &policy.Spec{CIDRAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	e.agentOf(t, "alice", agent.Endpoint{URL: "http://a", Policy: allow}, nameHandler("a"))
	inFlight, release := make(chan struct{}), make(chan struct{})
	e.agentOf(t, "alice", agent.Endpoint{URL: "http://slow"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inFlight)
		<-release
	}))
	e.agentOf(t, "bob", agent.Endpoint{URL: "http://p", Pool: true}, nameHandler("p1"))
	e.agentOf(t, "bob", agent.Endpoint{URL: "http://p", Pool: true}, nameHandler("p2"))

	sessions := e.srv.Sessions()
	if len(sessions) != 5 {
		t.Fatalf("%d sessions, want 5: %+v", len(sessions), sessions)
	}
	rs := sessionOf(t, sessions, hello.SessionID)
	want := view.Session{
		ID: hello.SessionID, Identity: "alice", Remote: raw.s.LocalAddr().String(), Version: wire.Version, Since: viewNow,
		Endpoints: []view.Endpoint{{
			URL: "http://r.example.test:" + httpPort, Proto: "http", Name: "r.example.test", Identity: "alice",
			Session: hello.SessionID, Tunnel: resp.BindResp.TunnelID, Pool: 1,
		}},
	}
	if !equalSession(rs, want) {
		t.Errorf("raw session: %+v\nwant %+v", rs, want)
	}
	byIdentity := map[string]int{}
	for i, s := range sessions {
		byIdentity[s.Identity]++
		if s.ID != hello.SessionID && (s.Agent != "tunnelkit-agent" || s.Version != wire.Version || !s.Since.Equal(viewNow) || len(s.Endpoints) != 1) {
			t.Errorf("session %d: %+v, want agent tunnelkit-agent, version %d, since %v, one endpoint", i, s, wire.Version, viewNow)
		}
		if i > 0 && sessions[i-1].ID > s.ID {
			t.Errorf("sessions of the same Since not ordered by ID: %s before %s", sessions[i-1].ID, s.ID)
		}
	}
	if byIdentity["alice"] != 3 || byIdentity["bob"] != 2 {
		t.Errorf("sessions by identity: %v, want alice 3, bob 2", byIdentity)
	}

	eps := e.srv.Endpoints()
	urls := make([]string, len(eps))
	for i, ep := range eps {
		urls[i] = strings.TrimSuffix(ep.URL, ":"+httpPort)
	}
	wantURLs := []string{"http://a.example.test", "http://p.example.test", "http://p.example.test", "http://r.example.test", "http://slow.example.test"}
	if !slices.Equal(urls, wantURLs) {
		t.Fatalf("Endpoints' URLs: %v, want %v", urls, wantURLs)
	}
	a := endpointOf(t, eps, "http://a.example.test:"+httpPort, "")
	if !slices.Equal(a.Policy, []string{policy.KindCIDRAllow}) || a.Pool != 1 || a.Identity != "alice" || a.Requests != 0 || a.Conns != 0 || a.BytesIn != 0 || a.BytesOut != 0 {
		t.Errorf("endpoint a before any request: %+v, want policy [cidr_allow], pool 1, alice's, no traffic", a)
	}
	if sessionOf(t, sessions, a.Session).Identity != "alice" {
		t.Errorf("endpoint a's session %s is not alice's", a.Session)
	}
	for _, ep := range eps {
		if ep.Proto == "http" && strings.HasPrefix(ep.URL, "http://p.") && (ep.Pool != 2 || ep.Identity != "bob") {
			t.Errorf("endpoint of bob's pool: %+v, want pool 2", ep)
		}
	}

	// Three requests to a: counted, with their bytes both ways.
	for range 3 {
		if resp, body := get(t, e.testEdge, e.url("a")+"/hello", nil); resp.StatusCode != 200 || body != "a /hello" {
			t.Fatalf("GET a: %d %q", resp.StatusCode, body)
		}
	}
	a = endpointOf(t, e.srv.Endpoints(), a.URL, "")
	if a.Requests != 3 || a.BytesIn < int64(3*len("GET /hello HTTP/1.1\r\n")) || a.BytesOut < int64(3*len("a /hello")) {
		t.Errorf("endpoint a after 3 requests: %+v, want 3 requests and their bytes", a)
	}
	// The client's keep-alive connection keeps its stream to the app
	// open; when the client goes, the stream goes.
	if a.Conns != 1 {
		t.Errorf("endpoint a with the client's connection idle: %d conns, want 1", a.Conns)
	}
	e.httpClient.CloseIdleConnections()
	testwait.For(t, func() bool { return endpointOf(t, e.srv.Endpoints(), a.URL, "").Conns == 0 })

	// A request in flight holds a stream.
	got := make(chan error, 1)
	go func() {
		resp, err := e.httpClient.Get(e.url("slow"))
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	<-inFlight
	slow := endpointOf(t, e.srv.Endpoints(), "http://slow.example.test:"+httpPort, "")
	if slow.Requests != 1 || slow.Conns != 1 {
		t.Errorf("endpoint slow with a request in flight: %+v, want 1 request, 1 conn", slow)
	}
	close(release)
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	// A TLS connection passed through: a request (a connection) and a
	// stream while it lasts, its bytes both ways.
	pki := testpki.New(t)
	cert := pki.Issue(t, "t.example.test")
	tl := e.agentOf(t, "bob", agent.Endpoint{URL: "tls://t.example.test"}, nil)
	if want := "tls://t.example.test:" + tlsPort; tl.URL() != want {
		t.Fatalf("tls endpoint's URL %q, want %q", tl.URL(), want)
	}
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
				io.Copy(tc, tc)
			}()
		}
	}()
	raw2, err := tls.Dial("tcp", e.tlsAddr, &tls.Config{ServerName: "t.example.test", RootCAs: pki.Pool})
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("ping over tls")
	if _, err := raw2.Write(msg); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(raw2, make([]byte, len(msg))); err != nil {
		t.Fatal(err)
	}
	te := endpointOf(t, e.srv.Endpoints(), tl.URL(), "")
	if te.Proto != "tls" || te.Requests != 1 || te.Conns != 1 || te.BytesIn < int64(len(msg)) || te.BytesOut < int64(len(msg)) {
		t.Errorf("tls endpoint with a connection open: %+v, want 1 request, 1 conn, the bytes of a handshake and of the message", te)
	}
	raw2.Close()
	testwait.For(t, func() bool { return endpointOf(t, e.srv.Endpoints(), tl.URL(), "").Conns == 0 })

	// An agent that calls itself names no terminal should print is shown
	// as printable ASCII, cut short.
	hostile := &rawAgent{t, rawSession(t, e.agentAddr)}
	go answerStreams(hostile.s, func(muxado.Stream, wire.StreamType) {})
	hr := hostile.call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: "bob-token", Agent: "evil\x1b[2J\x00" + strings.Repeat("é", 100)}})
	if hr.HelloResp == nil {
		t.Fatalf("hello: %+v", hr.Error)
	}
	if got, want := sessionOf(t, e.srv.Sessions(), hr.HelloResp.SessionID).Agent, "evil?[2J?"+strings.Repeat("?", 55); got != want {
		t.Errorf("a hostile agent's name shown as %q, want %q", got, want)
	}

	// An endpoint the agent unbinds goes from the view; a session that
	// ends goes with its endpoints.
	if resp := raw.call(wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: resp.BindResp.TunnelID}}); resp.Error != nil {
		t.Fatal(resp.Error)
	}
	if s := sessionOf(t, e.srv.Sessions(), hello.SessionID); len(s.Endpoints) != 0 {
		t.Errorf("session after its endpoint's unbind: %+v", s)
	}
	raw.s.Close()
	testwait.For(t, func() bool {
		return !slices.ContainsFunc(e.srv.Sessions(), func(s view.Session) bool { return s.ID == hello.SessionID })
	})
}

func equalSession(a, b view.Session) bool {
	eq := func(x, y view.Endpoint) bool {
		return x.URL == y.URL && x.Proto == y.Proto && x.Name == y.Name && x.Identity == y.Identity && x.Session == y.Session &&
			x.Tunnel == y.Tunnel && slices.Equal(x.Policy, y.Policy) && x.Pool == y.Pool &&
			x.Requests == y.Requests && x.Conns == y.Conns && x.BytesIn == y.BytesIn && x.BytesOut == y.BytesOut
	}
	return a.ID == b.ID && a.Identity == b.Identity && a.Remote == b.Remote && a.Version == b.Version && a.Agent == b.Agent &&
		a.Since.Equal(b.Since) && slices.EqualFunc(a.Endpoints, b.Endpoints, eq)
}

// TestDisconnect: Disconnect closes the identity's sessions and no
// other's; their names are kept for it, or freed, as asked.
func TestDisconnect(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	bob, bobHello := dialRaw(t, e.agentAddr, "bob-token", "")
	for _, free := range []bool{false, true} {
		t.Run(fmt.Sprintf("free=%v", free), func(t *testing.T) {
			name := fmt.Sprintf("x%v", free)
			a1, _ := dialRaw(t, e.agentAddr, "alice-token", "")
			a2, _ := dialRaw(t, e.agentAddr, "alice-token", "")
			if resp := a1.bind(name, ""); resp.BindResp == nil {
				t.Fatalf("alice binding %s: %+v", name, resp.Error)
			}
			if n := e.srv.Disconnect("alice", free); n != 2 {
				t.Fatalf("Disconnect(alice) = %d, want 2", n)
			}
			for _, a := range []*rawAgent{a1, a2} {
				within(t, "the edge closed alice's session", func() { a.s.Wait() })
			}
			for _, s := range e.srv.Sessions() {
				if s.Identity == "alice" {
					t.Fatalf("alice's session %s after Disconnect", s.ID)
				}
			}
			resp := bob.bind(name, "")
			switch {
			case free && resp.BindResp == nil:
				t.Fatalf("bob binding %s, freed by Disconnect: %+v", name, resp.Error)
			case !free && (resp.Error == nil || resp.Error.Code != wire.CodeNameTaken):
				t.Fatalf("bob binding %s, kept for alice: %+v, want name_taken", name, resp)
			}
			if !free {
				a3, _ := dialRaw(t, e.agentAddr, "alice-token", "")
				if resp := a3.bind(name, ""); resp.BindResp == nil {
					t.Fatalf("alice binding %s again, kept for her: %+v", name, resp.Error)
				}
			}
		})
	}
	if n := e.srv.Disconnect("nobody", true); n != 0 {
		t.Errorf("Disconnect(nobody) = %d", n)
	}
	if n := e.srv.Disconnect("", true); n != 0 {
		t.Errorf("Disconnect(\"\") = %d", n)
	}
	dialRaw(t, e.agentAddr, "alice-token", "")
	if n := e.srv.Disconnect("alice", true); n != 1 {
		t.Errorf("Disconnect(alice) = %d, want 1", n)
	}
	sessions := e.srv.Sessions()
	if len(sessions) != 1 || sessions[0].ID != bobHello.SessionID {
		t.Fatalf("sessions left: %+v, want bob's alone", sessions)
	}
	// A Server that never served has no session to show or close.
	var idle edge.Server
	if len(idle.Sessions()) != 0 || len(idle.Endpoints()) != 0 || idle.Disconnect("alice", true) != 0 {
		t.Fatal("a Server that never served shows or closes sessions")
	}
}

// TestDisconnectWhileBinding: Disconnect and snapshots race with an agent
// that binds, unbinds and connects again (run with -race), until it has
// bound 50 times: the snapshots stay consistent, and the edge holds no
// endpoint once the agent is gone.
func TestDisconnectWhileBinding(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "alice-token", MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	defer c.Close()
	stop := make(chan struct{})
	var bound atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			l, err := c.Listen(context.Background(), fmt.Sprintf("http://race%d", i%4))
			if err == nil {
				bound.Add(1)
				l.Close()
			}
		}
	})
	disconnected := 0
	testwait.For(t, func() bool {
		disconnected += e.srv.Disconnect("alice", true)
		for _, s := range e.srv.Sessions() {
			for _, ep := range s.Endpoints {
				if ep.Session != s.ID || ep.Identity != s.Identity {
					t.Errorf("endpoint %+v in session %s of %s", ep, s.ID, s.Identity)
				}
			}
		}
		return bound.Load() >= 50 && disconnected > 0
	})
	close(stop)
	wg.Wait()
	c.Close()
	e.srv.Disconnect("alice", true)
	testwait.For(t, func() bool { return len(e.srv.Endpoints()) == 0 })
}

// events collects what a watch delivers.
type events struct {
	mu  sync.Mutex
	got []view.Event
}

func (ev *events) add(e view.Event) {
	ev.mu.Lock()
	ev.got = append(ev.got, e)
	ev.mu.Unlock()
}

// of returns the events about session, or every event for "".
func (ev *events) of(session string) []view.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []view.Event
	for _, e := range ev.got {
		if session == "" || e.Session == session {
			out = append(out, e)
		}
	}
	return out
}

// kinds returns the kinds of es, with each endpoint's name.
func kinds(es []view.Event) []string {
	var out []string
	for _, e := range es {
		k := string(e.Kind)
		if e.Name != "" {
			k += " " + e.Name
		}
		out = append(out, k)
	}
	return out
}

// TestWatchEvents: a watch hears sessions up and down, binds, unbinds
// and refusals, with who and what, in order; a watch that stopped hears
// nothing more; a watcher that blocks holds up no agent.
func TestWatchEvents(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	var ev events
	stop := e.srv.Watch(ev.add)
	defer stop()
	var early events
	stopEarly := e.srv.Watch(early.add)
	stopEarly()
	stopEarly()
	// A watcher stuck in its first event holds up neither the edge nor
	// the other watchers.
	stuck, release := make(chan struct{}), make(chan struct{})
	var stuckGot events
	stopStuck := e.srv.Watch(func(e view.Event) {
		if len(stuckGot.of("")) == 0 {
			close(stuck)
			<-release
		}
		stuckGot.add(e)
	})
	defer stopStuck()

	a, hello := dialRaw(t, e.agentAddr, "alice-token", "")
	within(t, "the stuck watcher got its first event", func() { <-stuck })
	_, httpPort, _ := net.SplitHostPort(e.httpAddr)
	resp := a.bind("w1", "")
	if resp.BindResp == nil {
		t.Fatal(resp.Error)
	}
	b, bobHello := dialRaw(t, e.agentAddr, "bob-token", "")
	if resp := b.bind("w1", ""); resp.Error == nil || resp.Error.Code != wire.CodeNameTaken {
		t.Fatalf("bob binding alice's name: %+v", resp)
	}
	if resp := a.call(wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: resp.BindResp.TunnelID}}); resp.Error != nil {
		t.Fatal(resp.Error)
	}
	if resp := a.bind("w2", ""); resp.BindResp == nil {
		t.Fatal(resp.Error)
	}
	// A refused hello, before the edge knows who the agent is.
	bad := rawSession(t, e.agentAddr)
	st, err := bad.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write(mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: "stolen"}}))
	var refused wire.Response
	if err := wire.ReadMessage(st, &refused); err != nil || refused.Error == nil || refused.Error.Code != wire.CodeUnauthorized {
		t.Fatalf("hello with a wrong token: %+v, %v", refused, err)
	}
	st.Close()
	e.srv.Disconnect("alice", true)

	testwait.For(t, func() bool { return len(ev.of(hello.SessionID)) == 6 })
	aliceEvents := ev.of(hello.SessionID)
	wantKinds := []string{"session_up", "bind w1.example.test", "unbind w1.example.test", "bind w2.example.test", "unbind w2.example.test", "session_down"}
	if got := kinds(aliceEvents); !slices.Equal(got, wantKinds) {
		t.Fatalf("alice's session's events: %v, want %v", got, wantKinds)
	}
	for _, x := range aliceEvents {
		if x.Identity != "alice" || x.Remote != a.s.LocalAddr().String() || !x.Time.Equal(viewNow) {
			t.Errorf("event %+v: want alice's, from %s, at %v", x, a.s.LocalAddr(), viewNow)
		}
		if x.Kind == view.Bind && x.URL != "http://"+x.Name+":"+httpPort {
			t.Errorf("bind event's URL %q for %s", x.URL, x.Name)
		}
	}
	testwait.For(t, func() bool { return len(ev.of(bobHello.SessionID)) == 2 })
	bobRefused := ev.of(bobHello.SessionID)[1]
	if bobRefused.Kind != view.Refused || bobRefused.Identity != "bob" || bobRefused.Proto != "http" || bobRefused.Name != "w1" ||
		bobRefused.Reason != wire.CodeNameTaken || bobRefused.Message == "" {
		t.Errorf("bob's refused bind: %+v", bobRefused)
	}
	var helloRefused []view.Event
	testwait.For(t, func() bool {
		helloRefused = slices.DeleteFunc(ev.of(""), func(x view.Event) bool {
			return x.Session == hello.SessionID || x.Session == bobHello.SessionID
		})
		return len(helloRefused) == 1
	})
	if x := helloRefused[0]; x.Kind != view.Refused || x.Identity != "" || x.Reason != wire.CodeUnauthorized || x.Session == "" || x.Remote != bad.LocalAddr().String() {
		t.Errorf("refused hello: %+v", x)
	}
	if got := early.of(""); len(got) != 0 {
		t.Errorf("a watch stopped before anything happened got %v", kinds(got))
	}
	close(release)
	testwait.For(t, func() bool { return len(stuckGot.of("")) == len(ev.of("")) })
	if !slices.EqualFunc(stuckGot.of(""), ev.of(""), func(a, b view.Event) bool { return a == b }) {
		t.Errorf("the stuck watcher got %v, the other %v", kinds(stuckGot.of("")), kinds(ev.of("")))
	}
}

// TestWatchCallsBack: a watcher may call the Server: here it disconnects
// bob as soon as his session is up, and reads the sessions. Close ends
// the watch once it had the events of the sessions it closed, and a watch
// after Close hears nothing.
func TestWatchCallsBack(t *testing.T) {
	t.Parallel()
	e := startViewEdge(t, nil)
	var ev events
	stop := e.srv.Watch(func(x view.Event) {
		if x.Kind == view.SessionUp && x.Identity == "bob" {
			e.srv.Sessions()
			e.srv.Disconnect("bob", true)
		}
		ev.add(x)
	})
	defer stop()
	// The watcher may disconnect bob before the answer to his hello
	// reaches him: the hello's answer is not awaited.
	b := &rawAgent{t, rawSession(t, e.agentAddr)}
	go answerStreams(b.s, func(muxado.Stream, wire.StreamType) {})
	if st, err := b.s.OpenStream(); err == nil {
		st.Write(mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: "bob-token"}}))
		var resp wire.Response
		wire.ReadMessage(st, &resp)
		st.Close()
	}
	within(t, "the watcher disconnected bob", func() { b.s.Wait() })
	testwait.For(t, func() bool {
		got := ev.of("")
		return slices.ContainsFunc(got, func(x view.Event) bool { return x.Identity == "bob" && x.Kind == view.SessionDown })
	})
	_, hello := dialRaw(t, e.agentAddr, "alice-token", "")
	e.srv.Close()
	if got := kinds(ev.of(hello.SessionID)); !slices.Equal(got, []string{"session_up", "session_down"}) {
		t.Errorf("alice's events once Close returned: %v", got)
	}
	stop()
	after := e.srv.Watch(func(x view.Event) { t.Errorf("a watch after Close got %+v", x) })
	after()
}

// within runs f, and fails t if it has not returned after
// testwait.DefaultBound (f is left running then).
func within(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(testwait.DefaultBound):
		t.Fatalf("waited %v, and still not: %s", testwait.DefaultBound, what)
	}
}
