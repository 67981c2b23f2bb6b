package examples_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// The agent as issue 35 has it, through the built binaries: many endpoints
// from a -config file on one session, SIGHUP, the shorthand, -state after
// kill -9, mistyped flags, strict YAML and ${VAR}.

// cmdProc is a binary a test runs: its stdout line by line, its stderr kept.
type cmdProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *testtools.Buffer
	killed bool
}

// startCmd runs bin with args, and env added to the test's environment.
// At the test's end it gets SIGINT and must exit cleanly, unless killed.
func startCmd(t *testing.T, env []string, bin string, args ...string) *cmdProc {
	t.Helper()
	p := &cmdProc{cmd: exec.Command(bin, args...), lines: make(chan string, 100), stderr: &testtools.Buffer{}}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		if p.killed {
			return
		}
		p.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v\n%s", filepath.Base(bin), err, p.stderr.String())
			}
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			t.Errorf("%s did not exit on SIGINT\n%s", filepath.Base(bin), p.stderr.String())
		}
	})
	return p
}

// line returns the next line the process prints on stdout.
func (p *cmdProc) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s ended without printing a line\n%s", filepath.Base(p.cmd.Path), p.stderr.String())
		}
		return l
	case <-time.After(time.Minute):
		t.Fatalf("%s printed no line within a minute\n%s", filepath.Base(p.cmd.Path), p.stderr.String())
	}
	return ""
}

