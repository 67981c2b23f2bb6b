package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// adminToken is the bearer token of the admin API in these tests.
const adminToken = "the-admin-token-of-a-test-edge"

// proc is a process of a test, with its output so far.
type proc struct {
	cmd    *exec.Cmd
	out    testtools.Buffer // stdout and stderr
	exited chan struct{}
	err    error // once exited is closed
}

// startProc runs bin; at cleanup it gets SIGINT, then SIGKILL after 15 s.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(bin), p.output())
		}
	})
	return p
}

func (p *proc) output() string { return p.out.String() }

// count returns how many lines of the output so far contain s.
func (p *proc) count(s string) int { return strings.Count(p.output(), s) }

// adminCall sends method path to the admin API at addr with the test's
// token, and returns the status and body.
func adminCall(t *testing.T, addr, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// statusVia returns the status of GET url through the edge's HTTP port,
// or 0 when the request fails.
func statusVia(addr, url string) int {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokenWithdrawal: the operator withdraws a token from -tokens,
// sends the edge SIGHUP, and disconnects the token's identity through
// the admin API: within 2 s its URL stops answering, and its agent, which
// tries to come back, is refused, while another identity's URL answers
// all along.
func TestTokenWithdrawal(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	writeFiles(t, dir, map[string][]byte{
		"tokens":      []byte("alice-token alice\nbob-token bob\n"),
		"admin-token": []byte(adminToken + "\n"),
	})
	agents, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	edge := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", httpAddr, "-tokens", tokens,
		"-admin", adminAddr, "-admin-token-file", filepath.Join(dir, "admin-token"))
	waitListening(t, adminAddr)
	app := freePort(t)
	startProc(t, filepath.Join(bin, "hello"), "-listen", app)
	waitListening(t, app)
	alice := startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "alice-token", "-url", "http://alice.example.test", "-to", app)
	startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "bob-token", "-url", "http://bob.example.test", "-to", app)
	_, port, _ := net.SplitHostPort(httpAddr)
	aliceURL, bobURL := "http://alice.example.test:"+port+"/", "http://bob.example.test:"+port+"/"
	for _, u := range []string{aliceURL, bobURL} {
		testwait.Until(t, 30*time.Second, u+" answers", func() error {
			if code := statusVia(httpAddr, u); code != 200 {
				return fmt.Errorf("%d", code)
			}
			return nil
		})
	}

	// Withdraw alice's token.
	if err := os.WriteFile(tokens, []byte("bob-token bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	edge.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 10*time.Second, "the edge read its tokens again", func() bool { return edge.count("SIGHUP: the settings were read again") > 0 })
	withdrawn := time.Now()
	if code, body := adminCall(t, adminAddr, "POST", "/v1/identities/alice/disconnect"); code != 200 || !strings.Contains(body, `"disconnected":1`) {
		t.Fatalf("disconnect alice: %d %s", code, body)
	}
	testwait.Within(t, 2*time.Second, "alice's URL stops answering within 2 s", func() bool { return statusVia(httpAddr, aliceURL) != 200 })
	t.Logf("alice's URL stopped answering %v after the disconnect", time.Since(withdrawn).Round(time.Millisecond))

	// Her agent tries to come back, and is refused; bob's URL answers.
	refused := alice.count("unauthorized")
	testwait.Within(t, 30*time.Second, "alice's agent tries again twice", func() bool { return alice.count("unauthorized") >= refused+2 })
	if code := statusVia(httpAddr, aliceURL); code == 200 {
		t.Errorf("alice's URL answers again")
	}
	if code, body := adminCall(t, adminAddr, "GET", "/v1/sessions"); code != 200 || strings.Contains(body, `"identity":"alice"`) || !strings.Contains(body, `"identity":"bob"`) {
		t.Errorf("sessions after the withdrawal: %d %s", code, body)
	}
	if code := statusVia(httpAddr, bobURL); code != 200 {
		t.Errorf("bob's URL: %d", code)
	}
}

// TestEdgeAdminAndSIGTERM: the edge command's admin API answers /healthz
// without a token and /v1/ only with it; SIGTERM drains the edge (a
// request in flight finishes, /healthz answers 503 meanwhile) and it
// exits 0; a token file others may read keeps it from starting.
func TestEdgeAdminAndSIGTERM(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"admin-token": []byte(adminToken)})
	open := filepath.Join(dir, "open-token")
	if err := os.WriteFile(open, []byte(adminToken), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "edge", "-agents", freePort(t), "-http", freePort(t), "-admin", freePort(t), "-admin-token-file", open).CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "chmod 600") {
		t.Errorf("a token file others may read: exit %d, %q; want 2 and a word on chmod 600", code, out)
	}

	agents, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	edge := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", httpAddr,
		"-admin", adminAddr, "-admin-token-file", filepath.Join(dir, "admin-token"), "-drain-timeout", "20s")
	waitListening(t, adminAddr)
	health := func() int {
		resp, err := http.Get("http://" + adminAddr + "/healthz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := health(); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	resp, err := http.Get("http://" + adminAddr + "/v1/sessions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("/v1/sessions without the token: %d", resp.StatusCode)
	}

	// An app whose answer waits, in flight while the edge drains.
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(appLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "done")
	}))
	t.Cleanup(func() { appLn.Close() })
	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://slow.example.test", "-to", appLn.Addr().String()))
	slow := make(chan int, 1)
	go func() { slow <- statusVia(httpAddr, url+"/") }()
	<-arrived
	edge.cmd.Process.Signal(syscall.SIGTERM)
	testwait.Within(t, 10*time.Second, "/healthz answers 503 while the edge drains", func() bool { return health() == 503 })
	select {
	case <-edge.exited:
		t.Fatalf("the edge exited with a request in flight: %v", edge.err)
	default:
	}
	close(release)
	if code := <-slow; code != 200 {
		t.Errorf("the request in flight: %d", code)
	}
	<-edge.exited
	if edge.err != nil {
		t.Errorf("the edge exited with %v after SIGTERM", edge.err)
	}
	if !strings.Contains(edge.output(), "drained") {
		t.Errorf("the edge did not log that it drained")
	}
}

