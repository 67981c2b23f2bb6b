package examples_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// The operator's levers of issue #39, items 1 and 2, through the built
// binaries: a tokens setting that names no token refuses every agent, and
// a SIGHUP reads the whole -config file again.

// TestEmptyTokensRefuseEveryAgent: an edge whose -tokens file names no
// token (only a comment) says so as it starts and refuses every agent,
// with or without a token, until a token is added and the edge gets
// SIGHUP: then that token's agent binds. So does an edge whose -config
// file says "tokens: []". -anonymous with tokens is an error.
func TestEmptyTokensRefuseEveryAgent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	dir := t.TempDir()
	writeFiles(t, dir, map[string][]byte{
		"tokens.txt": []byte("# none yet\n"),
		"edge.yml":   []byte("tokens: []\n"),
	})
	app := freePort(t)
	startProc(t, filepath.Join(bin, "hello"), "-listen", app)
	waitListening(t, app)

	for _, setting := range [][]string{
		{"-tokens", filepath.Join(dir, "tokens.txt")},
		{"-config", filepath.Join(dir, "edge.yml")},
	} {
		agents, httpAddr := freePort(t), freePort(t)
		edge := startProc(t, filepath.Join(bin, "tunnelkit"), append([]string{"edge", "-agents", agents, "-http", httpAddr}, setting...)...)
		waitListening(t, agents)
		testwait.Within(t, 30*time.Second, fmt.Sprintf("%v: the edge's start says that it refuses every agent", setting), func() bool {
			return strings.Contains(edge.output(), "no tokens: every agent is refused until the file names one")
		})
		for _, token := range []string{"", "new-token"} {
			out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", token, "-url", "http://open.example.test", "-to", app).CombinedOutput()
			if err == nil || !strings.Contains(string(out), "unauthorized") {
				t.Errorf("%v: an agent with token %q: %v\n%s", setting, token, err, out)
			}
		}
	}

	// A token added to the file, and SIGHUP: its agent binds.
	agents, httpAddr := freePort(t), freePort(t)
	tokens := filepath.Join(dir, "tokens.txt")
	edge := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", httpAddr, "-tokens", tokens)
	waitListening(t, agents)
	if err := os.WriteFile(tokens, []byte("# one now\nnew-token alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	edge.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the edge read its settings again", func() bool {
		return strings.Contains(edge.output(), `msg="SIGHUP: the settings were read again" applied="tokens (1)"`)
	})
	startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "new-token", "-url", "http://open.example.test", "-to", app)
	_, port, _ := net.SplitHostPort(httpAddr)
	testwait.Until(t, 30*time.Second, "the agent of the token added serves", func() error {
		if code := statusVia(httpAddr, "http://open.example.test:"+port+"/"); code != 200 {
			return fmt.Errorf("%d", code)
		}
		return nil
	})

	// -anonymous says the opposite of a tokens setting.
	out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "edge", "-anonymous", "-tokens", tokens).CombinedOutput()
	if exitCode(err) != 2 || !strings.Contains(string(out), "-anonymous takes any agent without a token") {
		t.Errorf("-anonymous with -tokens: %v\n%s", err, out)
	}
	// And without any tokens setting, the start says that any agent is
	// taken.
	open := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", freePort(t), "-http", freePort(t))
	testwait.Within(t, 30*time.Second, "the open edge's start line", func() bool {
		return strings.Contains(open.output(), "the edge takes any agent without a token")
	})
}

