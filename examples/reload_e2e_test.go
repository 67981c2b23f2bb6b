package examples_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// TestAgentReloadInPlace: an agent's reload that changes the policy of an
// endpoint (a cidr_deny of the client), the basic_auth password of an
// endpoint at a random name, the app of a third (its "to") and the Host
// header of a fourth, while
// another identity loops binds of the first name all along, keeps every
// name and URL (nothing new is printed), and a download under way on the
// first endpoint completes intact; the new settings hold for the next
// requests. Through the built binaries, issue #39's item 3.
func TestAgentReloadInPlace(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens.txt", "alice-token alice\nmallory-token mallory\n")
	startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test", "-tokens", tokens)
	waitListening(t, agents)

	big := serveBigApp(t)
	oldApp, newApp := localHTTPApp(t, "old app"), localHTTPApp(t, "new app")
	hostLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hostApp := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Host) })}
	go hostApp.Serve(hostLn)
	t.Cleanup(func() { hostApp.Close() })

	config := func(deny, password, to, host string) string {
		c := fmt.Sprintf("edge: %s\ntoken: alice-token\nstate: \"\"\nendpoints:\n", agents)
		c += fmt.Sprintf("  - url: http://cfgapp\n    to: %s\n", big.addr)
		if deny != "" {
			c += fmt.Sprintf("    policy:\n      cidr_deny: [%s]\n", deny)
		}
		c += fmt.Sprintf("  - url: http://\n    to: %s\n    policy:\n      basic_auth: [\"ann:%s\"]\n", big.addr, password)
		c += fmt.Sprintf("  - url: http://moving\n    to: %s\n", to)
		c += fmt.Sprintf("  - url: http://hosted\n    to: %s\n    host_header: %s\n", hostLn.Addr(), host)
		return c
	}
	path := writeFile(t, dir, "agent.yml", config("", "first-password", oldApp, "first.internal"))
	a := startCmd(t, nil, filepath.Join(bin, "tunnelkit"), "agent", "-config", path)
	urls := []string{a.line(t), a.line(t), a.line(t), a.line(t)}
	cfgURL, randomURL, movingURL, hostedURL := urls[0], urls[1], urls[2], urls[3]
	if !strings.HasPrefix(cfgURL, "http://cfgapp.example.test:") || !strings.HasPrefix(movingURL, "http://moving.example.test:") {
		t.Fatalf("URLs %q", urls)
	}
	if status, _ := fetch(t, pub, randomURL+"/", "ann", "first-password"); status != 200 {
		t.Fatalf("the random-name endpoint with its password: %d", status)
	}
	if status, body := fetch(t, pub, hostedURL+"/", "", ""); status != 200 || body != "first.internal" {
		t.Fatalf("the endpoint with a Host header: %d %q", status, body)
	}

	// The download starts, and is under way.
	d := big.startDownload(t, pub, cfgURL)

	// Mallory loops binds of cfgapp from two sessions.
	lctx, stopLoop := context.WithCancel(context.Background())
	defer stopLoop()
	var won atomic.Bool
	var tries atomic.Int64
	var loops sync.WaitGroup
	for range 2 {
		m := &agent.Client{Addrs: []string{agents}, Token: "mallory-token"}
		defer m.Close()
		loops.Go(func() {
			for lctx.Err() == nil {
				tries.Add(1)
				if l, err := m.Listen(lctx, "http://cfgapp"); err == nil {
					won.Store(true)
					l.Close()
				}
			}
		})
	}

	path = writeFile(t, dir, "agent.yml", config("127.0.0.0/8", "second-password", newApp, "second.internal"))
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, time.Minute, "the agent read the file again", func() bool {
		return strings.Contains(a.stderr.String(), `msg="SIGHUP: the file was read again" file=`+path+" added=0 changed=4 removed=0")
	})
	if status, body := fetch(t, pub, cfgURL+"/", "", ""); status != http.StatusForbidden {
		t.Errorf("cfgapp after its cidr_deny: %d %q, want 403", status, body)
	}
	if status, _ := fetch(t, pub, randomURL+"/", "ann", "first-password"); status != http.StatusUnauthorized {
		t.Errorf("the random-name endpoint, the old password: %d, want 401", status)
	}
	if status, body := fetch(t, pub, randomURL+"/", "ann", "second-password"); status != 200 || body != "big app" {
		t.Errorf("the random-name endpoint, at the same URL, the new password: %d %q", status, body)
	}
	if status, body := fetch(t, pub, movingURL+"/", "", ""); status != 200 || body != "new app" {
		t.Errorf("the endpoint whose app moved: %d %q, want the new app", status, body)
	}
	if status, body := fetch(t, pub, hostedURL+"/", "", ""); status != 200 || body != "second.internal" {
		t.Errorf("the endpoint whose Host header changed: %d %q, want second.internal", status, body)
	}
	d.finish(t, "reload")
	stopLoop()
	loops.Wait()
	if won.Load() {
		t.Errorf("mallory bound cfgapp across the reload (%d tries)", tries.Load())
	}
	select {
	case l := <-a.lines:
		t.Errorf("the agent printed a new URL: %q", l)
	default:
	}
	t.Logf("mallory's binds: %d", tries.Load())
}