// kill kills the process as kill -9 does, and waits for its end.
func (p *cmdProc) kill() {
	p.killed = true
	p.cmd.Process.Kill()
	p.cmd.Wait()
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// viaEdge is a client that reaches every name at the edge's public
// address.
func viaEdge(addr string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
}

// fetch GETs url through the edge at addr, with basic auth when user is
// not empty, and returns the status and body.
func fetch(t *testing.T, addr, url, user, password string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := viaEdge(addr).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// echoServer echoes each connection's first line, and returns its
// address.
func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	serveConns(ln, func(c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		io.WriteString(c, "echo: "+line)
	})
	return ln.Addr().String()
}

// TestAgentConfig runs one agent with a -config file of three endpoints,
// on an edge with a -config file of its own: an http endpoint to a port
// given alone, an https one (TLS ends at the edge) to an app that speaks
// TLS (its certificate checked against to_ca, basic auth with a password
// from ${VAR}) and a tcp one.
// All three work, over one session; the token comes from ${VAR} on both
// sides.
func TestAgentConfig(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	agents, pub, tlsPub := freePort(t), freePort(t), freePort(t)
	_, tcpPort, _ := net.SplitHostPort(freePort(t))
	_, httpPort, _ := net.SplitHostPort(pub)
	_, httpsPort, _ := net.SplitHostPort(tlsPub)
	env := []string{"TK_TEST_TOKEN=s3cret-token", "TK_TEST_PW=pass word"}

	// The edge's certificate for https endpoints, of a CA the test's
	// client trusts.
	edgeCA := testpki.New(t)
	certPEM, keyPEM := testpki.PEMFiles(t, edgeCA.Issue(t, "*.example.test"))
	edgeConfig := writeFile(t, dir, "edge.yml", fmt.Sprintf(`# the edge of TestAgentConfig
agents: %s
http: %s
tls: %s
cert: %s
key: %s
domain: example.test
tcp_ports: %s
tokens:
  - token: ${TK_TEST_TOKEN}
    identity: team-a
`, agents, pub, tlsPub, writeFile(t, dir, "edge.pem", string(certPEM)), writeFile(t, dir, "edge-key.pem", string(keyPEM)), tcpPort))
	startCmd(t, env, filepath.Join(bin, "tunnelkit"), "edge", "-config", edgeConfig)
	waitListening(t, agents)

	// The apps: plain HTTP on a port, HTTPS with a certificate of a CA
	// of the test's own, a TCP echo.
	_, plainPort, _ := net.SplitHostPort(localHTTPApp(t, "plain app"))
	ca := testpki.New(t)
	caFile := writeFile(t, dir, "app-ca.pem", string(ca.PEM))
	tlsLn, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	tlsApp := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls app: tls=%v user=%s", r.TLS != nil, r.Header.Get("Tunnelkit-Auth-User"))
	})}
	go tlsApp.Serve(tlsLn)
	t.Cleanup(func() { tlsApp.Close() })
	echo := echoServer(t)

	agentConfig := writeFile(t, dir, "agent.yml", fmt.Sprintf(`edge: %s
token: ${TK_TEST_TOKEN}
state: ""
endpoints:
  - url: http://plain
    to: %s
  - url: https://admin
    to: https://%s
    to_ca: %s
    policy:
      basic_auth: ["ann:${TK_TEST_PW}"]
  - url: tcp://:%s
    to: %s
`, agents, plainPort, tlsLn.Addr(), caFile, tcpPort, echo))
	a := startCmd(t, env, filepath.Join(bin, "tunnelkit"), "agent", "-config", agentConfig)
	urls := []string{a.line(t), a.line(t), a.line(t)}
	want := []string{"http://plain.example.test:" + httpPort, "https://admin.example.test:" + httpsPort, "tcp://127.0.0.1:" + tcpPort}
	for i := range want {
		if urls[i] != want[i] {
			t.Fatalf("the agent printed %q, want %q", urls, want)
		}
	}
	if status, body := fetch(t, pub, urls[0]+"/", "", ""); status != 200 || body != "plain app" {
		t.Errorf("http endpoint to port %s: %d %q", plainPort, status, body)
	}
	https := func(user, password string) (int, string) {
		req, _ := http.NewRequest("GET", urls[1]+"/", nil)
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		c := viaEdge(tlsPub)
		c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: edgeCA.Pool}
		c.Timeout = 30 * time.Second
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", urls[1], err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, _ := https("", ""); status != http.StatusUnauthorized {
		t.Errorf("the TLS app without credentials: %d, want 401", status)
	}
	if status, body := https("ann", "pass word"); status != 200 || body != "tls app: tls=true user=ann" {
		t.Errorf("the TLS app with the password of ${TK_TEST_PW}: %d %q", status, body)
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+tcpPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "hello\n")
	if line, _ := bufio.NewReader(c).ReadString('\n'); line != "echo: hello\n" {
		t.Errorf("tcp endpoint: %q", line)
	}
	// Its log goes out in batches: the last endpoint's line comes after
	// the session's.
	testwait.Within(t, 10*time.Second, "the agent logged the tcp endpoint", func() bool {
		return strings.Contains(a.stderr.String(), "msg=forwarding url="+urls[2])
	})
	if n := strings.Count(a.stderr.String(), `msg="connected to edge"`); n != 1 {
		t.Errorf("the agent connected %d times, want one session for the three endpoints:\n%s", n, a.stderr.String())
	}
}

// bigBody is the app's 64 MiB download, the same bytes each time.
const bigSize = 16 << 20

func bigBody() io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{35}), bigSize)
}

// bigApp is an app whose /big is the download of bigBody, counting the
// bytes it wrote; any other path answers "big app".
type bigApp struct {
	addr string
	sent atomic.Int64
}

// serveBigApp starts a bigApp on loopback until the test's end.
func serveBigApp(t *testing.T) *bigApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &bigApp{addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "big app")
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(bigSize))
		io.Copy(w, io.TeeReader(bigBody(), counter{&app.sent}))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return app
}

// download is a download of the bigApp under way, its first MiB read.
type download struct {
	app  *bigApp
	resp *http.Response
	sum  hash.Hash
}

