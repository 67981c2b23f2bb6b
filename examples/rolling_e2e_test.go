package examples_test

import (
	"encoding/csv"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// ClusterTestEnv turns on TestRollingRestartBehindHAProxy, which runs for a
// minute or more: the README's test command leaves it out, and .ci/run
// runs it once, on its own.
const clusterTestEnv = "TUNNELKIT_CLUSTER_TEST"

// clusterBinEnv, when set, names a directory holding a tunnelkit binary to
// run instead of the one built from this tree: the test measures an older
// tree's edges so. Binaries without -admin are checked by HAProxy over
// TCP, and SIGTERM shuts them down.
const clusterBinEnv = "TUNNELKIT_CLUSTER_BIN"

// rollingEdge is one edge process of the rolling restart, with the ports it
// keeps across restarts.
type rollingEdge struct {
	name                       string
	agents, http, relay, admin string
	args                       []string
	p                          *proc
	restarts                   int
}

// TestRollingRestartBehindHAProxy runs three edges sharing their routes
// through etcd (/usr/bin/etcd) behind a real HAProxy, which checks each
// edge's /healthz and retries only connections that failed, so that no
// request is sent twice. An agent serves http://app.example.test, knowing
// the three edges. While 8 clients send requests through HAProxy for 40 s
// at least, each edge is stopped with SIGTERM (it drains: its agents move,
// what is in flight finishes) and started again, in turn, each once at
// least: not one request fails, and the agent's endpoint stays bound
// throughout. It logs the figures. Set TUNNELKIT_CLUSTER_TEST=1 to run it.
func TestRollingRestartBehindHAProxy(t *testing.T) {
	if os.Getenv(clusterTestEnv) != "1" {
		t.Skip("a minute long: set " + clusterTestEnv + "=1 to run it")
	}
	testtools.Need(t, "haproxy", "etcd")
	bin := build(t, "tunnelkit")
	if dir := os.Getenv(clusterBinEnv); dir != "" {
		bin = dir
	}
	out, _ := exec.Command(filepath.Join(bin, "tunnelkit"), "edge", "-h").CombinedOutput()
	drains := strings.Contains(string(out), "-admin")
	if !drains {
		t.Logf("%s/edge has no -admin: HAProxy checks it over TCP, and SIGTERM shuts it down", bin)
	}
	dir := t.TempDir()
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 13)
	}
	ca := testpki.New(t)
	writeFiles(t, dir, map[string][]byte{
		"ca.pem": ca.PEM, "ticket.key": []byte(hex.EncodeToString(key)),
		"admin-token": []byte(adminToken),
	})

	// etcd, as a process of its own.
	etcdClient, etcdPeer := freePort(t), freePort(t)
	startProc(t, "etcd", "--data-dir", filepath.Join(dir, "etcd"), "--name", "e",
		"--listen-client-urls", "http://"+etcdClient, "--advertise-client-urls", "http://"+etcdClient,
		"--listen-peer-urls", "http://"+etcdPeer, "--initial-advertise-peer-urls", "http://"+etcdPeer,
		"--initial-cluster", "e=http://"+etcdPeer, "--unsafe-no-fsync")
	waitListening(t, etcdClient)

	// The three edges, which write HAProxy's port into their URLs.
	front, stats := freePort(t), freePort(t)
	_, frontPort, _ := net.SplitHostPort(front)
	advertises := strings.Contains(string(out), "-public-http-port")
	edges := make([]*rollingEdge, 3)
	for i := range edges {
		e := &rollingEdge{name: fmt.Sprint("e", i+1), agents: freePort(t), http: freePort(t), relay: freePort(t), admin: freePort(t)}
		certPEM, keyPEM := testpki.PEMFiles(t, ca.IssueEdge(t, []string{e.relay}, "127.0.0.1"))
		writeFiles(t, dir, map[string][]byte{"relay-" + e.name + ".pem": certPEM, "relay-" + e.name + "-key.pem": keyPEM})
		e.args = []string{"-domain", "example.test", "-agents", e.agents, "-http", e.http, "-access-log=false",
			"-ticket-key", filepath.Join(dir, "ticket.key"), "-etcd", "http://" + etcdClient, "-etcd-ttl", "3s",
			"-relay", e.relay, "-relay-cert", filepath.Join(dir, "relay-"+e.name+".pem"), "-relay-key", filepath.Join(dir, "relay-"+e.name+"-key.pem"), "-relay-ca", filepath.Join(dir, "ca.pem")}
		if advertises {
			e.args = append(e.args, "-public-http-port", frontPort)
		}
		if drains {
			e.args = append(e.args, "-admin", e.admin, "-admin-token-file", filepath.Join(dir, "admin-token"), "-drain-timeout", "30s", "-drain-notice", "1s")
		}
		e.start(t, bin)
		edges[i] = e
	}

	// HAProxy in front of them, with its stats as CSV.
	cfg := haproxyConfig(front, stats, edges, drains)
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	haproxy := startProc(t, "haproxy", "-f", cfgPath, "-db")
	waitListening(t, front)
	waitUp := func(e *rollingEdge) {
		t.Helper()
		testwait.Until(t, 30*time.Second, "HAProxy has "+e.name+" up", func() error {
			st := haproxyStatus(stats)[e.name]
			if !strings.HasPrefix(st, "UP") {
				return fmt.Errorf("%s is %q", e.name, st)
			}
			return nil
		})
	}
	for _, e := range edges {
		waitUp(e)
	}

	// The app, and its agent, which knows the three edges.
	var served atomic.Int64
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		io.WriteString(w, "app")
	})}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })
	agentList := strings.Join([]string{edges[0].agents, edges[1].agents, edges[2].agents}, ",")
	ag := startProc(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agentList, "-url", "http://app.example.test", "-to", appLn.Addr().String())
	testwait.Until(t, 30*time.Second, "the app answers through HAProxy", func() error {
		if code, body := getThrough(front); code != 200 || body != "app" {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	if url := "http://app.example.test:" + frontPort; advertises && !strings.Contains(ag.output(), url+"\n") {
		t.Errorf("the agent did not print %s, HAProxy's port (-public-http-port):\n%s", url, ag.output())
	}

	// The load: 8 clients, each with its keep-alive connections.
	const clients = 8
	var (
		ok      atomic.Int64
		failMu  sync.Mutex
		fails   = map[string]int{}
		stop    = make(chan struct{})
		loading sync.WaitGroup
	)
	started := time.Now()
	for range clients {
		loading.Go(func() {
			client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("GET", "http://"+front+"/", nil)
				req.Host = "app.example.test"
				resp, err := client.Do(req)
				why := ""
				if err != nil {
					why = "error: " + err.Error()
				} else {
					body, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case rerr != nil:
						why = "body: " + rerr.Error()
					case resp.StatusCode != 200 || string(body) != "app":
						why = fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Tunnelkit-Error"))
					}
				}
				if why == "" {
					ok.Add(1)
					continue
				}
				failMu.Lock()
				fails[why]++
				failMu.Unlock()
			}
		})
	}

	// Restart each edge in turn, for 40 s at least and each once at least.
	for i := 0; i < len(edges) || time.Since(started) < 40*time.Second; i++ {
		e := edges[i%len(edges)]
		before := ok.Load()
		testwait.Within(t, 30*time.Second, "requests pass before "+e.name+" restarts", func() bool { return ok.Load() > before+200 })
		stopAt := time.Now()
		e.p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.p.exited:
		case <-time.After(45 * time.Second):
			t.Fatalf("%s did not exit within 45 s of SIGTERM", e.name)
		}
		if e.p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", e.name, e.p.err)
		}
		t.Logf("%s stopped %v after SIGTERM", e.name, time.Since(stopAt).Round(time.Millisecond))
		e.start(t, bin)
		waitUp(e)
		e.restarts++
	}
	close(stop)
	loading.Wait()
	took := time.Since(started)

	failMu.Lock()
	failed := 0
	var kinds []string
	for why, n := range fails {
		failed += n
		kinds = append(kinds, fmt.Sprintf("%d x %s", n, why))
	}
	failMu.Unlock()
	sort.Strings(kinds)
	total := ok.Load() + int64(failed)
	t.Logf("%d clients for %v, %d restarts (%s), the agent moved %d times: %d requests, %d failed; the app served %d",
		clients, took.Round(time.Second), restarts(edges), restartList(edges), ag.count("moved to another edge"), total, failed, served.Load())
	if failed > 0 {
		t.Errorf("%d of %d requests failed: %s", failed, total, strings.Join(kinds, "; "))
	}
	if n := ag.count("endpoint lost"); n > 0 || !running(ag) {
		t.Errorf("the agent lost its endpoint (%d times) or exited", n)
	}
	if !running(haproxy) {
		t.Errorf("haproxy exited")
	}
}

