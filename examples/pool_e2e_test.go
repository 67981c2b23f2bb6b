package examples_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// Pools and health checks through the built binaries (issue #41): a pool
// whose member's app is down loses no request, a member whose check fails
// is left out and comes back, and when every member is down clients are
// told to come back later.

// poolApp is an HTTP app for the pool tests: / answers its name, POST /
// checks its body's digest, /ws upgrades and echoes, and /healthz answers
// as healthy says.
type poolApp struct {
	name    string
	addr    string
	healthy atomic.Bool
	flaps   atomic.Bool  // /healthz fails and passes in turn, whatever healthy says
	checks  atomic.Int64 // /healthz requests
	srv     *http.Server
}

func startPoolApp(t *testing.T, name string) *poolApp {
	t.Helper()
	a := &poolApp{name: name}
	a.healthy.Store(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.addr = ln.Addr().String()
	a.srv = &http.Server{Handler: http.HandlerFunc(a.serve)}
	go a.srv.Serve(ln)
	t.Cleanup(func() { a.srv.Close() })
	return a
}

func (a *poolApp) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		n := a.checks.Add(1)
		if a.flaps.Load() && n%2 == 1 || !a.flaps.Load() && !a.healthy.Load() {
			http.Error(w, "sick", http.StatusInternalServerError)
		}
	case "/ws":
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		io.Copy(c, rw) // echo
	default:
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		if want := r.Header.Get("Body-Sha256"); want != "" && want != hex.EncodeToString(h.Sum(nil)) {
			http.Error(w, "the body is not whole", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%s %d", a.name, n)
	}
}

// upgradeEcho upgrades a connection to url's /ws through the edge at pub,
// sends msg and returns what comes back.
func upgradeEcho(pub, host, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", pub, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return "", fmt.Errorf("upgrade: %s", resp.Status)
	}
	io.WriteString(c, msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil {
		return "", err
	}
	return string(got), nil
}

// TestPoolWithADeadApp: two agents of one identity in a pool, the second
// forwarding to a port where nothing listens: not one of 1,000 requests
// fails (GETs, POSTs of 1 MB whose digest the app checks, WebSocket
// upgrades), nor one of 100 tcp connections of an echo pool; the dead
// member is tried, then left out: its agent logs few conns.
func TestPoolWithADeadApp(t *testing.T) {
	t.Parallel()
	tk := filepath.Join(build(t, "tunnelkit"), "tunnelkit")
	dir := t.TempDir()
	agents, pub := freePort(t), freePort(t)
	_, port, _ := net.SplitHostPort(freePort(t))
	tokens := writeFile(t, dir, "tokens.txt", "pool-token team\n")
	startCmd(t, nil, tk, "edge", "-agents", agents, "-http", pub, "-tokens", tokens, "-tcp-ports", port)
	waitListening(t, agents)
	live := startPoolApp(t, "live")
	echo := echoServer(t)
	agentArgs := func(httpTo, tcpTo string) string {
		return fmt.Sprintf("edge: %s\ntoken: pool-token\nstate: \"\"\nendpoints:\n  - url: http://p\n    to: %s\n    pool: true\n  - url: tcp://:%s\n    to: %s\n    pool: true\n", agents, httpTo, port, tcpTo)
	}
	a1 := startCmd(t, nil, tk, "agent", "-config", writeFile(t, dir, "a1.yml", agentArgs(live.addr, echo)))
	url := a1.line(t)
	a1.line(t)
	dead := freePort(t)
	a2 := startCmd(t, nil, tk, "agent", "-config", writeFile(t, dir, "a2.yml", agentArgs(dead, dead)))
	a2.line(t)
	a2.line(t)

	_, host, _ := strings.Cut(url, "://")
	body := bytes.Repeat([]byte("tunnelkit pools "), 1<<16) // 1 MiB
	sum := sha256.Sum256(body)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DisableKeepAlives: true, // a new stream, and a new choice of member, each time
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, pub)
		},
	}}
	var failed atomic.Int64
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				var err error
				switch {
				case i%10 == 0:
					var got string
					if got, err = upgradeEcho(pub, host, fmt.Sprint("ws ", i)); err == nil && got != fmt.Sprint("ws ", i) {
						err = fmt.Errorf("echo %q", got)
					}
				case i%10 < 3:
					req, _ := http.NewRequest("POST", url+"/", bytes.NewReader(body))
					req.Header.Set("Body-Sha256", hex.EncodeToString(sum[:]))
					err = expect(client, req, fmt.Sprint("live ", len(body)))
				default:
					req, _ := http.NewRequest("GET", url+"/", nil)
					err = expect(client, req, "live 0")
				}
				if err != nil {
					failed.Add(1)
					t.Errorf("request %d: %v", i, err)
				}
			}
		})
	}
	for i := range 1000 {
		work <- i
	}
	close(work)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 1,000 requests failed", n)
	}
	for i := range 100 {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "conn %d\n", i)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if want := fmt.Sprintf("echo: conn %d\n", i); err != nil || line != want {
			t.Fatalf("tcp conn %d: %q, %v; want %q", i, line, err, want)
		}
	}
	// The dead member: tried, then left out (the edge skips it for a
	// cooldown that doubles each time it fails again).
	tried := strings.Count(a2.stderr.String(), "the app cannot be reached; the edge tries the pool's other members")
	if tried == 0 || tried > 10 {
		t.Errorf("the dead member's agent turned away %d requests of 1,000: want it tried, then left out", tried)
	}
	t.Logf("the dead member was tried %d times for 1,000 requests", tried)
}

