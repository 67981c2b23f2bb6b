package edge_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testchrome"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// Real clients against https endpoints: headless Chromium, curl.

// protocolPage is a page whose script writes, into the DOM, which protocol
// the browser loaded it over and the page's name.
func protocolPage(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><html><body><p id="out">script did not run</p><script>
document.getElementById("out").textContent = "page=`+name+` proto=" + performance.getEntriesByType("navigation")[0].nextHopProtocol;
</script></body></html>`)
	})
}

// browser is the Chromium that this package's tests share, with every
// name of example.test resolving to loopback. It takes any certificate:
// each test makes its own, and checks which server answered by the page.
var browser = testchrome.Browser{Args: []string{
	"--host-resolver-rules=MAP *.example.test 127.0.0.1",
	"--ignore-certificate-errors",
}}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := browser.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// chromium loads url in a page of the shared browser and returns the DOM
// once the page has loaded (its inline scripts have run).
func chromium(t testing.TB, url string) string {
	t.Helper()
	page := browser.Page(t, url)
	var dom string
	if err := json.Unmarshal([]byte(page.Eval(t, `document.documentElement.outerHTML`)), &dom); err != nil {
		t.Fatal(err)
	}
	return dom
}

// TestChromiumHTTPSAndTLSOnOnePort: Chromium loads a page from an https
// endpoint (TLS terminated at the edge, HTTP/2) and one from a tls
// endpoint (TLS terminated by the app) on the same port.
func TestChromiumHTTPSAndTLSOnOnePort(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "chromium")
	e := startHTTPSEdge(t, nil)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	l := e.serve(t, agent.Endpoint{URL: "https://web"}, protocolPage("web"))

	appCA := testpki.New(t)
	appCert := appCA.Issue(t, "pass.example.test")
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	tl, err := c.Listen(context.Background(), "tls://pass.example.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go http.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{appCert}, NextProtos: []string{"h2", "http/1.1"}}), protocolPage("pass"))

	dom := chromium(t, l.URL()+"/")
	if !strings.Contains(dom, "page=web proto=h2") {
		t.Errorf("https endpoint: want page=web over h2, DOM:\n%s", dom)
	}
	dom = chromium(t, "https://pass.example.test:"+tlsPort+"/")
	if !strings.Contains(dom, "page=pass proto=h2") {
		t.Errorf("tls endpoint: want page=pass over h2, DOM:\n%s", dom)
	}
}

// TestCurlHTTP2: curl --http2 against an https endpoint and
// --http2-prior-knowledge against the HTTP port.
func TestCurlHTTP2(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "curl")
	e := startHTTPSEdge(t, nil)
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	e.serve(t, agent.Endpoint{URL: "http://plain"}, echoInfo)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	_, httpPort, _ := net.SplitHostPort(e.httpAddr)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, e.pki.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--http2", "--cacert", ca, "--resolve", "app.example.test:" + tlsPort + ":127.0.0.1", "https://app.example.test:" + tlsPort + "/tls"},
			"2 host=app.example.test:" + tlsPort + " proto=HTTP/1.1 xfp=https xff=127.0.0.1 path=/tls"},
		{[]string{"--http2-prior-knowledge", "--resolve", "plain.example.test:" + httpPort + ":127.0.0.1", "http://plain.example.test:" + httpPort + "/h2c"},
			"2 host=plain.example.test:" + httpPort + " proto=HTTP/1.1 xfp=http xff=127.0.0.1 path=/h2c"},
		{[]string{"--http1.1", "--cacert", ca, "--resolve", "app.example.test:" + tlsPort + ":127.0.0.1", "https://app.example.test:" + tlsPort + "/h1"},
			"1.1 host=app.example.test:" + tlsPort + " proto=HTTP/1.1 xfp=https xff=127.0.0.1 path=/h1"},
	} {
		args := append([]string{"-sS", "--max-time", "20", "-w", "%{http_version} ", "-o", "/dev/stderr"}, c.args...)
		cmd := exec.Command("curl", args...)
		var body strings.Builder
		cmd.Stderr = &body
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", c.args, err, body.String())
		}
		if got := string(out) + body.String(); got != c.want {
			t.Errorf("curl %v:\n got %q\nwant %q", c.args, got, c.want)
		}
	}
}

// TestChromiumEventSourceCloseEndsTheHandler: a page opens an EventSource,
// takes two events, and closes it. Behind the tunnel, the app's SSE
// handler ends (its request is cancelled, or its writes fail) soon after,
// as it would with the browser connected directly: over HTTP/1.1 (the
// browser closes its connection) and HTTP/2 (RST_STREAM), with the app
// serving the agent's listener itself and behind the agent's forwarder in
// both modes.
func TestChromiumEventSourceCloseEndsTheHandler(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "chromium")
	e := startHTTPSEdge(t, nil)
	sseEnded := make(chan struct{}, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, `<!doctype html><html><body><p id="out">script did not run</p><script>
const out = document.getElementById("out");
const es = new EventSource("/events");
let n = 0;
es.onmessage = () => {
	if (++n < 2) return;
	es.close();
	fetch("/after-close").then(r => r.text()).then(t => { out.textContent = t; });
};
es.onerror = () => { out.textContent = "event source error"; };
</script></body></html>`)
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			defer func() { sseEnded <- struct{}{} }()
			for i := 0; ; i++ {
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					return
				}
				if rc.Flush() != nil {
					return
				}
				select {
				case <-r.Context().Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				if i > 150 { // 30 s: the browser's close never reached it
					return
				}
			}
		case "/after-close":
			start := time.Now()
			select {
			case <-sseEnded:
				fmt.Fprintf(w, "handler ended %d ms after the close", time.Since(start).Milliseconds())
			case <-time.After(20 * time.Second):
				io.WriteString(w, "handler still running 20 s after the close")
			}
		}
	})
	appAddr := serveAppOn(t, app)
	ways := []struct {
		name  string
		serve func(l *agent.Listener)
	}{
		{"agent forwarding requests", func(l *agent.Listener) { forward.HTTP{To: appAddr}.Serve(l) }},
		{"agent copying bytes", func(l *agent.Listener) { forward.Bytes{To: appAddr}.Serve(l) }},
		{"app serving the listener", func(l *agent.Listener) { http.Serve(l, app) }},
	}
	// One browser for the six pages, each at an endpoint of its own: a
	// Chromium costs more to start than the page does.
	page := browser.Page(t, "about:blank")
	for i, way := range ways {
		for _, scheme := range []string{"http", "https"} {
			t.Run(way.name+"/"+scheme, func(t *testing.T) {
				c := &agent.Client{Addrs: []string{e.agentAddr}}
				l, err := c.Listen(context.Background(), fmt.Sprintf("%s://sse%d%s", scheme, i, scheme))
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() { defer close(done); way.serve(l) }()
				t.Cleanup(func() { c.Close(); <-done })
				page.Navigate(t, l.URL()+"/")
				// The page's answer comes within 20 s of the close.
				page.WaitFor(t, `document.getElementById("out").textContent !== "script did not run"`, 25*time.Second)
				out := page.Eval(t, `document.getElementById("out").textContent`)
				if !strings.Contains(out, "handler ended") {
					t.Fatalf("the SSE handler did not end after EventSource.close(); the page says: %s", out)
				}
				t.Log(out)
			})
		}
	}
}