// startDownload GETs url's /big through the edge at pub, and reads its
// first MiB.
func (app *bigApp) startDownload(t *testing.T, pub, url string) *download {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/big", nil)
	resp, err := viaEdge(pub).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	d := &download{app: app, resp: resp, sum: sha256.New()}
	if _, err := io.CopyN(d.sum, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	return d
}

// finish checks that the download was under way across what happened
// since it started (the app had not sent it all), and reads the rest of
// it, which must be the app's bytes, whole.
func (d *download) finish(t *testing.T, across string) {
	t.Helper()
	if n := d.app.sent.Load(); n >= bigSize {
		t.Fatalf("the app sent the whole download (%d bytes) before the %s: it was not under way across it", n, across)
	}
	n, err := io.Copy(d.sum, d.resp.Body)
	if err != nil || n+1<<20 != bigSize {
		t.Fatalf("the download across the %s: %d bytes, %v; want %d", across, n+1<<20, err, bigSize)
	}
	want := sha256.New()
	io.Copy(want, bigBody())
	if string(d.sum.Sum(nil)) != string(want.Sum(nil)) {
		t.Fatalf("the download across the %s is not the app's bytes", across)
	}
}

// TestAgentReload: SIGHUP binds an endpoint added to the -config file
// while a 16 MiB download runs on another (the app has not sent it all:
// it waits for the client, who reads on after the reload), which
// completes intact; a second SIGHUP, the endpoint removed, unbinds it,
// and the first stays; a third, the file broken, changes nothing.
func TestAgentReload(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)

	big := serveBigApp(t)
	small := localHTTPApp(t, "small app")

	one := fmt.Sprintf("edge: %s\nstate: \"\"\nendpoints:\n  - url: http://big\n    to: %s\n", agents, big.addr)
	two := one + fmt.Sprintf("  - url: http://small\n    to: %s\n", small)
	config := writeFile(t, dir, "agent.yml", one)
	a := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-config", config)
	bigURL := a.line(t)

	// The download starts, and is under way.
	d := big.startDownload(t, pub, bigURL)

	writeFile(t, dir, "agent.yml", two)
	a.cmd.Process.Signal(syscall.SIGHUP)
	smallURL := a.line(t)
	if status, body := fetch(t, pub, smallURL+"/", "", ""); status != 200 || body != "small app" {
		t.Fatalf("the endpoint added: %d %q", status, body)
	}
	d.finish(t, "reload")

	writeFile(t, dir, "agent.yml", one)
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the agent read the file again", func() bool {
		return strings.Contains(a.stderr.String(), `msg="SIGHUP: the file was read again" file=`+config+" added=0 changed=0 removed=1")
	})
	if status, _ := fetch(t, pub, smallURL+"/", "", ""); status != http.StatusNotFound {
		t.Errorf("the endpoint removed: %d, want 404", status)
	}
	if status, _ := fetch(t, pub, bigURL+"/", "", ""); status != 200 {
		t.Errorf("the endpoint that stayed: %d", status)
	}

	// A file that does not read leaves the endpoints as they are.
	writeFile(t, dir, "agent.yml", one+"  - url: http://typo\n    too: 1\n")
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the agent said the file did not read", func() bool {
		return strings.Contains(a.stderr.String(), `msg="SIGHUP: the file was not read again; the endpoints stay as they were" err="`+config+`:7: unknown key \"too\" in endpoints[1]`)
	})
	if status, _ := fetch(t, pub, bigURL+"/", "", ""); status != 200 {
		t.Errorf("the endpoint after a file that does not read: %d", status)
	}
}