// exitCode returns the exit code of a command's error (0 for none).
func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestSIGTERMDrainTimeout: a request that never ends does not keep a
// draining edge up past -drain-timeout: it cuts what is in flight short
// then, says so, and exits 0.
func TestSIGTERMDrainTimeout(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, httpAddr := freePort(t), freePort(t)
	edge := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", httpAddr, "-drain-timeout", "1s")
	waitListening(t, agents)
	arrived, never := make(chan struct{}, 1), make(chan struct{})
	t.Cleanup(func() { close(never) })
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(appLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-never
	}))
	t.Cleanup(func() { appLn.Close() })
	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://stuck.example.test", "-to", appLn.Addr().String()))
	go func() { // a client that waits for good
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, httpAddr)
		}}}
		if resp, err := client.Get(url + "/"); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	edge.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-edge.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the edge did not exit within 30 s of SIGTERM, with -drain-timeout 1s")
	}
	if edge.err != nil || !strings.Contains(edge.output(), "cutting short what was in flight") {
		t.Errorf("the edge exited with %v, having logged:\n%s", edge.err, edge.output())
	}
}

// TestDisconnectFreeRevokesStolenState: on an edge without tokens, the
// operator disconnects an anonymous agent's identity with free=true. The
// agent, reconnecting with its ticket, is a new identity (it binds its
// URL again: the name is free); an agent started with a copy of the state
// file the first had before (a stolen one) is another new identity, and
// does not get the URL.
func TestDisconnectFreeRevokesStolenState(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{"admin-token": []byte(adminToken + "\n")})
	agents, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", httpAddr, "-domain", "example.test",
		"-ticket-key", filepath.Join(dir, "ticket.key"), "-admin", adminAddr, "-admin-token-file", filepath.Join(dir, "admin-token"))
	waitListening(t, adminAddr)
	waitListening(t, agents)
	_, appPort, _ := net.SplitHostPort(localHTTPApp(t, "app"))

	type session struct {
		Identity  string
		Endpoints []struct{ URL string }
	}
	sessions := func() []session {
		t.Helper()
		code, body := adminCall(t, adminAddr, "GET", "/v1/sessions")
		var v struct{ Sessions []session }
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			t.Fatalf("GET /v1/sessions: %d %s", code, body)
		}
		return v.Sessions
	}
	state, stolen := filepath.Join(dir, "first.json"), filepath.Join(dir, "stolen.json")
	first := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", state, "http", appPort)
	url := first.line(t)
	s := sessions()
	if len(s) != 1 || !strings.HasPrefix(s[0].Identity, "anonymous-") {
		t.Fatalf("sessions: %+v, want the first agent's", s)
	}
	identity := s[0].Identity
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stolen, b, 0o600); err != nil {
		t.Fatal(err)
	}

	if code, body := adminCall(t, adminAddr, "POST", "/v1/identities/"+identity+"/disconnect?free=true"); code != 200 || !strings.Contains(body, `"disconnected":1`) {
		t.Fatalf("disconnect: %d %s", code, body)
	}
	var back string // the first agent's identity once it is back
	testwait.Within(t, 30*time.Second, "the first agent back, with its URL", func() bool {
		s := sessions()
		if len(s) != 1 || len(s[0].Endpoints) != 1 || s[0].Endpoints[0].URL != url {
			return false
		}
		back = s[0].Identity
		return true
	})
	if back == identity {
		t.Fatalf("the first agent came back as %s, the identity disconnected with free=true", identity)
	}

	thief := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", stolen, "http", appPort)
	if got := thief.line(t); got == url {
		t.Fatalf("the agent of the stolen state file got the first agent's URL %s", url)
	}
	for _, s := range sessions() {
		if s.Identity == identity {
			t.Fatalf("a session of the revoked identity %s: %+v", identity, s)
		}
	}
	if n := len(sessions()); n != 2 {
		t.Fatalf("%d sessions, want the first agent's and the thief's", n)
	}
}