// start starts the edge's process, and waits until it serves: its agent
// port listens (its admin port too, when it has one).
func (e *rollingEdge) start(t *testing.T, bin string) {
	t.Helper()
	e.p = startProc(t, filepath.Join(bin, "tunnelkit"), append([]string{"edge"}, e.args...)...)
	waitListening(t, e.agents)
	waitListening(t, e.http)
}

func restarts(edges []*rollingEdge) int {
	n := 0
	for _, e := range edges {
		n += e.restarts
	}
	return n
}

func restartList(edges []*rollingEdge) string {
	var s []string
	for _, e := range edges {
		s = append(s, fmt.Sprintf("%s %d", e.name, e.restarts))
	}
	return strings.Join(s, ", ")
}

// running reports whether p has not exited.
func running(p *proc) bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// getThrough sends one request for app.example.test to addr.
func getThrough(addr string) (int, string) {
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	req.Host = "app.example.test"
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// haproxyConfig is docs/cluster.md's HAProxy configuration ("Draining
// and rolling restarts") for edges, fronted on front, with its stats on stats; the
// edges are checked over TCP when they have no /healthz.
func haproxyConfig(front, stats string, edges []*rollingEdge, healthz bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  log stdout format raw local0 warning
defaults
  mode http
  log global
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  retries 3
  option redispatch
  retry-on conn-failure empty-response response-timeout
frontend pub
  bind %s
  default_backend edges
backend edges
  balance roundrobin
`, front)
	if healthz {
		b.WriteString("  option httpchk GET /healthz\n")
	}
	b.WriteString("  default-server inter 200ms fall 1 rise 2\n")
	for _, e := range edges {
		port := e.http
		if healthz {
			port = e.admin
		}
		_, p, _ := net.SplitHostPort(port)
		fmt.Fprintf(&b, "  server %s %s check port %s\n", e.name, e.http, p)
	}
	fmt.Fprintf(&b, "listen stats\n  bind %s\n  stats enable\n  stats uri /stats\n", stats)
	return b.String()
}

// haproxyStatus returns the status of each server of the backend edges,
// from HAProxy's stats in CSV: "UP", "DOWN", "UP 1/2"...
func haproxyStatus(stats string) map[string]string {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + stats + "/stats;csv")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := csv.NewReader(strings.NewReader(strings.TrimPrefix(string(b), "# ")))
	r.FieldsPerRecord = -1
	rows, err := r.ReadAll()
	if err != nil || len(rows) == 0 {
		return nil
	}
	pxname, svname, status := slices.Index(rows[0], "pxname"), slices.Index(rows[0], "svname"), slices.Index(rows[0], "status")
	out := map[string]string{}
	for _, row := range rows[1:] {
		if len(row) > status && row[pxname] == "edges" {
			out[row[svname]] = row[status]
		}
	}
	return out
}
