//go:build unix

package main

// The cluster's processes: etcd and the edges, each the real binary.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// proc is a server process of the run: etcd or an edge.
type proc struct {
	name    string
	path    string
	args    []string
	env     []string // added to the harness's
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// start runs the process, its stderr and stdout appended to its log.
func (p *proc) start() error {
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	benchproc.KillWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); close(p.exited) }()
	return nil
}

// running tells whether the process was started and has not exited.
func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill ends the process at once (SIGKILL) and waits for it.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// terminate sends SIGTERM and waits up to grace for the process to exit,
// then kills it; it reports how long the exit took.
func (p *proc) terminate(grace time.Duration) (time.Duration, error) {
	if !p.running() {
		return 0, fmt.Errorf("%s is not running", p.name)
	}
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return time.Since(start), nil
	case <-time.After(grace):
		p.kill()
		return time.Since(start), fmt.Errorf("%s did not exit within %v of SIGTERM: killed", p.name, grace)
	}
}

// cpu is the process's CPU time so far.
func (p *proc) cpu() time.Duration {
	if !p.running() {
		return 0
	}
	return benchproc.CPUTime(p.cmd.Process.Pid)
}

// tail returns the last lines of the process's log, for errors.
func (p *proc) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// startEtcd runs etcd with its data in dir, on loopback ports of its own,
// and waits until it answers.
func startEtcd(ctx context.Context, path, dir string) (*proc, string, error) {
	ports, err := benchproc.FreePorts(2)
	if err != nil {
		return nil, "", err
	}
	client, peer := benchproc.Loopback(ports[0]), benchproc.Loopback(ports[1])
	p := &proc{name: "etcd", path: path, logPath: filepath.Join(dir, "etcd.log"), args: []string{
		"--data-dir", filepath.Join(dir, "etcd"), "--name", "e",
		"--listen-client-urls", "http://" + client, "--advertise-client-urls", "http://" + client,
		"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "e=http://" + peer, "--log-level", "warn",
	}}
	if err := p.start(); err != nil {
		return nil, "", err
	}
	if err := waitFor(ctx, 30*time.Second, func() error {
		if !p.running() {
			return errExited
		}
		_, err := etcdMetrics(ctx, client)
		return err
	}); err != nil {
		p.kill()
		return nil, "", fmt.Errorf("etcd: %w\n%s", err, p.tail())
	}
	return p, client, nil
}

var errExited = errors.New("exited")

// etcdMetrics returns the values of etcd's Prometheus metrics at addr
// that have no labels.
func etcdMetrics(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("etcd /metrics: %s", resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.Contains(line, "{") {
			continue
		}
		name, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			m[name] = f
		}
	}
	return m, sc.Err()
}

// edgeProc is one edge of the cluster: `tunnelkit edge` with routes in
// etcd, relays, agent TLS, tickets and an admin port, on ports it keeps
// across restarts.
type edgeProc struct {
	proc
	agents, http, relay, admin, pprof string
}

// mem is what an edge's process holds, after a GC.
type mem struct {
	heap, stack, goroutines int64
}

// readMem asks the edge's -pprof port for its heap after a GC (the heap
// profile's MemStats) and its goroutines.
func (e *edgeProc) readMem(ctx context.Context) (mem, error) {
	var m mem
	body, err := httpGet(ctx, "http://"+e.pprof+"/debug/pprof/heap?gc=1&debug=1")
	if err != nil {
		return m, err
	}
	found := 0
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			m.heap, err = strconv.ParseInt(v, 10, 64)
			found++
		}
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok { // "inuse / sys"
			inuse, _, _ := strings.Cut(v, " ")
			m.stack, err = strconv.ParseInt(inuse, 10, 64)
			found++
		}
		if err != nil {
			return m, err
		}
	}
	if found != 2 {
		return m, fmt.Errorf("%s: no HeapAlloc and Stack in the heap profile", e.name)
	}
	body, err = httpGet(ctx, "http://"+e.pprof+"/debug/pprof/goroutine?debug=1")
	if err != nil {
		return m, err
	}
	first, _, _ := strings.Cut(body, "\n")
	v, ok := strings.CutPrefix(first, "goroutine profile: total ")
	if !ok {
		return m, fmt.Errorf("%s: goroutine profile starts %q", e.name, first)
	}
	m.goroutines, err = strconv.ParseInt(v, 10, 64)
	return m, err
}

// healthy tells whether the edge answers its /healthz with 200: it
// serves, and does not drain.
func (e *edgeProc) healthy(ctx context.Context, client *http.Client) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.admin+"/healthz", nil)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startAttempts is how many times startAndWait starts an edge that exits
// before it is healthy, as a supervisor (systemd's Restart=on-failure)
// starts it again: an edge whose setup finds etcd too busy for its 30 s
// exits.
const startAttempts = 3

// startAndWait starts the edge and waits until it is healthy; logf, if
// not nil, tells of an edge that exited while starting and was started
// again.
func (e *edgeProc) startAndWait(ctx context.Context, logf func(string, ...any)) error {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for attempt := 1; ; attempt++ {
		if err := e.start(); err != nil {
			return err
		}
		err := waitFor(ctx, time.Minute, func() error {
			if !e.running() {
				return errExited
			}
			if !e.healthy(ctx, client) {
				return errors.New("not healthy yet")
			}
			return nil
		})
		if err == nil {
			return nil
		}
		if errors.Is(err, errExited) && attempt < startAttempts && ctx.Err() == nil {
			if logf != nil {
				logf("%s exited as it started; starting it again, as a supervisor would: %s", e.name, lastLine(e.tail()))
			}
			time.Sleep(time.Second)
			continue
		}
		e.kill()
		return fmt.Errorf("%s: %w\n%s", e.name, err, e.tail())
	}
}

// lastLine returns the last line of s.
func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}

// httpGet returns the body of a GET of url.
func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// waitFor calls f every 100 ms until it returns nil, ctx ends or d passes,
// and returns its last error then.
func waitFor(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || errors.Is(err, errExited) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
