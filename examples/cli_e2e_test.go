package examples_test

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// The tunnelkit command as a newcomer meets it (issue #40): its
// subcommands, its version and completion, the ports it writes into URLs,
// and what it says when something is wrong.

// tunnelkitOut runs the built tunnelkit with args, within 30 s, and
// returns its exit code and what it printed.
func tunnelkitOut(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(build(t, "tunnelkit"), "tunnelkit"), args...).CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("tunnelkit %q did not exit within 30 s\n%s", args, out)
	}
	return exitCode(err), string(out)
}

// TestTunnelkitSubcommands: the subcommands, -h, version and completion,
// and a mistyped subcommand or protocol.
func TestTunnelkitSubcommands(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"-h"}, 0, []string{"Usage: tunnelkit SUBCOMMAND", "  http ", "  edge ", "  agent ", "  completion "}},
		{[]string{"help", "edge"}, 0, []string{"Usage of tunnelkit edge", "-public-http-port"}},
		{[]string{"version"}, 0, []string{"tunnelkit version ", "\tpath\tgithub.com/tunnelkit/tunnelkit/examples/tunnelkit", "\tmod\tgithub.com/tunnelkit/tunnelkit/examples", "\tdep\tgolang.ngrok.com/muxado/v2\t", "\tbuild\tGOOS="}},
		{[]string{"completion", "bash"}, 0, []string{"complete -o filenames -F _tunnelkit tunnelkit", "-public-http-port", "-verbose-errors"}},
		{[]string{"completion", "zsh"}, 0, []string{"bashcompinit", "complete -o filenames -F _tunnelkit tunnelkit"}},
		{[]string{"completion", "fish"}, 2, []string{"want bash or zsh"}},
		{nil, 2, []string{"Usage: tunnelkit SUBCOMMAND"}},
		{[]string{"edgee"}, 2, []string{`unknown subcommand "edgee": did you mean "edge"?`}},
		{[]string{"htpp", "3000"}, 2, []string{`unknown subcommand "htpp": did you mean "http"?`}},
		{[]string{"agent", "htpp", "3000"}, 2, []string{`tunnelkit agent: unknown protocol "htpp": want http, https, tcp or tls (did you mean "http"?)`}},
		{[]string{"-domain", "x"}, 2, []string{"-domain comes after a subcommand"}},
	} {
		code, out := tunnelkitOut(t, c.args...)
		if code != c.code {
			t.Errorf("tunnelkit %q: exit %d, want %d\n%s", c.args, code, c.code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("tunnelkit %q: no %q in\n%s", c.args, w, out)
			}
		}
	}
	// The completion script is bash.
	_, script := tunnelkitOut(t, "completion", "bash")
	if out, err := exec.Command("bash", "-n", "-c", script).CombinedOutput(); err != nil {
		t.Errorf("the bash completion does not parse: %v\n%s", err, out)
	}
}

