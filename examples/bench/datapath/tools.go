//go:build unix

package main

// wrk (HTTP/1.1) and h2load (HTTP/2) as load generators, and the Go
// generator where they are missing.

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// target is a URL to load and the loopback address that serves it: the
// URL's host stays the Host header and the TLS server name.
type target struct {
	url     string // with its path
	connect string // host:port
}

// httpLoad loads t for d with small GET requests, over HTTP/2 when h2
// (TLS only) else HTTP/1.1: wrk or h2load when installed (and not
// -go-load), else the Go generator.
func (e *env) httpLoad(ctx context.Context, t target, d time.Duration, h2 bool) (loadResult, error) {
	switch {
	case h2 && e.h2load != "":
		return e.runH2load(ctx, t, d)
	case !h2 && e.wrk != "":
		return e.runWrk(ctx, t, d)
	}
	conns := e.cfg.Conns
	if h2 {
		conns = e.cfg.H2Conns * e.cfg.H2Streams // requests in flight, as h2load's -c times -m
	}
	args := []string{"-kind", "http", "-url", t.url, "-connect", t.connect, "-c", strconv.Itoa(conns), "-d", d.String()}
	if h2 {
		args = append(args, "-h2")
	}
	if u, err := url.Parse(t.url); err == nil && u.Scheme == "https" {
		args = append(args, "-ca", e.caFile)
	}
	return e.runLoad(ctx, "load", args...)
}

// wrkSeconds returns d in whole seconds, at least 1: wrk takes no less.
func wrkSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// runWrk runs wrk against t for d (in whole seconds, at least one), with
// -t Threads and -c Conns, and a script that makes it connect to
// t.connect whatever the URL's host: wrk has no --connect-to, and the
// URL's host is the edge's routing key (Host header, TLS server name).
func (e *env) runWrk(ctx context.Context, t target, d time.Duration) (loadResult, error) {
	host, port, err := net.SplitHostPort(t.connect)
	if err != nil {
		return loadResult{}, err
	}
	script := filepath.Join(e.dir, "connect-"+port+".lua")
	// wrk calls wrk.resolve(host, service) on the URL's host before it
	// starts, and connects every thread to wrk.addrs[1].
	lua := fmt.Sprintf("wrk.resolve = function(host, service)\n  wrk.addrs = wrk.lookup(%q, %q)\nend\n", host, port)
	if err := os.WriteFile(script, []byte(lua), 0o644); err != nil {
		return loadResult{}, err
	}
	threads := min(e.cfg.Threads, e.cfg.Conns)
	out, cpu, err := e.runTool(ctx, e.wrk, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(e.cfg.Conns),
		"-d", strconv.Itoa(wrkSeconds(d))+"s", "-s", script, t.url)
	if err != nil {
		return loadResult{}, err
	}
	res, err := parseWrk(out)
	if err != nil {
		return res, fmt.Errorf("wrk %s: %w\n%s", t.url, err, out)
	}
	res.Tool, res.CPU = "wrk", cpu
	return res, nil
}

// runH2load runs h2load against t for d with -c H2Conns and -m H2Streams.
func (e *env) runH2load(ctx context.Context, t target, d time.Duration) (loadResult, error) {
	ms := max(d.Milliseconds(), 100)
	out, cpu, err := e.runTool(ctx, e.h2load, "-D", strconv.FormatInt(ms, 10)+"ms",
		"-c", strconv.Itoa(e.cfg.H2Conns), "-m", strconv.Itoa(e.cfg.H2Streams),
		"--connect-to="+t.connect, t.url)
	if err != nil {
		return loadResult{}, err
	}
	res, err := parseH2load(out)
	if err != nil {
		return res, fmt.Errorf("h2load %s: %w\n%s", t.url, err, out)
	}
	res.Tool, res.CPU = "h2load", cpu
	return res, nil
}

