package agentcmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// hostForwarder sends each request to the app with the Host of its rule,
// the client's left in X-Forwarded-Host, the rest as it came; an app that
// cannot be reached gets the client a 502 app_unreachable.
func TestHostForwarder(t *testing.T) {
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s xfh=%s xff=%s path=%s query=%s", r.Host, r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-For"), r.URL.Path, r.URL.RawQuery)
	})}
	go app.Serve(appLn)
	defer app.Close()
	to := target{network: "tcp", addr: appLn.Addr().String()}

	for rule, want := range map[string]string{"rewrite": appLn.Addr().String(), "app.local": "app.local"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- hostForwarder{to: to, host: to.hostHeader(rule), logger: slog.New(slog.DiscardHandler)}.Serve(ln)
		}()
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/a/b?x=1;y", nil)
		req.Host = "abc.example.test"
		req.Header.Set("X-Forwarded-Host", "abc.example.test")
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if w := "host=" + want + " xfh=abc.example.test xff=203.0.113.7 path=/a/b query=x=1;y"; string(b) != w {
			t.Errorf("rule %q: the app saw %q, want %q", rule, b, w)
		}
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}

	// An app that is not there.
	gone, _ := net.Listen("tcp", "127.0.0.1:0")
	goneAddr := gone.Addr().String()
	gone.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	var log testtools.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	go hostForwarder{to: target{network: "tcp", addr: goneAddr}, host: "x", logger: logger}.Serve(ln)
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("Tunnelkit-Request-Id")
	if want := "app_unreachable: the app behind the tunnel cannot be reached\nrequest id: " + id + "\n"; resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != "app_unreachable" || id == "" || string(b) != want {
		t.Errorf("an app that is not there: %d %q; want 502 %q", resp.StatusCode, b, want)
	}
	// The warning, written before the answer, has the detail under the
	// answer's request ID.
	if !strings.Contains(log.String(), "request_id="+id) || !strings.Contains(log.String(), "dial tcp "+goneAddr) {
		t.Errorf("log:\n%s\nwant request_id=%s with the dial's error", log.String(), id)
	}
}

// TestHostForwarderInAPool: a pool of two members whose agents rewrite
// the Host (-host-header), one of whose apps is down: the dead member's
// agent rejects each conn before reading it, and the edge sends the
// request to the other; no request fails.
func TestHostForwarderInAPool(t *testing.T) {
	agents, pub := listenLocal(t), listenLocal(t)
	srv := &edge.Server{Domain: "example.test", Authenticate: func(context.Context, string) (string, error) { return "team", nil }}
	go srv.ServeAgents(agents)
	go srv.ServeHTTPListener(pub)
	defer srv.Close()

	appLn := listenLocal(t)
	go http.Serve(appLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "host=%s", r.Host) }))
	gone := listenLocal(t)
	goneAddr := gone.Addr().String()
	gone.Close()
	for _, to := range []string{appLn.Addr().String(), goneAddr} {
		c := &agent.Client{Addrs: []string{agents.Addr().String()}, Token: "t"}
		defer c.Close()
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pooled", Pool: true})
		if err != nil {
			t.Fatal(err)
		}
		tgt := target{network: "tcp", addr: to}
		done := make(chan error, 1)
		go func() {
			done <- hostForwarder{to: tgt, host: "app.local", logger: slog.New(slog.DiscardHandler)}.Serve(l)
		}()
		defer func() { l.Close(); <-done }()
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 20 {
		req, _ := http.NewRequest("GET", "http://"+pub.Addr().String()+"/", nil)
		req.Host = "pooled.example.test"
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "host=app.local" {
			t.Fatalf("request %d: %d %q, want the live member's app", i, resp.StatusCode, b)
		}
	}
}

func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