// TestHelpEverySubcommand: "tunnelkit help X" answers for every
// subcommand that "tunnelkit -h" lists, those main runs itself (version,
// completion, help) too: its usage, and exit 0.
func TestHelpEverySubcommand(t *testing.T) {
	t.Parallel()
	_, usage := tunnelkitOut(t, "-h")
	_, list, ok := strings.Cut(usage, "\nSubcommands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var names []string
	for line := range strings.Lines(list) {
		if f := strings.Fields(line); ok && len(f) > 0 {
			names = append(names, f[0])
		}
	}
	for _, own := range []string{"version", "completion", "help", "edge", "agent", "http"} {
		if !slices.Contains(names, own) {
			t.Fatalf("tunnelkit -h lists %q, without %s:\n%s", names, own, usage)
		}
	}
	for _, name := range names {
		code, out := tunnelkitOut(t, "help", name)
		want := "Usage of tunnelkit " + name
		switch name {
		case "http", "https", "tcp", "tls":
			want = "Usage of tunnelkit agent" // the agent's shorthands
		}
		if code != 0 || !strings.Contains(out, want) || strings.Contains(out, "unknown subcommand") {
			t.Errorf("tunnelkit help %s: exit %d, want 0 and %q in\n%s", name, code, want, out)
		}
	}
	// Those main runs itself say how they are run.
	for name, line := range map[string]string{"version": "tunnelkit version", "completion": "tunnelkit completion bash|zsh", "help": "tunnelkit help [SUBCOMMAND]"} {
		if _, out := tunnelkitOut(t, "help", name); !strings.Contains(out, "\n  "+line+"\n") {
			t.Errorf("tunnelkit help %s: no usage line %q in\n%s", name, line, out)
		}
	}
}

// TestPublicPorts: -public-http-port and -public-tls-port are the ports
// the edge writes into the URLs it gives agents (behind a load balancer,
// NAT or docker -p), 80 and 443 none; a value that is no port, or
// -public-tls-port without -tls, is refused.
func TestPublicPorts(t *testing.T) {
	t.Parallel()
	bin := build(t, "tunnelkit")
	tk := filepath.Join(bin, "tunnelkit")
	app := localHTTPApp(t, "app")
	for _, c := range []struct{ port, want string }{
		{"9999", "http://shop.example.test:9999"},
		{"80", "http://shop.example.test"},
	} {
		agents, httpAddr := freePort(t), freePort(t)
		startCmd(t, nil, tk, "edge", "-agents", agents, "-http", httpAddr, "-public-http-port", c.port)
		waitListening(t, agents)
		a := startCmd(t, nil, tk, "agent", "-edge", agents, "-url", "http://shop", "-to", app, "-state", "")
		if got := a.line(t); got != c.want {
			t.Errorf("-public-http-port %s: the agent printed %q, want %q", c.port, got, c.want)
		}
		// The edge's own port serves it all the same.
		if status, body := fetch(t, httpAddr, "http://shop.example.test/", "", ""); status != 200 || body != "app" {
			t.Errorf("-public-http-port %s: through -http: %d %q", c.port, status, body)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-public-http-port", "eighty"}, `-public-http-port "eighty": want a port, 1 to 65535`},
		{[]string{"-public-http-port", "70000"}, `-public-http-port "70000": want a port, 1 to 65535`},
		{[]string{"-public-tls-port", "8443"}, "-public-tls-port is the public port of -tls: give -tls too"},
	} {
		code, out := tunnelkitOut(t, append([]string{"edge", "-agents", freePort(t), "-http", freePort(t)}, c.args...)...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("tunnelkit edge %q: exit %d, want 2 and %q\n%s", c.args, code, c.want, out)
		}
	}
}

// TestAgentSaysWhatToCheck: the agent's messages when something is off.
// An edge that is not there gets, after a few attempts, one line saying
// what to check; an app that does not listen yet, one warning while the
// endpoint serves; a URL twice in a file, or a mistyped policy kind or
// value, an error at load naming the lines; the operator's disconnect,
// the edge's words.
func TestAgentSaysWhatToCheck(t *testing.T) {
	t.Parallel()
	bin := build(t, "tunnelkit")
	tk := filepath.Join(bin, "tunnelkit")
	dir := t.TempDir()

	// No edge at -edge.
	nowhere := freePort(t)
	a := startCmd(t, nil, tk, "agent", "-edge", nowhere, "-url", "http://x", "-to", "3000", "-state", "")
	testwait.Within(t, 60*time.Second, "the agent says what to check", func() bool {
		return strings.Contains(a.stderr.String(), `msg="the edge cannot be reached: nothing listens there: check that the edge runs ('tunnelkit edge') and that -edge names its -agents address (127.0.0.1:7000 by default); the agent keeps trying (-wait bounds how long)" edge=`+nowhere+" attempts=3")
	})
	a.kill()
	if n := strings.Count(a.stderr.String(), "the edge cannot be reached"); n != 1 {
		t.Errorf("the hint came %d times, want once", n)
	}

	// An edge, and an app that is not up yet.
	agents, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens.txt", "t1 alice\n")
	admin := writeFile(t, dir, "admin-token", adminToken+"\n")
	startCmd(t, nil, tk, "edge", "-agents", agents, "-http", httpAddr, "-tokens", tokens, "-admin", adminAddr, "-admin-token-file", admin)
	waitListening(t, adminAddr)
	later := freePort(t)
	a = startCmd(t, nil, tk, "agent", "-edge", agents, "-token", "t1", "-url", "http://later", "-to", later, "-state", "")
	url := a.line(t)
	testwait.Within(t, 30*time.Second, "the agent warns that nothing answers at -to", func() bool {
		return strings.Contains(a.stderr.String(), `msg="nothing answers at the app's address yet: the endpoint is up, and its requests fail until the app listens there" url=`+url+" to="+later)
	})
	ln, err := net.Listen("tcp", later)
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()

	// The operator disconnects alice.
	if code, body := adminCall(t, adminAddr, "POST", "/v1/identities/alice/disconnect"); code != 200 || !strings.Contains(body, `"disconnected":1`) {
		t.Fatalf("disconnect: %d %s", code, body)
	}
	testwait.Within(t, 30*time.Second, "the agent logs the operator's disconnect", func() bool {
		return strings.Contains(a.stderr.String(), `msg="the edge ended the session" edge=`+agents+` reason="disconnected by the edge's operator; its names are kept for it a while"`)
	})
	if strings.Contains(a.stderr.String(), "use of closed network connection") {
		t.Errorf("the agent's log speaks of a closed connection:\n%s", a.stderr.String())
	}

	// Files that do not load.
	for _, c := range []struct{ file, want string }{
		{"edge: " + agents + "\nendpoints:\n  - url: http://app\n    to: 3000\n  - url: HTTP://App.\n    to: 3001\n",
			"agent.yml:5: endpoint 2: url HTTP://App. is endpoint 1's already (line 3): each url once"},
		{"edge: " + agents + "\nendpoints:\n  - url: tcp://\n    to: 22\n  - url: tcp://\n    to: 22\n    policy:\n      cidr_allow: [10.0.0.0/8]\n",
			`agent.yml:5: endpoint 2: url "tcp://" and to "22" are endpoint 1's already (line 3): two endpoints of random URLs need apps of their own`},
		{"edge: " + agents + "\nendpoints:\n  - url: http://app\n    to: 3000\n    policy:\n      cidr_alow: [10.0.0.0/8]\n",
			`agent.yml:6: policy: unknown kind "cidr_alow": did you mean "cidr_allow"?`},
		{"edge: " + agents + "\nendpoints:\n  - url: http://app\n    to: 3000\n    pool: yes please\n",
			`agent.yml:5: pool takes true or false, not "yes please"`},
	} {
		path := writeFile(t, dir, "agent.yml", c.file)
		code, out := tunnelkitOut(t, "agent", "-config", path)
		if code != 2 || !strings.Contains(out, dir+string(filepath.Separator)+c.want) {
			t.Errorf("%q: exit %d, want 2 and %q\n%s", c.file, code, c.want, out)
		}
	}
}
