// Package examples_test runs the example binaries as a user would: built
// once, before the tests start (by the README's go install line), started
// as processes, reached with real clients.
package examples_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// examples are the binaries the tests run, built once by TestMain.
var examples = []string{"tunnelkit", "demo", "hello", "sniproxy"}

// binDir holds the built examples.
var binDir string

// TestMain builds the examples, and what the README's blocks compile
// (prepareREADME), before any test starts, so that no test's deadline
// includes compiling them (a cold build cache takes minutes on a small
// machine), then runs the tests. The examples the tests run are those the
// README's install block installed (tunnelkit), which go install builds
// as go build does, and the others, which the documents run with go run,
// built by prepareREADME beside them; they are all built apart only when
// that failed (TestREADMEShell says why), since linking them again costs
// seconds of CPU for the same binaries.
func TestMain(m *testing.M) {
	isolatedChild() // returns, but in the test binary run by isolatedCommand
	cleanup := prepareREADME()
	dir, installed := readmePrep.installed(examples)
	if !installed {
		var err error
		if dir, err = os.MkdirTemp("", "tunnelkit-examples-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			cleanup()
			os.Exit(1)
		}
		args := append([]string{"build", "-o", dir + string(os.PathSeparator)}, prefix("./", examples)...)
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			os.RemoveAll(dir)
			cleanup()
			os.Exit(1)
		}
	}
	binDir = dir
	// The agents' state files (-state's default place) go into a
	// directory of the tests', not the user's.
	stateDir, err := os.MkdirTemp("", "tunnelkit-state-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		cleanup()
		os.Exit(1)
	}
	os.Setenv("XDG_STATE_HOME", stateDir)
	code := m.Run()
	cleanup()
	os.RemoveAll(stateDir)
	if !installed {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// build returns the directory of the built examples, which holds names.
func build(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(binDir, n)); err != nil {
			t.Fatalf("example %s was not built: %v", n, err)
		}
	}
	return binDir
}

func prefix(p string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = p + v
	}
	return out
}

// freePort returns a loopback address free now, for a process the test
// starts (testtools.FreePort).
func freePort(t *testing.T) string {
	t.Helper()
	p, err := testtools.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// start runs a binary and returns a reader of its stdout; the process gets
// SIGINT at cleanup and must exit cleanly.
func start(t *testing.T, bin string, args ...string) *bufio.Reader {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v\n%s", filepath.Base(bin), err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			t.Errorf("%s did not exit on SIGINT\n%s", filepath.Base(bin), stderr.String())
		}
	})
	return bufio.NewReader(stdout)
}

// readURL reads the one stdout line a tunnel binary prints: its URL.
func readURL(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("reading the URL line: %v (%q)", err, line)
	}
	go io.Copy(io.Discard, r)
	return strings.TrimSpace(line)
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// getVia fetches url with every name resolved to the edge at addr.
func getVia(t *testing.T, addr, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

func TestEdgeAgentHello(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	agents, pub := freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)
	waitListening(t, pub)
	_, port, _ := net.SplitHostPort(pub)

	// A local app, exposed by the agent binary.
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "local app saw %s from %s", r.Host, r.Header.Get("X-Forwarded-For"))
	})}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })

	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://abc.example.test", "-to", appLn.Addr().String()))
	if want := "http://abc.example.test:" + port; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	if got, want := getVia(t, pub, url+"/"), "local app saw abc.example.test:"+port+" from 127.0.0.1"; got != want {
		t.Fatalf("through agent: %q, want %q", got, want)
	}

	url = readURL(t, start(t, filepath.Join(bin, "hello"), "-edge", agents))
	if !strings.HasPrefix(url, "http://") || !strings.HasSuffix(url, ".example.test:"+port) {
		t.Fatalf("hello printed %q", url)
	}
	if got := getVia(t, pub, url+"/x"); !strings.Contains(got, "Hello from behind the tunnel!") || !strings.Contains(got, "You are 127.0.0.1, asking for ") {
		t.Fatalf("hello answered %q", got)
	}

	// hello -listen: a local app behind the agent's -to, which names the
	// client the agent's forwarder reports.
	local := readURL(t, start(t, filepath.Join(bin, "hello"), "-listen", "127.0.0.1:0"))
	if !strings.HasPrefix(local, "http://127.0.0.1:") {
		t.Fatalf("hello -listen printed %q", local)
	}
	url = readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://local.example.test", "-to", strings.TrimPrefix(local, "http://")))
	if got := getVia(t, pub, url+"/y"); !strings.Contains(got, "You are 127.0.0.1, asking for local.example.test:"+port+"/y\n") || !strings.Contains(got, "X-Forwarded-For: 127.0.0.1\n") {
		t.Fatalf("hello -listen behind the agent answered %q", got)
	}
}

