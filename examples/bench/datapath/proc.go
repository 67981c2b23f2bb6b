//go:build unix

package main

// The run's processes: this binary again in each role (benchproc), the
// parent's side here.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// roles are the process roles, by name: each process of the run is this
// binary started again in one (see README.md).
var roles = map[string]benchproc.Role{
	"edge":   runEdge,
	"agent":  runAgent,
	"agents": runAgents,
	"app":    runApp,
	"rproxy": runReverseProxy,
	"relay":  runRelay,
	"load":   runLoad,
}

// readyTimeout bounds a server role's setup: processes starting, an agent
// connecting and binding, sessions opening.
const readyTimeout = 60 * time.Second

// logHead is how much of the start of a child's log is kept; of the rest,
// its last 64 KiB (an access line per request adds up to hundreds of
// megabytes in a long run).
const logHead = 1 << 20

// spawn starts this binary as role, named name, with args; a server role
// (timeout > 0) is returned once it printed its ready line, within
// timeout. Its stderr goes to a log file of the run; server roles profile
// when asked, and take -gomaxprocs. It is closed at the end of the run
// whatever happens (closeAll).
func (e *env) spawn(ctx context.Context, name, role string, timeout time.Duration, args ...string) (*benchproc.Proc, error) {
	e.mu.Lock()
	e.seq++
	seq := e.seq
	e.mu.Unlock()
	o := benchproc.Options{
		Name: name, Exe: e.exe, Role: role, Args: args,
		LogPath:      filepath.Join(e.logDir, fmt.Sprintf("%03d-%s-%s.log", seq, e.caseName, name)),
		LogHead:      logHead,
		ReadyTimeout: timeout,
	}
	if role != "load" {
		o.CPUProfile, o.MemProfile = e.cfg.CPUProfile, e.cfg.MemProfile
		if e.cfg.GOMAXPROCS > 0 {
			o.Env = []string{"GOMAXPROCS=" + strconv.Itoa(e.cfg.GOMAXPROCS)}
		}
	}
	p, err := benchproc.Start(ctx, o)
	if err != nil {
		return nil, err
	}
	e.track(p)
	e.logf("started %s (pid %d): role %s %s", name, p.Pid(), role, strings.Join(args, " "))
	return p, nil
}

// runLoad runs a Go load generator with args, named name in the tables,
// and returns its result with its CPU time.
func (e *env) runLoad(ctx context.Context, name string, args ...string) (loadResult, error) {
	c, err := e.spawn(ctx, name, "load", 0, args...)
	if err != nil {
		return loadResult{}, err
	}
	line, err := c.Next(ctx, 10*time.Minute)
	if cerr := c.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return loadResult{}, c.Failure("load", err)
	}
	var res loadResult
	if !strings.HasPrefix(line, "result ") {
		return res, c.Failure("load", fmt.Errorf("said %q, want a result", line))
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "result ")), &res); err != nil {
		return res, c.Failure("load", err)
	}
	res.Tool, res.CPU = "load", c.CPU()
	return res, nil
}
