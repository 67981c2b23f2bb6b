package edge_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// pathApp answers with its name, the request target it got (path and
// query, as they came), and its X-Forwarded-Prefix values.
func pathApp(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s xfp=%q", name, r.RequestURI, r.Header.Values("X-Forwarded-Prefix"))
	})
}

// startPathEdge is an https edge whose agents' identity is their token.
func startPathEdge(t testing.TB) *httpsEdge {
	return startHTTPSEdge(t, func(s *edge.Server) { s.Authenticate = identityIsToken })
}

// servePath binds ep with an agent of its own, of token's identity, and
// serves h on it (HTTP/1.1, and HTTP/2 with prior knowledge for an h2c
// endpoint). It returns the listener, or the bind's error.
func servePath(t testing.TB, e *httpsEdge, token string, ep agent.Endpoint, h http.Handler) (*agent.Listener, error) {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: token}
	l, err := c.ListenEndpoint(context.Background(), ep)
	if err != nil {
		c.Close()
		return nil, err
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: h, Protocols: p}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(l) }()
	t.Cleanup(func() { c.Close(); hs.Close(); <-done })
	return l, nil
}

func mustServePath(t testing.TB, e *httpsEdge, token string, ep agent.Endpoint, h http.Handler) *agent.Listener {
	t.Helper()
	l, err := servePath(t, e, token, ep, h)
	if err != nil {
		t.Fatalf("bind %s: %v", ep.URL, err)
	}
	return l
}

// rawRequest sends a request line of target, as it is (no client cleans
// it), for host to addr with the header lines extra, and returns the
// response's status and body.
func rawRequest(t testing.TB, addr, method, target, host string, extra ...string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	req := method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n"
	for _, h := range extra {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, target, err)
	}
	return resp.StatusCode, string(b)
}