// TestL4Endpoints runs the edge with -tls and -tcp-ports, and agents that
// expose a TLS server (terminated by the app) and a TCP echo in a pool.
func TestL4Endpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub, tlsAddr := freePort(t), freePort(t), freePort(t)
	_, tcpPort, _ := net.SplitHostPort(freePort(t))
	tokens := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(tokens, []byte("# token identity\nalice-token alice\n\nbob-token bob\n"), 0o600)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test",
		"-tls", tlsAddr, "-tcp-ports", tcpPort, "-tokens", tokens)
	waitListening(t, agents)
	waitListening(t, tlsAddr)

	// A TLS app with its own certificate; the edge never sees the key.
	cert, pool := selfSigned(t, "app.example.test")
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	serveConns(tl, func(c net.Conn) { io.WriteString(c, "tls app") })
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "bob-token", "-url", "tls://app.example.test", "-to", tl.Addr().String()))
	if want := "tls://app.example.test:" + tlsPort; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	c, err := tls.Dial("tcp", tlsAddr, &tls.Config{ServerName: "app.example.test", RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "tls app" {
		t.Fatalf("TLS through the edge: %q", b)
	}

	// A TCP endpoint on a chosen port, served by two agents of one identity
	// in a pool, each sending a PROXY v1 header to its upstream.
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	serveConns(up, func(c net.Conn) {
		line, _ := bufio.NewReader(c).ReadString('\n')
		io.WriteString(c, line)
	})
	for range 2 {
		url = readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "alice-token", "-url", "tcp://:"+tcpPort, "-pool", "-proxy-proto", "1", "-to", up.Addr().String()))
		if url != "tcp://127.0.0.1:"+tcpPort {
			t.Fatalf("agent printed %q", url)
		}
	}
	// Another identity cannot join alice's pool, nor take bob's TLS name
	// over http.
	for _, c := range []struct{ token, url string }{
		{"bob-token", "tcp://:" + tcpPort},
		{"alice-token", "http://app.example.test"},
	} {
		out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", c.token, "-url", c.url, "-pool", "-to", up.Addr().String()).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "name taken") {
			t.Errorf("agent of %s binding %s: %v %s", c.token, c.url, err, out)
		}
	}
	conn, err := net.Dial("tcp", "127.0.0.1:"+tcpPort)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	line, _ := bufio.NewReader(conn).ReadString('\n')
	if want := fmt.Sprintf("PROXY TCP4 127.0.0.1 127.0.0.1 %d ", conn.LocalAddr().(*net.TCPAddr).Port); !strings.HasPrefix(line, want) {
		t.Fatalf("upstream got %q, want a line starting %q", line, want)
	}
}

