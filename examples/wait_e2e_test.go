package examples_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAgentWaitsForItsEdge starts the agent binary, then the edge 3 s
// later on the agent's -edge port: the agent logs each attempt that
// failed, with the wait before the next, and prints its URL once the edge
// is up.
func TestAgentWaitsForItsEdge(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	app := localHTTPApp(t, "app that waited")

	start := time.Now()
	cmd := exec.Command(filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://waiting.example.test", "-to", app)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
	})
	// The agent's stderr, line by line; the first failed attempt is the
	// event the test waits for.
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	var first string
	for first == "" || strings.Contains(first, "msg=state ") { // where its state file is, first
		select {
		case first = <-lines:
		case <-time.After(20 * time.Second):
			t.Fatal("the agent logged no attempt within 20 s")
		}
	}
	if want := ` level=WARN msg="connecting to edge failed" edge=` + agents + ` err="agent: dial edge: dial tcp ` + agents + `: connect: connection refused" attempt=1 retry_in=`; !strings.Contains(first, want) {
		t.Fatalf("the agent's first line: %s\nwant one with %s", first, want)
	}

	// The scenario: the edge starts 3 s after the agent, on its -edge port.
	time.Sleep(time.Until(start.Add(3 * time.Second)))
	startBinary(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")

	url := readURL(t, bufio.NewReader(stdout))
	_, port, _ := net.SplitHostPort(pub)
	if want := "http://waiting.example.test:" + port; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	if got := getVia(t, pub, url+"/"); got != "app that waited" {
		t.Fatalf("through the agent: %q", got)
	}
}

// TestAgentWaitBound: with -wait, an agent whose edge never comes gives up
// then, saying why its attempts failed.
func TestAgentWaitBound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "tunnelkit"), "agent", "-edge", freePort(t), "-wait", "1s", "-to", "127.0.0.1:1").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("agent -wait 1s without an edge: %v, want exit 2\n%s", err, out)
	}
	last := lastLine(out)
	if want := "tunnelkit agent: gave up waiting for the edge after "; !strings.HasPrefix(last, want) || !strings.Contains(last, " attempts (-wait 1s passed): the last failed: dial edge: ") || !strings.HasSuffix(last, "connection refused") {
		t.Errorf("agent -wait 1s without an edge said %q; want %s... (-wait 1s passed): the last failed: dial edge: ...connection refused", last, want)
	}
}

// TestHelloToken runs hello against an edge that wants a token: without
// one it says so once prefixed; with one it gets its URL.
func TestHelloToken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	agents, pub := freePort(t), freePort(t)
	startBinary(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test", "-token", "s3cret")
	waitListening(t, agents)

	out, err := exec.Command(filepath.Join(bin, "hello"), "-edge", agents).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("hello without a token: %v, want exit 2\n%s", err, out)
	}
	if want := "hello: unauthorized: no token was sent, and this edge admits only agents that present one (give the edge's token with -token)"; lastLine(out) != want {
		t.Errorf("hello without a token said %q, want %q", lastLine(out), want)
	}
	url := readURL(t, start(t, filepath.Join(bin, "hello"), "-edge", agents, "-token", "s3cret", "-url", "http://hello.example.test"))
	if got := getVia(t, pub, url+"/x"); !strings.Contains(got, "Hello from behind the tunnel!") {
		t.Fatalf("hello answered %q", got)
	}
}

// TestMessagesReadOnce: the binaries' errors carry their name once, and
// point at the flag to change.
func TestMessagesReadOnce(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	agents, pub := freePort(t), freePort(t)
	startBinary(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)
	waitListening(t, pub)
	app := localHTTPApp(t, "app")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"agent", "-edge", pub, "-to", app}, "agent: not an edge's agent port: " + pub + ` answered in HTTP ("HTTP/1.`},
		{[]string{"agent", "-edge", pub, "-to", app}, "; -edge takes the edge's agent address: its -agents flag, 127.0.0.1:7000 by default"},
		{[]string{"hello", "-edge", pub}, "hello: not an edge's agent port: "},
		{[]string{"agent", "-edge", agents, "-url", "http:/x", "-to", app}, `agent: endpoint "http:/x": a scheme takes "://" after it: http://x`},
		{[]string{"hello", "-edge", agents, "-url", "http:/x"}, `hello: endpoint "http:/x": a scheme takes "://" after it: http://x`},
		{[]string{"edge", "-tcp-ports", "20-10"}, `edge: bad port range "20-10"`},
	} {
		name, args := c.args[0], c.args[1:]
		if name == "agent" || name == "edge" {
			name, args = "tunnelkit", c.args // a subcommand
		}
		out, _ := exec.Command(filepath.Join(bin, name), args...).CombinedOutput()
		if last := lastLine(out); !strings.Contains(last, c.want) {
			t.Errorf("%v said %q, want %q", c.args, last, c.want)
		}
	}
}

// lastLine returns the last line of a binary's output: its error.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// localHTTPApp serves body on loopback until the test ends, and returns its
// address.
func localHTTPApp(t *testing.T, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// startBinary runs a binary whose stdout the test does not read.
func startBinary(t *testing.T, bin string, args ...string) {
	t.Helper()
	go io.Copy(io.Discard, start(t, bin, args...))
}