// TestPathRouting: one identity's three agents serve /, /api and /api/v2
// of one name, a fourth /strip with StripPrefix; each request goes to the
// longest prefix its cleaned path is under, and the app of a path gets
// the cleaned path (stripped, with X-Forwarded-Prefix, where asked).
func TestPathRouting(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://site"}, pathApp("root"))
	api := mustServePath(t, e, "alice", agent.Endpoint{URL: "http://site/api"}, pathApp("api"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://site/api/v2/"}, pathApp("v2"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://site/strip", StripPrefix: true}, pathApp("strip"))
	_, port, _ := net.SplitHostPort(e.httpAddr)
	if want := "http://site.example.test:" + port + "/api"; api.URL() != want {
		t.Errorf("URL = %q, want %q", api.URL(), want)
	}
	host := "site.example.test:" + port
	for _, c := range []struct {
		target string
		extra  []string
		want   string
	}{
		{"/", nil, `root / xfp=[]`},
		{"/x", nil, `root /x xfp=[]`},
		{"/api", nil, `api /api xfp=[]`},
		{"/api/", nil, `api /api/ xfp=[]`},
		{"/api/x?q=1&next=/api/v2", nil, `api /api/x?q=1&next=/api/v2 xfp=[]`},
		{"/apix", nil, `root /apix xfp=[]`},
		{"/API", nil, `root /API xfp=[]`},
		{"/api%2Fx", nil, `root /api%2Fx xfp=[]`},
		{"/api%2fv2/x", nil, `root /api%2fv2/x xfp=[]`},
		{"//api", nil, `api /api xfp=[]`},
		{"/api/../admin", nil, `root /api/../admin xfp=[]`}, // the whole name's app gets it as it came
		{"/admin/../api/x", nil, `api /api/x xfp=[]`},
		{"/api/%2e%2e/api/v2/", nil, `v2 /api/v2/ xfp=[]`},
		{"/%61pi/v2/x", nil, `v2 /api/v2/x xfp=[]`},
		{"/api/v2", nil, `v2 /api/v2 xfp=[]`},
		{"/api/v2x", nil, `api /api/v2x xfp=[]`},
		{"/api/v3/y", nil, `api /api/v3/y xfp=[]`},
		{"http://" + host + "/api/v2/abs", nil, `v2 /api/v2/abs xfp=[]`}, // absolute form
		// Stripped: the path without the prefix, always from "/", the
		// query kept; X-Forwarded-Prefix is the edge's alone.
		{"/strip", nil, `strip / xfp=["/strip"]`},
		{"/strip/", nil, `strip / xfp=["/strip"]`},
		{"/strip/a/b/?x=1", nil, `strip /a/b/?x=1 xfp=["/strip"]`},
		{"/strip//a/./b", nil, `strip /a/b xfp=["/strip"]`},
		{"/strip/a", []string{"X-Forwarded-Prefix: /evil"}, `strip /a xfp=["/strip"]`},
		{"/strip/a", []string{"Connection: X-Forwarded-Prefix", "X-Forwarded-Prefix: /evil"}, `strip /a xfp=["/strip"]`},
		{"/stripped", nil, `root /stripped xfp=[]`},
		{"/api", []string{"X-Forwarded-Prefix: /evil"}, `api /api xfp=[]`},
	} {
		status, body := rawRequest(t, e.httpAddr, "GET", c.target, host, c.extra...)
		if status != 200 || body != c.want {
			t.Errorf("GET %s %q: %d %q; want 200 %q", c.target, c.extra, status, body, c.want)
		}
	}

	// HTTP/2 (h2c on the HTTP port, h2 on the TLS port, whose https
	// endpoints route by path too) and HTTP/1.1 clients, as Go sends them.
	mustServePath(t, e, "alice", agent.Endpoint{URL: "https://secure/app", StripPrefix: true}, pathApp("secure-app"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "https://secure"}, pathApp("secure-root"))
	for _, c := range []struct {
		client *http.Client
		url    string
		want   string
	}{
		{e.plainClient(t, true), "http://site.example.test/strip/h2?y=2", `strip /h2?y=2 xfp=["/strip"]`},
		{e.plainClient(t, false), "http://site.example.test/api/v2/h1", `v2 /api/v2/h1 xfp=[]`},
		{e.client(t, true), "https://secure.example.test/app/x", `secure-app /x xfp=["/app"]`},
		{e.client(t, true), "https://secure.example.test/appx", `secure-root /appx xfp=[]`},
		{e.client(t, false), "https://secure.example.test/app", `secure-app / xfp=["/app"]`},
	} {
		resp, err := c.client.Get(c.url)
		if body := readAll(t, resp, err); resp.StatusCode != 200 || body != c.want {
			t.Errorf("GET %s: %d %q; want 200 %q", c.url, resp.StatusCode, body, c.want)
		}
	}
}

// TestPathsWithoutTheWholeName: a name whose endpoints all have paths
// answers other paths 404 no_endpoint.
func TestPathsWithoutTheWholeName(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://only/api"}, pathApp("api"))
	_, port, _ := net.SplitHostPort(e.httpAddr)
	if status, body := rawRequest(t, e.httpAddr, "GET", "/api/x", "only.example.test:"+port); status != 200 || body != `api /api/x xfp=[]` {
		t.Errorf("/api/x: %d %q", status, body)
	}
	for _, target := range []string{"/", "/apix", "/x/api"} {
		status, body := rawRequest(t, e.httpAddr, "GET", target, "only.example.test:"+port)
		if status != 404 || !strings.HasPrefix(body, "no_endpoint: ") {
			t.Errorf("%s: %d %q; want 404 no_endpoint", target, status, body)
		}
	}
}

// TestPathOwnership: the paths of a name are its owner's, each a pool of
// its own; a path on a tls or tcp endpoint is refused, by the agent before
// it binds and by the edge for a raw bind.
func TestPathOwnership(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://owned"}, pathApp("root"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://owned/api"}, pathApp("api"))
	for _, c := range []struct {
		token string
		ep    agent.Endpoint
	}{
		{"bob", agent.Endpoint{URL: "http://owned/bob"}},                // another identity, a free path
		{"bob", agent.Endpoint{URL: "http://owned/api", Pool: true}},    // another identity, a pool
		{"bob", agent.Endpoint{URL: "http://x.owned.example.test/bob"}}, // another identity, under the name
		{"alice", agent.Endpoint{URL: "http://owned/api"}},              // the owner's other agent, no pool
		{"alice", agent.Endpoint{URL: "http://owned/x/../api/"}},        // the same path, spelled otherwise
		{"alice", agent.Endpoint{URL: "http://owned/api", Pool: true}},  // a pool the first did not ask for
	} {
		if _, err := servePath(t, e, c.token, c.ep, pathApp("intruder")); !errors.Is(err, agent.ErrNameTaken) {
			t.Errorf("%s binds %s (pool %v): %v; want ErrNameTaken", c.token, c.ep.URL, c.ep.Pool, err)
		}
	}
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://owned/API"}, pathApp("API")) // case matters
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://owned/pool", Pool: true}, pathApp("pool-1"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://owned/pool", Pool: true}, pathApp("pool-2"))
	if _, err := servePath(t, e, "alice", agent.Endpoint{URL: "http://owned/pool", Pool: true, StripPrefix: true}, pathApp("pool-3")); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("a pool's member that strips, the others not: %v; want ErrNameTaken", err)
	}
	_, port, _ := net.SplitHostPort(e.httpAddr)
	seen := map[string]bool{}
	for range 4 {
		_, body := rawRequest(t, e.httpAddr, "GET", "/pool/x", "owned.example.test:"+port)
		seen[strings.Fields(body)[0]] = true
	}
	if !seen["pool-1"] || !seen["pool-2"] {
		t.Errorf("the pool of /pool answered from %v; want both members", seen)
	}
	if _, body := rawRequest(t, e.httpAddr, "GET", "/API", "owned.example.test:"+port); !strings.HasPrefix(body, "API ") {
		t.Errorf("/API: %q", body)
	}

	// The agent refuses what no edge could do, before binding.
	for _, ep := range []agent.Endpoint{
		{URL: "tls://owned.example.test/api"},
		{URL: "tcp://:20001/api"},
		{URL: "http://owned", StripPrefix: true},
		{URL: "https://owned/a%zz"},
		{URL: "https://owned/api", Policy: &policy.Spec{OIDC: &policy.OIDC{Issuer: "https://id.example.com", ClientID: "c", AllowDomains: []string{"example.com"}}}},
	} {
		_, err := servePath(t, e, "alice", ep, pathApp("x"))
		if err == nil || errors.Is(err, agent.ErrRefused) || errors.Is(err, agent.ErrNameTaken) {
			t.Errorf("%s (strip %v): %v; want the agent's own error", ep.URL, ep.StripPrefix, err)
		}
	}

	// The edge refuses the same from an agent that does not check.
	s := rawSession(t, e.agentAddr)
	call := func(req wire.Request) wire.Response { return rawCall(t, s, req) }
	if resp := call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: "alice"}}); resp.HelloResp == nil {
		t.Fatalf("hello: %+v", resp.Error)
	}
	for _, c := range []struct {
		bind   wire.Bind
		reason string
	}{
		{wire.Bind{Proto: "tls", Name: "raw-tls", Options: map[string]string{wire.OptPath: "/api"}}, "carry no request path"},
		{wire.Bind{Proto: "tcp", Options: map[string]string{wire.OptPath: "/api"}}, "carry no request path"},
		{wire.Bind{Proto: "tls", Name: "raw-tls", Options: map[string]string{wire.OptStripPrefix: "true"}}, "carry no request path"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptStripPrefix: "true"}}, "needs a path prefix"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/", wire.OptStripPrefix: "true"}}, "needs a path prefix"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/api", wire.OptStripPrefix: "yes"}}, "want true or false"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "api"}}, "starts with /"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/a b"}}, "percent-encoded"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/a?b"}}, "no query"},
		{wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/" + strings.Repeat("a", 2000)}}, "at most 1024"},
		{wire.Bind{Proto: "https", Name: "raw", Options: map[string]string{wire.OptPath: "/api", wire.OptPolicy: wire.PolicyVersion},
			Policy: []byte(`{"oidc":{"issuer":"https://id.example.com","client_id":"c","allow_domains":["example.com"]}}`)}, "callback"},
	} {
		resp := call(wire.Request{Op: wire.OpBind, Bind: &c.bind})
		if resp.Error == nil || resp.Error.Code != wire.CodeBadRequest || !strings.Contains(resp.Error.Message, c.reason) {
			t.Errorf("raw bind %+v: %+v, %+v; want bad_request: ...%s", c.bind, resp.BindResp, resp.Error, c.reason)
		}
	}
	resp := call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/x/../%61pi/"}}})
	if resp.BindResp == nil || !strings.HasSuffix(resp.BindResp.URL, "/api") {
		t.Fatalf("raw bind of /x/../%%61pi/: %+v, %+v; want a URL ending in /api", resp.BindResp, resp.Error)
	}
	// A replace keeps the path: another path, or none, is refused.
	for _, opts := range []map[string]string{{wire.OptPath: "/other"}, nil} {
		r := call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: "http", Name: "raw", Options: opts, Replaces: resp.BindResp.TunnelID}})
		if r.Error == nil || r.Error.Code != wire.CodeBadRequest || !strings.Contains(r.Error.Message, "keeps the path") {
			t.Errorf("a replace with options %v: %+v, %+v; want bad_request: ...keeps the path", opts, r.BindResp, r.Error)
		}
	}
	r := call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: "http", Name: "raw", Options: map[string]string{wire.OptPath: "/api/", wire.OptStripPrefix: "true"}, Replaces: resp.BindResp.TunnelID}})
	if r.BindResp == nil || !strings.HasSuffix(r.BindResp.URL, "/api") {
		t.Errorf("a replace that keeps the path and strips: %+v, %+v", r.BindResp, r.Error)
	}
}

