package examples_test

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testproxy"
)

// TestAgentThroughProxy runs the agent binary with -proxy through a real
// tinyproxy that takes a password: the agent prints its URL and serves
// through the edge, and the proxy logged the tunnel to the edge's agent
// port. With a wrong password the agent exits 2, with a message that names
// the proxy and not the password.
func TestAgentThroughProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	agents, pub := freePort(t), freePort(t)
	_, agentPort, _ := net.SplitHostPort(agents)
	port, _ := strconv.Atoi(agentPort)
	p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "agent", Password: "pr0xy-pass", ConnectPorts: []int{port}})

	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test")
	waitListening(t, agents)
	waitListening(t, pub)
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "app behind a proxy") })}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })

	public := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-proxy", p.URL.String(),
		"-url", "http://proxied.example.test", "-to", appLn.Addr().String()))
	if got := getVia(t, pub, public+"/"); got != "app behind a proxy" {
		t.Fatalf("through the agent: %q", got)
	}
	if err := p.WaitLog("Established connection to host \"127.0.0.1\""); err != nil {
		t.Errorf("tinyproxy: %v", err)
	}

	wrong := *p.URL
	wrong.User = url.UserPassword("agent", "wr0ng-pass")
	out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-proxy", wrong.String(), "-to", appLn.Addr().String()).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("agent with a wrong proxy password: %v, want exit 2\n%s", err, out)
	}
	if want := "agent: proxy http://" + p.Addr + ": refused the credentials"; !strings.Contains(string(out), want) || strings.Contains(string(out), "wr0ng-pass") {
		t.Errorf("agent with a wrong proxy password said %q; want %q, without the password", out, want)
	}
}
