package examples_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// pathApp serves, on loopback until the test ends, an app that answers
// with its name, the request target it got and its X-Forwarded-Prefix;
// it returns its address.
func pathApp(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s xfp=%q", name, r.RequestURI, r.Header.Values("X-Forwarded-Prefix"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// rawGet sends "GET target" to addr as it is (Go's client would clean the
// path, as curl does without --path-as-is), for host, and returns the
// status and body.
func rawGet(t *testing.T, addr, host, target string) (int, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", target, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPathTable: three agent processes of one token's identity serve /,
// /api and /api/v2 (the last from a -config file, with strip_prefix) of
// one name; each request, sent as it is, goes to the longest path its
// cleaned path is under; another identity gets no path of the name, and a
// path on a tls URL is refused before the agent binds. Issue #41, item 6.
func TestPathTable(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	tk := filepath.Join(build(t, "tunnelkit"), "tunnelkit")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens.txt", "alice-token alice\nbob-token bob\n")
	startCmd(t, nil, tk, "edge", "-agents", agents, "-http", pub, "-domain", "example.test", "-tokens", tokens)
	waitListening(t, agents)
	_, port, _ := net.SplitHostPort(pub)

	root := startCmd(t, nil, tk, "agent", "-edge", agents, "-token", "alice-token", "-state", "", "-url", "http://site", "-to", pathApp(t, "root"))
	api := startCmd(t, nil, tk, "agent", "-edge", agents, "-token", "alice-token", "-state", "", "-url", "http://site/api", "-to", pathApp(t, "api"))
	cfg := writeFile(t, dir, "v2.yml", fmt.Sprintf("edge: %s\ntoken: alice-token\nstate: \"\"\nendpoints:\n  - url: http://site/api/v2\n    to: %s\n    strip_prefix: true\n", agents, pathApp(t, "v2")))
	v2 := startCmd(t, nil, tk, "agent", "-config", cfg)
	for _, c := range []struct {
		p    *cmdProc
		want string
	}{{root, ""}, {api, "/api"}, {v2, "/api/v2"}} {
		if got, want := c.p.line(t), "http://site.example.test:"+port+c.want; got != want {
			t.Errorf("the agent printed %q, want %q", got, want)
		}
	}

	host := "site.example.test:" + port
	for _, c := range []struct{ target, want string }{
		{"/", `root / xfp=[]`},
		{"/apix", `root /apix xfp=[]`},
		{"/api", `api /api xfp=[]`},
		{"/api/", `api /api/ xfp=[]`},
		{"/API", `root /API xfp=[]`},
		{"/api/../admin", `root /api/../admin xfp=[]`},
		{"/api%2Fx", `root /api%2Fx xfp=[]`},
		{"//api", `api /api xfp=[]`},
		{"/api/x?q=1&r=/api/v2", `api /api/x?q=1&r=/api/v2 xfp=[]`},
		{"/api/v2", `v2 / xfp=["/api/v2"]`},
		{"/api/v2/users/7?full=1", `v2 /users/7?full=1 xfp=["/api/v2"]`},
		{"/api/v2x", `api /api/v2x xfp=[]`},
		{"/api/%2e%2e/api/v2/x", `v2 /x xfp=["/api/v2"]`},
	} {
		if status, body := rawGet(t, pub, host, c.target); status != 200 || body != c.want {
			t.Errorf("GET %s: %d %q; want 200 %q", c.target, status, body, c.want)
		}
	}

	// Another identity: no path of alice's name, bound or not.
	for _, url := range []string{"http://site/bob", "http://site/api"} {
		code, out := tunnelkitOut(t, "agent", "-edge", agents, "-token", "bob-token", "-state", "", "-url", url, "-to", pathApp(t, "bob"))
		if code == 0 || !strings.Contains(out, "held by another owner") {
			t.Errorf("bob's agent for %s: exit %d\n%s\nwant a refusal that says the name is another's", url, code, out)
		}
	}
	// Alice's fourth agent, the same path without pool.
	code, out := tunnelkitOut(t, "agent", "-edge", agents, "-token", "alice-token", "-state", "", "-url", "http://site/api", "-to", pathApp(t, "again"))
	if code == 0 || !strings.Contains(out, "not shared") {
		t.Errorf("alice's other agent for /api without -pool: exit %d\n%s\nwant a refusal that says it is not shared", code, out)
	}
	// A path on a tls URL, refused before the bind.
	code, out = tunnelkitOut(t, "agent", "-edge", agents, "-token", "alice-token", "-state", "", "-url", "tls://site.example.test/api", "-to", "3000")
	if code == 0 || !strings.Contains(out, "a path routes HTTP requests") {
		t.Errorf("a path on a tls URL: exit %d\n%s", code, out)
	}
	if status, body := rawGet(t, pub, host, "/api/x"); status != 200 || body != `api /api/x xfp=[]` {
		t.Errorf("after the refusals, /api/x: %d %q", status, body)
	}
}

// TestPathAcrossCluster: two edge processes share routes on etcd; an
// agent on A serves the whole name and /api (stripped) of it; a request
// for /api/x that B takes goes, through the relay, to /api's app,
// stripped.
func TestPathAcrossCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	tk := filepath.Join(build(t, "tunnelkit"), "tunnelkit")
	dir, ca, etcd := startClusterFiles(t)
	_, tcpPort, _ := net.SplitHostPort(freePort(t))
	a := startClusterEdge(t, tk, "A", "127.0.0.1", etcd.Endpoint, tcpPort, dir, ca)
	b := startClusterEdge(t, tk, "B", "127.0.0.1", etcd.Endpoint, tcpPort, dir, ca)
	cfg := writeFile(t, dir, "agent.yml", fmt.Sprintf("edge: %s\nstate: \"\"\nendpoints:\n  - url: http://far\n    to: %s\n  - url: http://far/api\n    to: %s\n    strip_prefix: true\n",
		a.agents, pathApp(t, "root"), pathApp(t, "api")))
	ag := startCmd(t, nil, tk, "agent", "-config", cfg)
	ag.line(t)
	ag.line(t)
	host := "far.example.test"
	testwait.Until(t, 30*time.Second, "/api/x through B", func() error {
		if status, body := rawGet(t, b.http, host, "/api/x?y=1"); status != 200 || body != `api /x?y=1 xfp=["/api"]` {
			return fmt.Errorf("%d %q", status, body)
		}
		return nil
	})
	if status, body := rawGet(t, b.http, host, "/apix"); status != 200 || body != `root /apix xfp=[]` {
		t.Errorf("/apix through B: %d %q", status, body)
	}
}