// TestPathRouterWithoutPaths: an edge whose Router does not route by path
// refuses a bind with one, rather than bind the whole name.
func TestPathRouterWithoutPaths(t *testing.T) {
	t.Parallel()
	e := startHTTPSEdge(t, func(s *edge.Server) { s.Router = noPaths{&router.MemoryRouter{}} })
	_, err := servePath(t, e, "", agent.Endpoint{URL: "http://nopaths/api"}, pathApp("api"))
	if !errors.Is(err, agent.ErrRefused) || !strings.Contains(err.Error(), "does not route by path") {
		t.Errorf("bind with a path through a Router without paths: %v; want ErrRefused, saying why", err)
	}
	mustServePath(t, e, "", agent.Endpoint{URL: "http://nopaths"}, pathApp("root"))
}

// noPaths is a Router that does not implement router.PathRouter.
type noPaths struct{ m *router.MemoryRouter }

func (n noPaths) Bind(ctx context.Context, r router.Route) error { return n.m.Bind(ctx, r) }
func (n noPaths) Unbind(ctx context.Context, r router.Route, d time.Duration) error {
	return n.m.Unbind(ctx, r, d)
}
func (n noPaths) Lookup(ctx context.Context, proto, host string) ([]router.Route, error) {
	return n.m.Lookup(ctx, proto, host)
}