// runTool runs an outside load generator and returns its output and CPU
// time. It stays in the parent's process group, so that a Ctrl-C stops
// it too; ctx kills it, and so does the parent's death.
func (e *env) runTool(ctx context.Context, path string, args ...string) ([]byte, time.Duration, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.WaitDelay = 5 * time.Second
	benchproc.KillWithParent(cmd)
	e.logf("running %s %v", filepath.Base(path), args)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, 0, fmt.Errorf("%s: %v\n%s", filepath.Base(path), err, out)
	}
	return out, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

var (
	wrkRequests = regexp.MustCompile(`(\d+) requests in ([0-9.]+)(us|ms|s|m|h),`)
	wrkSocket   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// parseWrk reads wrk's report: "N requests in 3.00s, ..." for the count
// and time (wrk's Requests/sec line is the same quotient). A non-2xx
// response, a connect error or a timeout fails the run; read and write
// errors (a peer that closed a keep-alive connection) are tolerated when
// rare.
func parseWrk(out []byte) (loadResult, error) {
	m := wrkRequests.FindSubmatch(out)
	if m == nil {
		return loadResult{}, fmt.Errorf("no request count in wrk's report")
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	v, _ := strconv.ParseFloat(string(m[2]), 64)
	unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour}[string(m[3])]
	res := loadResult{Ops: n, Elapsed: time.Duration(v * float64(unit))}
	if n == 0 || res.Elapsed <= 0 {
		return res, fmt.Errorf("no request completed")
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		return res, fmt.Errorf("%s responses were not 2xx or 3xx", m[1])
	}
	if m := wrkSocket.FindSubmatch(out); m != nil {
		connect, _ := strconv.ParseInt(string(m[1]), 10, 64)
		read, _ := strconv.ParseInt(string(m[2]), 10, 64)
		write, _ := strconv.ParseInt(string(m[3]), 10, 64)
		timeout, _ := strconv.ParseInt(string(m[4]), 10, 64)
		if connect > 0 || timeout > 0 || (read+write)*1000 > n {
			return res, fmt.Errorf("socket errors: connect %d, read %d, write %d, timeout %d", connect, read, write, timeout)
		}
	}
	return res, nil
}

var (
	h2loadFinished = regexp.MustCompile(`finished in ([0-9.]+)(us|ms|s|m|h), ([0-9.]+) req/s`)
	h2loadRequests = regexp.MustCompile(`requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatus   = regexp.MustCompile(`status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`)
)

// parseH2load reads h2load's report: "finished in 3.00s, 41000.00 req/s"
// for the time and the rate, "requests: ... N succeeded, 0 failed, 0
// errored, 0 timeout" and the status codes, every one 2xx.
func parseH2load(out []byte) (loadResult, error) {
	f := h2loadFinished.FindSubmatch(out)
	r := h2loadRequests.FindSubmatch(out)
	s := h2loadStatus.FindSubmatch(out)
	if f == nil || r == nil || s == nil {
		return loadResult{}, fmt.Errorf("no summary in h2load's report")
	}
	num := func(b []byte) int64 { n, _ := strconv.ParseInt(string(b), 10, 64); return n }
	v, _ := strconv.ParseFloat(string(f[1]), 64)
	unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour}[string(f[2])]
	res := loadResult{Ops: num(r[4]), Elapsed: time.Duration(v * float64(unit))}
	if res.Ops == 0 || res.Elapsed <= 0 {
		return res, fmt.Errorf("no request succeeded")
	}
	if failed, errored, timeout := num(r[5]), num(r[6]), num(r[7]); failed+errored+timeout > 0 {
		return res, fmt.Errorf("%d requests failed, %d errored, %d timed out", failed, errored, timeout)
	}
	if other := num(s[2]) + num(s[3]) + num(s[4]); other > 0 {
		return res, fmt.Errorf("%d responses were not 2xx", other)
	}
	return res, nil
}