// serveConns accepts ln's conns until it is closed, and runs handle for
// each in a goroutine of its own, which closes the conn after.
func serveConns(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// selfSigned returns a certificate for names and a pool trusting it.
func selfSigned(t *testing.T, names ...string) (tls.Certificate, *x509.CertPool) {
	ca := testpki.New(t)
	return ca.Issue(t, names...), ca.Pool
}

// TestTokenAndTLS runs the edge with a token and TLS on its agent port: an
// agent with the token and the CA gets through; a wrong token is refused
// with a clear message.
func TestTokenAndTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	ca := testpki.New(t)
	certPEM, keyPEM := testpki.PEMFiles(t, ca.Issue(t, "127.0.0.1"))
	certFile, keyFile, caFile := filepath.Join(dir, "edge.pem"), filepath.Join(dir, "edge-key.pem"), filepath.Join(dir, "ca.pem")
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)
	os.WriteFile(caFile, ca.PEM, 0o600)

	agents, pub := freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test",
		"-token", "s3cret", "-agent-cert", certFile, "-agent-key", keyFile)
	waitListening(t, agents)
	waitListening(t, pub)
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "behind TLS") })}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })

	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "s3cret", "-edge-ca", caFile,
		"-url", "http://secure", "-to", appLn.Addr().String()))
	if got := getVia(t, pub, url+"/"); got != "behind TLS" {
		t.Fatalf("through the TLS session: %q", got)
	}
	otherCA := filepath.Join(dir, "other.pem")
	os.WriteFile(otherCA, testpki.New(t).PEM, 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-token", "wrong", "-edge-ca", caFile}, "refused the token"},
		{[]string{"-token", "s3cret"}, "the edge expects TLS"}, // plaintext to a loopback edge that speaks TLS
		{[]string{"-token", "s3cret", "-edge-ca", otherCA}, "certificate"},
	} {
		args, want := c.args, c.want
		cmd := exec.Command(filepath.Join(bin, "tunnelkit"), append([]string{"agent", "-edge", agents, "-to", appLn.Addr().String()}, args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("agent %v succeeded", args)
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("agent %v: %q, want a message with %q", args, out, want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	dir := t.TempDir()
	badTokens := filepath.Join(dir, "tokens")
	os.WriteFile(badTokens, []byte("only-a-token\n"), 0o600)
	shortKey := filepath.Join(dir, "key")
	os.WriteFile(shortKey, []byte("abcd\n"), 0o600)
	for _, c := range [][]string{
		{"edge", "-domain", ""},
		{"edge", "-nope"},
		{"agent", "-to", ""},
		{"agent", "-to", "no-port"},
		{"agent", "-to", "127.0.0.1:1", "-url", "ftp://x"},
		{"agent", "-to", "127.0.0.1:1", "-proxy-proto", "3"},
		{"agent", "-to", "127.0.0.1:1", "-url", "tcp://:99999"},
		{"edge", "-tcp-ports", "20-10"},
		{"edge", "-tcp-ports", "x"},
		{"edge", "-agent-cert", "x.pem"},
		{"edge", "-agent-cert", "/nonexistent", "-agent-key", "/nonexistent"},
		{"edge", "-tokens", "/nonexistent"},
		{"edge", "-tokens", badTokens},
		{"edge", "-ticket-key", shortKey},
		{"agent", "-to", "127.0.0.1:1", "-edge-ca", "/nonexistent"},
		{"agent", "-to", "127.0.0.1:1", "-proxy", "ftp://proxy:21"},
		{"agent", "-to", "127.0.0.1:1", "-proxy", "http://user:pw@proxy:bad"},
		{"agent", "-to", "127.0.0.1:1", "-proxy-ca", "/nonexistent"},
		{"agent", "-to", "127.0.0.1:1", "-wait", "-1s"},
		{"hello", "-wait", "-1s"},
		{"hello", "extra"},
		{"hello", "-listen", "127.0.0.1:0", "-url", "http://x"},
		{"edge", "-acme-orders-per-identity", "2"}, // without -acme-directory
		{"edge", "-policy", "/nonexistent"},
		{"edge", "-policy", badTokens}, // not JSON
		{"edge", "-policy-kinds", "basic_auth,ip_reputation"},
		{"edge", "-oidc-issuer-allowed", "http://id.example.com"},
		{"edge", "-oidc-ca", "ca.pem"}, // without -oidc
	} {
		name, args := c[0], c[1:]
		if name == "agent" || name == "edge" {
			name, args = "tunnelkit", c // a subcommand
		}
		out, err := exec.Command(filepath.Join(bin, name), args...).CombinedOutput()
		if err == nil {
			t.Errorf("%v succeeded", c)
			continue
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || len(out) == 0 {
			t.Errorf("%v: %v, output %q; want exit 2 with a message", c, err, out)
		}
	}
}
