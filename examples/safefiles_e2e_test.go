//go:build unix

package examples_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// The files of issue 39, through the built binaries: links planted where
// the edge and the agent write their state, secrets others may read, named
// pipes given as files, and a ${VAR} that spells something else than a
// string.

// plant puts a link at link to target.
func plant(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// stillALink checks that link is still the link planted.
func stillALink(t *testing.T, link string) {
	t.Helper()
	if info, err := os.Lstat(link); err != nil || info.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("%s is no longer the link planted: %v, %v", link, info, err)
	}
}

// refused runs bin with args, env added, and returns its output, which
// must come with exit 2 within 30 s: a binary that takes what it should
// refuse goes on running (or blocks on a pipe), and is killed then.
func refused(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Errorf("%s %q did not exit within 30 s: it took what it should refuse, or blocked\n%s", filepath.Base(bin), args, out)
		return string(out)
	}
	if code := exitCode(err); code != 2 {
		t.Errorf("%s %q: exit %d (%v), want 2\n%s", filepath.Base(bin), args, code, err, out)
	}
	return string(out)
}

// stop ends p with SIGINT and waits for it, which must exit cleanly.
func (p *cmdProc) stop(t *testing.T) {
	t.Helper()
	p.killed = true // no second SIGINT at the test's end
	p.cmd.Process.Signal(syscall.SIGINT)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("%s exited with %v\n%s", filepath.Base(p.cmd.Path), err, p.stderr.String())
	}
}

// TestAgentStateLinksPlanted: a link planted where the agent wrote its
// state first (STATE.new, before) is not followed: the agent's session
// ticket does not land in the link's target. A link at the state file
// itself, or at its lock, stops the agent, naming it, and the link's
// target (missing) is not created.
func TestAgentStateLinksPlanted(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)
	_, appPort, _ := net.SplitHostPort(localHTTPApp(t, "app"))

	target, untouched := testtools.LinkTarget(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	plant(t, target, state+".new")
	a := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", state, "http", appPort)
	a.line(t)
	a.stop(t)
	untouched()
	stillALink(t, state+".new")
	b, err := os.ReadFile(state)
	if info, _ := os.Lstat(state); err != nil || !info.Mode().IsRegular() || !strings.Contains(string(b), `"session"`) {
		t.Errorf("the state file: %v, %v, %q; want a regular file holding the session", info, err, b)
	}

	for _, name := range []string{"state.json", "state.json.lock"} {
		dir := t.TempDir()
		missing := filepath.Join(t.TempDir(), "not-there")
		link := filepath.Join(dir, name)
		plant(t, missing, link)
		out := refused(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-state", filepath.Join(dir, "state.json"), "http", appPort)
		if !strings.Contains(out, "-state: "+link+" is a symbolic link") {
			t.Errorf("a link at %s: %q, want the agent to name it as a link", name, out)
		}
		stillALink(t, link)
		if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a link at %s: its target was created (%v)", name, err)
		}
	}
}

// TestEdgeStateLinksPlanted: a link planted where the edge wrote its
// record's snapshot first (names.jsonl.tmp, before) is not followed. A
// link at the record itself, or at -ticket-key, stops the edge, naming
// it, and the link's target is untouched (or, missing, not created).
func TestEdgeStateLinksPlanted(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	tk := filepath.Join(bin, "tunnelkit")
	target, untouched := testtools.LinkTarget(t)

	dir := t.TempDir()
	plant(t, target, filepath.Join(dir, "names.jsonl.tmp"))
	agents := freePort(t)
	e := startCmd(t, nil, tk, "edge", "-agents", agents, "-http", freePort(t), "-ticket-key", filepath.Join(dir, "ticket.key"))
	waitListening(t, agents)
	e.stop(t)
	untouched()
	stillALink(t, filepath.Join(dir, "names.jsonl.tmp"))
	b, err := os.ReadFile(filepath.Join(dir, "names.jsonl"))
	if info, _ := os.Lstat(filepath.Join(dir, "names.jsonl")); err != nil || !info.Mode().IsRegular() || !strings.Contains(string(b), `"stopped"`) {
		t.Errorf("the record: %v, %v, %q; want a regular file ending with the stop", info, err, b)
	}

	missing := filepath.Join(t.TempDir(), "not-there")
	for _, c := range []struct{ link, to string }{
		{"ticket.key", missing},
		{"ticket.key", target},
		{"names.jsonl", missing},
		{"names.jsonl", target},
	} {
		dir := t.TempDir()
		link := filepath.Join(dir, c.link)
		plant(t, c.to, link)
		args := []string{"-agents", freePort(t), "-http", freePort(t), "-state", dir}
		if c.link == "ticket.key" {
			args = append(args, "-ticket-key", link)
		}
		out := refused(t, nil, tk, append([]string{"edge"}, args...)...)
		if !strings.Contains(out, link+" is a symbolic link") {
			t.Errorf("a link at %s to %s: %q, want the edge to name it as a link", c.link, c.to, out)
		}
		stillALink(t, link)
	}
	untouched()
	if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the missing target of a link was created (%v)", err)
	}
}