// TestAgentShorthand: "agent http PORT", "agent tcp ADDR" and "agent tls
// ADDR" bind a new random name (any port), forwarding to what they name.
func TestAgentShorthand(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	_, tcpPort, _ := net.SplitHostPort(freePort(t))
	_, httpPort, _ := net.SplitHostPort(pub)
	tlsPub := freePort(t)
	_, tlsPort, _ := net.SplitHostPort(tlsPub)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-tls", tlsPub, "-domain", "example.test", "-tcp-ports", tcpPort)
	waitListening(t, agents)
	_, appPort, _ := net.SplitHostPort(localHTTPApp(t, "shorthand app"))

	url := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", "", "http", appPort).line(t)
	if !strings.HasPrefix(url, "http://") || !strings.HasSuffix(url, ".example.test:"+httpPort) {
		t.Fatalf("agent http %s printed %q", appPort, url)
	}
	if status, body := fetch(t, pub, url+"/", "", ""); status != 200 || body != "shorthand app" {
		t.Errorf("agent http %s: %d %q", appPort, status, body)
	}
	// The flags after the shorthand, too.
	url = startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "tcp", echoServer(t), "-edge", agents, "-state", "").line(t)
	if url != "tcp://127.0.0.1:"+tcpPort {
		t.Fatalf("agent tcp printed %q", url)
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+tcpPort)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "hi\n")
	if line, _ := bufio.NewReader(c).ReadString('\n'); line != "echo: hi\n" {
		t.Errorf("agent tcp: %q", line)
	}
	// A tls endpoint at a name of the agent's, passed through to the app.
	ca := testpki.New(t)
	tlsApp, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "*.example.test")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tlsApp.Close() })
	serveConns(tlsApp, func(c net.Conn) { io.WriteString(c, "tls app") })
	url = startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", "", "tls", tlsApp.Addr().String()).line(t)
	name, ok := strings.CutPrefix(url, "tls://")
	name, ok2 := strings.CutSuffix(name, ".example.test:"+tlsPort)
	if !ok || !ok2 || len(name) != 10 {
		t.Fatalf("agent tls printed %q, want tls://NAME.example.test:%s", url, tlsPort)
	}
	tc, err := tls.Dial("tcp", tlsPub, &tls.Config{ServerName: name + ".example.test", RootCAs: ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(tc)
	tc.Close()
	if string(b) != "tls app" {
		t.Errorf("agent tls: %q", b)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"http"}, "'tunnelkit http' needs what to forward to: 'tunnelkit http 3000'"},
		{[]string{"3000"}, "to expose a port, write 'tunnelkit http 3000' or -to 3000"},
		{[]string{"-to", "3000x"}, `-to "3000x": no port; want a port (3000), host:port,`},
		{[]string{"http", "3000", "-url", "tcp://"}, "'tunnelkit http' and -url tcp://: the schemes differ"},
	} {
		out, err := exec.Command(filepath.Join(bin, "tunnelkit"), append([]string{"agent", "-edge", agents}, c.args...)...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("agent %q: %v, %q; want exit 2 saying %q", c.args, err, out, c.want)
		}
	}
}

// TestAgentStateAfterKill: an agent killed with SIGKILL and started again
// gets its URL (a random name) back at its first bind, from the state
// file in its default place; one whose state lost the session's ticket
// says that the name was its own, until when the edge keeps it, and gets
// it then.
func TestAgentStateAfterKill(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)
	_, appPort, _ := net.SplitHostPort(localHTTPApp(t, "stateful app"))
	stateHome := t.TempDir()
	env := []string{"XDG_STATE_HOME=" + stateHome}
	args := []string{"-edge", agents, "http", appPort}

	first := startCmd(t, env, filepath.Join(bin, "tunnelkit"), append([]string{"agent"}, args...)...)
	url := first.line(t)
	first.kill()

	start := time.Now()
	again := startCmd(t, env, filepath.Join(bin, "tunnelkit"), append([]string{"agent"}, args...)...)
	if got := again.line(t); got != url {
		t.Fatalf("after kill -9, the agent printed %s, want %s again", got, url)
	}
	t.Logf("the URL back %v after the restart", time.Since(start).Round(time.Millisecond))
	testwait.Within(t, 10*time.Second, "the agent logged its endpoint", func() bool {
		return strings.Contains(again.stderr.String(), "msg=listening")
	})
	if log := again.stderr.String(); strings.Count(log, `msg=listening`) != 1 || strings.Contains(log, "waiting for it") || strings.Contains(log, "not granted") {
		t.Errorf("the agent did not bind at once:\n%s", log)
	}
	if status, body := fetch(t, pub, url+"/", "", ""); status != 200 || body != "stateful app" {
		t.Errorf("after the restart: %d %q", status, body)
	}
	files, _ := filepath.Glob(filepath.Join(stateHome, "tunnelkit", "agent-*.json"))
	if len(files) != 1 {
		t.Fatalf("state files %q under XDG_STATE_HOME, want one", files)
	}

	// The session's ticket lost: the name is the earlier run's, and the
	// edge keeps it for that run's identity until its grace ends.
	again.kill()
	var st map[string]any
	b, _ := os.ReadFile(files[0])
	if err := json.Unmarshal(b, &st); err != nil || st["session"] == nil {
		t.Fatalf("state file %s: %v\n%s", files[0], err, b)
	}
	delete(st, "session")
	b, _ = json.Marshal(st)
	os.WriteFile(files[0], b, 0o600)
	third := startCmd(t, env, filepath.Join(bin, "tunnelkit"), append([]string{"agent"}, args...)...)
	if got := third.line(t); got != url {
		t.Fatalf("without the session's ticket, the agent printed %s, want %s once free", got, url)
	}
	if log := third.stderr.String(); !strings.Contains(log, "the name was this agent's in an earlier run, and the edge keeps it for that run's session") || !strings.Contains(log, " UTC; waiting for it") {
		t.Errorf("the agent did not say whose the name was and until when:\n%s", log)
	}
}

