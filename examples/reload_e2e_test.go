package examples_test

import (
	"context"
	"crypto/sha256"
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
// endpoint at a random name and the app of a third (its "to"), while
// another identity loops binds of the first name all along, keeps every
// name and URL (nothing new is printed), and a download under way on the
// first endpoint completes intact; the new settings hold for the next
// requests. Through the built binaries, issue #39's item 3.
func TestAgentReloadInPlace(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "edge", "agent")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens.txt", "alice-token alice\nmallory-token mallory\n")
	startCmd(t, nil, filepath.Join(bin, "edge"), "-agents", agents, "-http", pub, "-domain", "example.test", "-tokens", tokens)
	waitListening(t, agents)

	bigLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	big := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "big app")
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(bigSize))
		io.Copy(w, io.TeeReader(bigBody(), counter{&sent}))
	})}
	go big.Serve(bigLn)
	t.Cleanup(func() { big.Close() })
	oldApp, newApp := localHTTPApp(t, "old app"), localHTTPApp(t, "new app")

	config := func(deny, password, to string) string {
		c := fmt.Sprintf("edge: %s\ntoken: alice-token\nstate: \"\"\nendpoints:\n", agents)
		c += fmt.Sprintf("  - url: http://cfgapp\n    to: %s\n", bigLn.Addr())
		if deny != "" {
			c += fmt.Sprintf("    policy:\n      cidr_deny: [%s]\n", deny)
		}
		c += fmt.Sprintf("  - url: http://\n    to: %s\n    policy:\n      basic_auth: [\"ann:%s\"]\n", bigLn.Addr(), password)
		c += fmt.Sprintf("  - url: http://moving\n    to: %s\n", to)
		return c
	}
	path := writeFile(t, dir, "agent.yml", config("", "first-password", oldApp))
	a := startCmd(t, nil, filepath.Join(bin, "agent"), "-config", path)
	urls := []string{a.line(t), a.line(t), a.line(t)}
	cfgURL, randomURL, movingURL := urls[0], urls[1], urls[2]
	if !strings.HasPrefix(cfgURL, "http://cfgapp.example.test:") || !strings.HasPrefix(movingURL, "http://moving.example.test:") {
		t.Fatalf("URLs %q", urls)
	}
	if status, _ := fetch(t, pub, randomURL+"/", "ann", "first-password"); status != 200 {
		t.Fatalf("the random-name endpoint with its password: %d", status)
	}

	// The download starts, and is under way: its first MiB is read.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", cfgURL+"/big", nil)
	resp, err := viaEdge(pub).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := sha256.New()
	if _, err := io.CopyN(sum, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}

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

	path = writeFile(t, dir, "agent.yml", config("127.0.0.0/8", "second-password", newApp))
	a.cmd.Process.Signal(syscall.SIGHUP)
	testwait.Within(t, time.Minute, "the agent read the file again", func() bool {
		return strings.Contains(a.stderr.String(), `msg="SIGHUP: the file was read again" file=`+path+" added=0 changed=3 removed=0")
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
	if n := sent.Load(); n >= bigSize {
		t.Fatalf("the app sent the whole download (%d bytes) before the reload: it was not under way across it", n)
	}
	n, err := io.Copy(sum, resp.Body)
	if err != nil || n+1<<20 != bigSize {
		t.Fatalf("the download across the reload: %d bytes, %v; want %d", n+1<<20, err, bigSize)
	}
	want := sha256.New()
	io.Copy(want, bigBody())
	if string(sum.Sum(nil)) != string(want.Sum(nil)) {
		t.Fatal("the download across the reload is not the app's bytes")
	}
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