// TestSecretsOpenToOthers: each secret the edge and the agent read, in a
// file of mode 0644, stops them with one message that names the file and
// says to chmod 600 it; a config file whose secrets come from ${VAR}
// is free to be read by others.
func TestSecretsOpenToOthers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	open := func(name, content string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	key := strings.Repeat("ab", 32) + "\n"
	for _, c := range []struct {
		bin, file, why string
		args           []string
	}{
		{"edge", open("tokens", "alice-token alice\n"), "its tokens let anyone connect agents as their identities", []string{"-tokens"}},
		{"edge", open("ticket.key", key), "the key lets anyone forge agents' tickets", []string{"-ticket-key"}},
		{"edge", open("admin.token", adminToken+"\n"), "the token gives the whole edge away", []string{"-admin", freePort(t), "-admin-token-file"}},
		{"edge", open("edge-tokens.yml", "domain: example.test\ntokens:\n  - token: alice-token\n    identity: alice\n"), "its line 3 writes out a token", []string{"-config"}},
		{"edge", open("edge-token.yml", "domain: example.test\ntoken: s3cret\n"), "its line 2 writes out a token", []string{"-config"}},
		{"edge", open("edge-policy.yml", "domain: example.test\npolicy:\n  basic_auth: [\"ann:pw\"]\n"), "its line 3 writes out a basic_auth password", []string{"-config"}},
		{"edge", open("policy.json", `{"basic_auth":{"credentials":["ann:pw"]}}`), "it holds passwords or secrets", []string{"-policy"}},
		{"agent", open("agent.yml", "edge: 127.0.0.1:1\ntoken: s3cret\nendpoints:\n  - url: http://app\n    to: 3000\n"), "its line 2 writes out a token", []string{"-config"}},
		{"agent", open("agent-proxy.yml", "edge: 127.0.0.1:1\nproxy: http://ann:s3cret@127.0.0.1:1\nendpoints:\n  - url: http://app\n    to: 3000\n"), "its line 2 writes out a proxy password", []string{"-config"}},
		{"agent", open("state.json", `{"version":1,"session":"t"}`), "its tickets give the agent's names away", []string{"-edge", "127.0.0.1:1", "http", "3000", "-state"}},
	} {
		args := append([]string{"-agents", freePort(t), "-http", freePort(t)}, c.args...)
		if c.bin == "agent" {
			args = c.args
		}
		out := refused(t, nil, filepath.Join(bin, "tunnelkit"), append(append([]string{c.bin}, args...), c.file)...)
		if want := c.file + " is open to others (mode 0644): " + c.why; !strings.Contains(out, want) || !strings.Contains(out, "; chmod 600 it") {
			t.Errorf("%s %q: %q\nwant %s...; chmod 600 it", c.bin, args, out, want)
		}
	}

	// The tokens from ${VAR}: the file holds none, and others may read it.
	agents := freePort(t)
	config := open("edge-env.yml", fmt.Sprintf("agents: %s\nhttp: %s\ndomain: example.test\ntokens:\n  - token: ${TK_TEST_TOKEN}\n    identity: alice\n", agents, freePort(t)))
	startCmd(t, []string{"TK_TEST_TOKEN=alice-token"}, filepath.Join(bin, "tunnelkit"), "edge", "-config", config)
	waitListening(t, agents)
}

// TestNamedPipesRefused: a named pipe given where the edge or the agent
// reads a file is refused at once, named: neither waits for a writer
// (a pipe as -admin-token-file kept the edge from starting, and from
// heeding SIGTERM).
func TestNamedPipesRefused(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	fifo := filepath.Join(t.TempDir(), "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	for _, args := range [][]string{
		{"edge", "-admin", freePort(t), "-admin-token-file", fifo},
		{"edge", "-tokens", fifo},
		{"edge", "-ticket-key", fifo},
		{"edge", "-config", fifo},
		{"edge", "-policy", fifo},
		{"agent", "-config", fifo},
		{"agent", "-edge", "127.0.0.1:1", "-state", fifo, "http", "3000"},
	} {
		if args[0] == "edge" {
			args = append([]string{"edge", "-agents", freePort(t), "-http", freePort(t)}, args[1:]...)
		}
		out := refused(t, nil, filepath.Join(bin, "tunnelkit"), args...)
		if !strings.Contains(out, fifo+" is not a regular file (a named pipe)") {
			t.Errorf("%q: %q, want the pipe refused, named", args, out)
		}
	}
}

// TestAgentTokenVariableIsAString: "token: ${TT}" with TT set to ~ (or
// null) sends the token "~", which the edge knows, not an empty one,
// which it would refuse; the file, whose token comes from the
// environment, may be read by others.
func TestAgentTokenVariableIsAString(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens", "~ tilde\nnull word-null\n")
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test", "-tokens", tokens)
	waitListening(t, agents)
	app := localHTTPApp(t, "app")
	for i, tt := range []string{"~", "null"} {
		config := writeFile(t, dir, fmt.Sprintf("agent%d.yml", i), fmt.Sprintf("edge: %s\ntoken: ${TT}\nstate: \"\"\nendpoints:\n  - url: http://name%d\n    to: %s\n", agents, i, app))
		if err := os.Chmod(config, 0o644); err != nil {
			t.Fatal(err)
		}
		a := startCmd(t, []string{"TT=" + tt}, filepath.Join(bin, "tunnelkit"), "agent", "-config", config)
		if url := a.line(t); !strings.HasPrefix(url, fmt.Sprintf("http://name%d.example.test:", i)) {
			t.Errorf("TT=%s: the agent printed %q", tt, url)
		}
	}
}