// TestConfigReloadedWhole: tokens written in the edge's -config file are
// read again at SIGHUP with the rest of it. A token taken out, and its
// identity disconnected through the admin API, does not come back; the
// limits and the log level change at once; a setting that takes a restart
// (the domain) is named, and the edge goes on with the old one; a file
// that does not read changes nothing.
func TestConfigReloadedWhole(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit", "hello")
	dir := t.TempDir()
	agents, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	config := func(domain, level, mallory string, maxPerIdentity int) []byte {
		c := fmt.Sprintf("agents: %s\nhttp: %s\ndomain: %s\nadmin: %s\nadmin_token_file: %s\nlog_level: %s\nmax_endpoints_per_identity: %d\n",
			agents, httpAddr, domain, adminAddr, filepath.Join(dir, "admin-token"), level, maxPerIdentity)
		c += "tokens:\n  - token: alice-token\n    identity: alice\n"
		if mallory != "" {
			c += "  - token: " + mallory + "\n    identity: mallory\n"
		}
		return []byte(c)
	}
	path := filepath.Join(dir, "edge.yml")
	writeFiles(t, dir, map[string][]byte{
		"edge.yml":    config("example.test", "info", "mallory-token", 10),
		"admin-token": []byte(adminToken + "\n"),
	})
	edge := startProc(t, filepath.Join(bin, "tunnelkit"), "edge", "-config", path)
	waitListening(t, adminAddr)
	app := freePort(t)
	startProc(t, filepath.Join(bin, "hello"), "-listen", app)
	waitListening(t, app)
	mallory := startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "mallory-token", "-url", "http://mallory.example.test", "-to", app)
	_, port, _ := net.SplitHostPort(httpAddr)
	malloryURL := "http://mallory.example.test:" + port + "/"
	testwait.Until(t, 30*time.Second, malloryURL+" answers", func() error {
		if code := statusVia(httpAddr, malloryURL); code != 200 {
			return fmt.Errorf("%d", code)
		}
		return nil
	})

	// Mallory's token taken out of the file, the log level raised, and a
	// bound lowered: one SIGHUP.
	writeFiles(t, dir, map[string][]byte{"edge.yml": config("example.test", "debug", "", 1)})
	edge.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the edge read its settings again", func() bool {
		return strings.Contains(edge.output(), `msg="SIGHUP: the settings were read again" applied="tokens (1), limits, log-level debug"`)
	})
	if code, body := adminCall(t, adminAddr, "POST", "/v1/identities/mallory/disconnect"); code != 200 || !strings.Contains(body, `"disconnected":1`) {
		t.Fatalf("disconnect mallory: %d %s", code, body)
	}
	refused := mallory.count("unauthorized")
	testwait.Within(t, 30*time.Second, "mallory's agent tries to come back twice, and is refused", func() bool {
		return mallory.count("unauthorized") >= refused+2
	})
	if code := statusVia(httpAddr, malloryURL); code == 200 {
		t.Errorf("mallory's URL answers again")
	}
	if code, body := adminCall(t, adminAddr, "GET", "/v1/sessions"); code != 200 || strings.Contains(body, `"identity":"mallory"`) {
		t.Errorf("sessions after the withdrawal: %d %s", code, body)
	}
	// The bound of 1 endpoint per identity holds: alice binds one, not two.
	startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "alice-token", "-url", "http://alice.example.test", "-to", app)
	aliceURL := "http://alice.example.test:" + port + "/"
	testwait.Until(t, 30*time.Second, aliceURL+" answers", func() error {
		if code := statusVia(httpAddr, aliceURL); code != 200 {
			return fmt.Errorf("%d", code)
		}
		return nil
	})
	second := startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-token", "alice-token", "-url", "http://second.example.test", "-to", app)
	testwait.Within(t, 30*time.Second, "alice's second endpoint refused by the bound", func() bool {
		return strings.Contains(second.output(), "at most 1")
	})
	// Debug lines now.
	if !strings.Contains(edge.output(), "level=DEBUG") {
		t.Error("no debug line after the log level was raised")
	}

	// A change that takes a restart is named; the edge keeps the old one.
	writeFiles(t, dir, map[string][]byte{"edge.yml": config("other.test", "debug", "", 1)})
	edge.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the edge named the setting that takes a restart", func() bool {
		return strings.Contains(edge.output(), `msg="SIGHUP: changed, but taking a restart; the edge goes on with them as they were" settings=domain`)
	})
	if code := statusVia(httpAddr, aliceURL); code != 200 {
		t.Errorf("alice's URL under the old domain after the SIGHUP: %d", code)
	}
	// A file that does not read changes nothing.
	writeFiles(t, dir, map[string][]byte{"edge.yml": []byte("tokens: [\n")})
	edge.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, 30*time.Second, "the edge said the file did not read", func() bool {
		return strings.Contains(edge.output(), `msg="SIGHUP: the settings were not read again; every one stays as it was"`)
	})
	if code := statusVia(httpAddr, aliceURL); code != 200 {
		t.Errorf("alice's URL after a file that does not read: %d", code)
	}
}