// TestPathPolicy: each path has its own traffic policy, and a path spelled
// otherwise is the path it cleans to: it gets that path's policy.
func TestPathPolicy(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://pol"}, pathApp("root"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://pol/admin", Policy: &policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:s3cret"}}}}, pathApp("admin"))
	_, port, _ := net.SplitHostPort(e.httpAddr)
	host := "pol.example.test:" + port
	for _, target := range []string{"/admin", "/admin/", "/admin/x", "/%61dmin/x", "/x/../admin", "//admin", "/admin/./x", "/%2e/admin"} {
		if status, body := rawRequest(t, e.httpAddr, "GET", target, host); status != 401 || !strings.HasPrefix(body, "unauthorized: ") {
			t.Errorf("%s without credentials: %d %q; want 401 unauthorized", target, status, body)
		}
	}
	auth := "Authorization: Basic YW5uOnMzY3JldA==" // ann:s3cret
	if status, body := rawRequest(t, e.httpAddr, "GET", "/%61dmin/x", host, auth); status != 200 || body != `admin /admin/x xfp=[]` {
		t.Errorf("/%%61dmin/x with credentials: %d %q", status, body)
	}
	for _, target := range []string{"/", "/adminx", "/ADMIN", "/admin%2Fx"} {
		if status, body := rawRequest(t, e.httpAddr, "GET", target, host); status != 200 || !strings.HasPrefix(body, "root ") {
			t.Errorf("%s: %d %q; want the whole name's app, without a login", target, status, body)
		}
	}
}