// expect sends req with client and checks the answer is 200 with body.
func expect(client *http.Client, req *http.Request, body string) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != body {
		return fmt.Errorf("%s %q, want 200 %q", resp.Status, b, body)
	}
	return nil
}

// TestPoolHealthChecks: two members whose agents check their apps
// (health_check: path /healthz, interval 1s, healthy_after 2,
// unhealthy_after 2): an app that goes down is left out, no request
// failing; one that comes back serves again; when both are down, clients
// get 503 app_unhealthy with Retry-After; a check that fails, passes,
// fails... never takes a member down. The admin API shows each member's
// health.
func TestPoolHealthChecks(t *testing.T) {
	t.Parallel()
	tk := filepath.Join(build(t, "tunnelkit"), "tunnelkit")
	dir := t.TempDir()
	agents, pub, admin := freePort(t), freePort(t), freePort(t)
	tokens := writeFile(t, dir, "tokens.txt", "pool-token team\n")
	adminTok := writeFile(t, dir, "admin-token", adminToken+"\n")
	startCmd(t, nil, tk, "edge", "-agents", agents, "-http", pub, "-tokens", tokens, "-admin", admin, "-admin-token-file", adminTok)
	waitListening(t, admin)
	apps := []*poolApp{startPoolApp(t, "a"), startPoolApp(t, "b")}
	var url string
	for i, app := range apps {
		cfg := fmt.Sprintf("edge: %s\ntoken: pool-token\nstate: \"\"\nendpoints:\n  - url: http://hc\n    to: %s\n    pool: true\n    health_check:\n      path: /healthz\n      interval: 1s\n      timeout: 500ms\n      unhealthy_after: 2\n      healthy_after: 2\n", agents, app.addr)
		a := startCmd(t, nil, tk, "agent", "-config", writeFile(t, dir, fmt.Sprint("a", i, ".yml"), cfg))
		url = a.line(t)
	}
	healths := func() []string {
		_, body := adminCall(t, admin, "GET", "/v1/endpoints")
		var out struct {
			Endpoints []struct{ Health string } `json:"endpoints"`
		}
		json.Unmarshal([]byte(body), &out)
		var hs []string
		for _, e := range out.Endpoints {
			hs = append(hs, e.Health)
		}
		return hs
	}
	upCount := func() int { return strings.Count(strings.Join(healths(), ","), "up") }
	testwait.Within(t, 30*time.Second, "both members up", func() bool { return upCount() == 2 })
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, pub)
		},
	}}
	answers := func(n int) map[string]int {
		got := map[string]int{}
		for range n {
			resp, err := client.Get(url + "/")
			if err != nil {
				got[err.Error()]++
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got[resp.Status+" "+string(b)]++
		}
		return got
	}

	apps[0].healthy.Store(false)
	testwait.Within(t, 30*time.Second, "member a down", func() bool { return upCount() == 1 })
	if got := answers(50); got["200 OK b 0"] != 50 {
		t.Errorf("a down: %v, want every answer from b", got)
	}
	apps[1].healthy.Store(false)
	testwait.Within(t, 30*time.Second, "both down", func() bool { return upCount() == 0 })
	resp, err := client.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "2" || !strings.HasPrefix(string(b), "app_unhealthy: ") {
		t.Errorf("both down: %s, Retry-After %q, %q; want 503 app_unhealthy, Retry-After 2", resp.Status, resp.Header.Get("Retry-After"), b)
	}
	back := time.Now()
	apps[0].healthy.Store(true)
	testwait.Within(t, 30*time.Second, "a serves again", func() bool { return answers(1)["200 OK a 0"] == 1 })
	t.Logf("a served again %v after its app came back (interval 1s, healthy_after 2)", time.Since(back).Round(100*time.Millisecond))

	// b's check flaps: fail, pass, fail... with unhealthy_after 2 it never
	// goes down, once up.
	apps[1].healthy.Store(true)
	testwait.Within(t, 30*time.Second, "b up again", func() bool { return upCount() == 2 })
	from := apps[1].checks.Load()
	apps[1].flaps.Store(true)
	testwait.Within(t, 30*time.Second, "six checks of b's flapping app", func() bool { return apps[1].checks.Load() >= from+6 })
	if hs := healths(); upCount() != 2 {
		t.Errorf("a flapping check took a member down: %v", hs)
	}
}