// TestCommandLineMistakes: a mistyped flag gets at most five lines that
// name the closest flag and point at -h; -version answers; a -config file
// that is not right names its line, and an unset ${VAR}.
func TestCommandLineMistakes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	run := func(name string, args ...string) (string, int) {
		out, err := exec.Command(filepath.Join(bin, "tunnelkit"), append([]string{name}, args...)...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), code
	}
	for _, c := range []struct {
		name, flag, closest string
	}{
		{"agent", "-edg", "-edge"}, {"agent", "-too", "-to"}, {"agent", "-basic_auth", "-basic-auth"},
		{"edge", "-domian", "-domain"}, {"edge", "-tcp-port", "-tcp-ports"},
	} {
		out, code := run(c.name, c.flag, "x")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if code != 2 || len(lines) > 5 || !strings.HasPrefix(out, "tunnelkit "+c.name+": unknown flag "+c.flag+": did you mean "+c.closest+"?") || !strings.Contains(out, "Run 'tunnelkit "+c.name+" -h' for every flag.") {
			t.Errorf("%s %s: exit %d, %d lines:\n%s", c.name, c.flag, code, len(lines), out)
		}
	}
	for _, name := range []string{"agent", "edge"} {
		if out, code := run(name, "-version"); code != 0 || !strings.HasPrefix(out, "tunnelkit "+name+" version ") {
			t.Errorf("%s -version: exit %d, %q", name, code, out)
		}
		if out, _ := run(name, "-h"); !strings.HasPrefix(out, "Usage of tunnelkit "+name+": ") || strings.Count(strings.Split(out, "Flags:")[0], "\n  tunnelkit ") != 3 {
			t.Errorf("%s -h does not open with a synopsis and three examples:\n%s", name, out)
		}
	}
	for _, c := range []struct {
		name, src, want string
	}{
		{"agent", "edge: a:1\nendpoints:\n  - url: http://x\n    too: 3000\n", `:4: unknown key "too" in endpoints[0]: did you mean "to"?`},
		{"agent", "edge: a:1\ntoken: ${TK_TEST_UNSET}\n", ":2: ${TK_TEST_UNSET}: the environment does not set TK_TEST_UNSET"},
		{"agent", "endpoints:\n  - url: http://x\n    to: 3000\n    pool: sometimes\n", `:4: pool takes true or false, not "sometimes"`},
		{"agent", "endpoints:\n  - url: tcp://\n    to: 22\n    policy:\n      basic_auth: [a:b]\n", ":2: endpoint 1: traffic policy for a tcp URL"},
		{"edge", "domain: example.test\nacme_emial: ops@example.test\n", `:2: unknown key "acme_emial": did you mean "acme_email"?`},
		{"edge", "max_pending: lots\n", `:1: max_pending "lots": want a whole number`},
	} {
		file := writeFile(t, dir, c.name+".yml", c.src)
		out, code := run(c.name, "-config", file)
		if code != 2 || !strings.HasPrefix(out, "tunnelkit "+c.name+": "+file+c.want) {
			t.Errorf("%s -config with\n%s: exit %d, %q\nwant exit 2 and %s%s", c.name, c.src, code, out, file, c.want)
		}
	}
}

// counter counts the bytes written to it.
type counter struct{ n *atomic.Int64 }

func (c counter) Write(b []byte) (int, error) { c.n.Add(int64(len(b))); return len(b), nil }