// TestPathWebSocketAndGRPC: an upgrade to WebSocket under a stripped path
// reaches its app with the path stripped; HTTP/2 requests of a gRPC
// service's prefix reach its h2c app whole.
func TestPathWebSocketAndGRPC(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://rt"}, pathApp("root"))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://rt/ws", StripPrefix: true}, websocket.Handler(func(ws *websocket.Conn) {
		var msg string
		for websocket.Message.Receive(ws, &msg) == nil {
			websocket.Message.Send(ws, ws.Request().RequestURI+" "+ws.Request().Header.Get("X-Forwarded-Prefix")+" "+msg)
		}
	}))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "https://rt/echo.Echo/", AppProtocol: "h2c"}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path)
		w.Header().Set("Grpc-Status", "0")
	}))
	mustServePath(t, e, "alice", agent.Endpoint{URL: "https://rt"}, pathApp("secure-root"))

	_, port, _ := net.SplitHostPort(e.httpAddr)
	cfg, err := websocket.NewConfig("ws://rt.example.test:"+port+"/ws/chat?room=1", "http://rt.example.test/")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", e.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, msg := range []string{"one", "two"} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil {
			t.Fatal(err)
		}
		if want := "/chat?room=1 /ws " + msg; got != want {
			t.Errorf("websocket: %q, want %q", got, want)
		}
	}

	c := e.client(t, true)
	for _, c := range []struct{ url, want string }{
		{"https://rt.example.test/echo.Echo/Stream", "HTTP/2.0 /echo.Echo/Stream"},
		{"https://rt.example.test/echo.Other/Stream", `secure-root /echo.Other/Stream xfp=[]`},
	} {
		req, _ := http.NewRequest("POST", c.url, strings.NewReader("x"))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		resp, err := e.client(t, true).Do(req)
		if body := readAll(t, resp, err); resp.StatusCode != 200 || body != c.want {
			t.Errorf("POST %s: %d %q; want %q", c.url, resp.StatusCode, body, c.want)
		}
	}
	_ = c
}

// TestPathUpdate: Update keeps an endpoint's path and may change its
// StripPrefix; an Update naming another path is refused.
func TestPathUpdate(t *testing.T) {
	t.Parallel()
	e := startPathEdge(t)
	mustServePath(t, e, "alice", agent.Endpoint{URL: "http://upd"}, pathApp("root"))
	l := mustServePath(t, e, "alice", agent.Endpoint{URL: "http://upd/api"}, pathApp("api"))
	_, port, _ := net.SplitHostPort(e.httpAddr)
	host := "upd.example.test:" + port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Update(ctx, agent.Endpoint{URL: "http://upd/other"}); err == nil {
		t.Error("Update to another path succeeded")
	}
	if err := l.Update(ctx, agent.Endpoint{StripPrefix: true}); err != nil {
		t.Fatalf("Update with an empty URL, stripping: %v", err)
	}
	testwait.For(t, func() bool {
		_, body := rawRequest(t, e.httpAddr, "GET", "/api/x", host)
		return body == `api /x xfp=["/api"]`
	})
	if err := l.Update(ctx, agent.Endpoint{URL: "http://upd/api/"}); err != nil {
		t.Fatalf("Update naming its path: %v", err)
	}
	testwait.For(t, func() bool {
		_, body := rawRequest(t, e.httpAddr, "GET", "/api/x", host)
		return body == `api /api/x xfp=[]`
	})
}

// TestPathAcrossEdges: in a cluster, a request that edge B takes for a
// path of a name whose agent is on edge A goes, by its path, to that
// agent, stripped by B.
func TestPathAcrossEdges(t *testing.T) {
	t.Parallel()
	edges := startClusterOf(t, testpki.New(t), &router.MemoryRouter{}, func(s *edge.Server, _ *relay.Relay) { s.Authenticate = identityIsToken }, "127.0.0.1", "127.0.0.1")
	a, b := edges[0], edges[1]
	for _, ep := range []struct {
		url   string
		strip bool
		name  string
	}{{"http://far", false, "root"}, {"http://far/api", true, "api"}} {
		c := &agent.Client{Addrs: []string{a.agentAddr}, Token: "alice"}
		t.Cleanup(func() { c.Close() })
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: ep.url, StripPrefix: ep.strip})
		if err != nil {
			t.Fatal(err)
		}
		go http.Serve(l, pathApp(ep.name))
	}
	_, port, _ := net.SplitHostPort(b.httpAddr)
	host := "far.example.test:" + port
	for target, want := range map[string]string{
		"/api/x?y=1": `api /x?y=1 xfp=["/api"]`,
		"//api":      `api / xfp=["/api"]`,
		"/apix":      `root /apix xfp=[]`,
	} {
		if status, body := rawRequest(t, b.httpAddr, "GET", target, host); status != 200 || body != want {
			t.Errorf("via edge B, %s: %d %q; want 200 %q", target, status, body, want)
		}
	}
}
