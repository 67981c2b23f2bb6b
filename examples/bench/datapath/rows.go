//go:build unix

package main

// The rows of the table: what each one starts, measures and reports.

import (
	"context"
	"fmt"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// row is a part of the table, selected with -rows.
type row struct {
	name string
	run  func(ctx context.Context, e *env) ([]result, error)
}

var rowTable = []row{
	{"http", rowHTTP},
	{"https", rowHTTPS},
	{"download", rowDownload},
	{"grpc", rowGRPC},
	{"bulk", rowBulk},
	{"rtt", rowRTT},
	{"conns", rowConns},
	{"interactive", rowInteractive},
	{"idle", rowIdle},
}

func rowNames() []string {
	names := make([]string, len(rowTable))
	for i, r := range rowTable {
		names[i] = r.name
	}
	return names
}

func rowByName(name string) row {
	for _, r := range rowTable {
		if r.name == name {
			return r
		}
	}
	panic("no row " + name)
}

// result is a line of the table: a tunnel figure and the baseline it is
// compared with.
type result struct {
	Row   string
	What  string  // the line's label, the same in every run
	Unit  string  // of Base and Tun: req/s, MB/s, conns/s, µs, KiB
	Lower bool    // lower is better (latency, memory)
	Base  float64 // NaN: no baseline
	Tun   float64
	Note  string // after the tunnel's figure
}

// The agent's two forwarding modes.
var modes = []struct {
	name, label string
	bytes       bool
}{
	{"req", "agent forwards requests", false},
	{"bytes", "agent copies bytes", true},
}

// The agent's links to the edge.
var links = []struct{ name, label string }{
	{plainLink, "plaintext link"},
	{tlsLink, "TLS link"},
}

func rate(what, unit string, base, tun loadResult) result {
	return result{What: what, Unit: unit, Base: base.rate(), Tun: tun.rate()}
}

func throughput(what string, base, tun loadResult) result {
	return result{What: what, Unit: "MB/s", Base: base.mbps(), Tun: tun.mbps()}
}

func latency(what string, base, tun time.Duration) result {
	return result{What: what, Unit: "µs", Lower: true, Base: micros(base), Tun: micros(tun)}
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rowHTTP: small HTTP/1.1 responses (wrk), one ReverseProxy hop against
// the tunnel in both agent modes over both links.
func rowHTTP(ctx context.Context, e *env) ([]result, error) {
	var base loadResult
	tun := map[string]loadResult{}
	steps := []func() error{func() error {
		return e.withProxy(ctx, "http-base", []string{"-to", "http://" + e.appHTTP}, func(rp *benchproc.Proc) (err error) {
			t := target{url: "http://bench." + domain + "/", connect: rp.Fields["addr"]}
			base, err = e.timedHTTP(ctx, "http-base", []*benchproc.Proc{rp, e.app}, t, false)
			return err
		})
	}}
	for _, l := range links {
		for _, m := range modes {
			name := "http-" + m.name + "-" + l.name
			steps = append(steps, func() error {
				return e.withTunnel(ctx, name, l.name, endpoint{url: "http://bench", to: e.appHTTP, bytes: m.bytes}, func(t *tunnel) error {
					res, err := e.timedHTTP(ctx, name, t.procs(e.app), target{url: t.url.String() + "/", connect: t.connect}, false)
					tun[name] = res
					return err
				})
			})
		}
	}
	if err := e.steps(steps...); err != nil {
		return nil, err
	}
	var out []result
	for _, l := range links {
		for _, m := range modes {
			out = append(out, rate("HTTP/1.1 small responses, req/s: "+m.label+", "+l.label, "req/s", base, tun["http-"+m.name+"-"+l.name]))
		}
	}
	return out, nil
}

// rowHTTPS: small responses over TLS, HTTP/1.1 (wrk) and HTTP/2
// (h2load), one TLS ReverseProxy hop against an https endpoint in both
// agent modes.
func rowHTTPS(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	both := func(variant string, procs []*benchproc.Proc, t target) error {
		for _, v := range []struct {
			name string
			h2   bool
		}{{"h1", false}, {"h2", true}} {
			name := "https-" + v.name + "-" + variant
			res, err := e.timedHTTP(ctx, name, procs, t, v.h2)
			if err != nil {
				return err
			}
			got[name] = res
		}
		return nil
	}
	steps := []func() error{func() error {
		return e.withProxy(ctx, "https-base", []string{"-to", "http://" + e.appHTTP, "-tls", e.dir}, func(rp *benchproc.Proc) error {
			return both("base", []*benchproc.Proc{rp, e.app}, target{url: "https://bench." + domain + ":" + port(rp.Fields["addr"]) + "/", connect: rp.Fields["addr"]})
		})
	}}
	for _, m := range modes {
		steps = append(steps, func() error {
			return e.withTunnel(ctx, "https-"+m.name, plainLink, endpoint{url: "https://bench", to: e.appHTTP, bytes: m.bytes}, func(t *tunnel) error {
				return both(m.name, t.procs(e.app), target{url: t.url.String() + "/", connect: t.connect})
			})
		})
	}
	if err := e.steps(steps...); err != nil {
		return nil, err
	}
	var out []result
	for _, v := range []struct{ name, label string }{{"h1", "HTTPS HTTP/1.1 small responses (wrk), req/s: "}, {"h2", "HTTPS HTTP/2 small responses (h2load), req/s: "}} {
		for _, m := range modes {
			out = append(out, rate(v.label+m.label, "req/s", got["https-"+v.name+"-base"], got["https-"+v.name+"-"+m.name]))
		}
	}
	return out, nil
}

// rowDownload: one large HTTPS HTTP/1.1 download, TLS ReverseProxy hop
// against an https endpoint in both agent modes.
func rowDownload(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	download := func(name string, procs []*benchproc.Proc, t target) error {
		args := []string{"-kind", "download", "-url", t.url, "-connect", t.connect, "-ca", e.caFile}
		res, err := e.goLoad(ctx, name, procs, "GB", args, "-size", e.cfg.Download)
		got[name] = res
		return err
	}
	steps := []func() error{func() error {
		return e.withProxy(ctx, "download-base", []string{"-to", "http://" + e.appHTTP, "-tls", e.dir}, func(rp *benchproc.Proc) error {
			return download("download-base", []*benchproc.Proc{rp, e.app}, target{url: "https://bench." + domain + ":" + port(rp.Fields["addr"]) + "/bytes", connect: rp.Fields["addr"]})
		})
	}}
	for _, m := range modes {
		name := "download-" + m.name
		steps = append(steps, func() error {
			return e.withTunnel(ctx, name, plainLink, endpoint{url: "https://bench", to: e.appHTTP, bytes: m.bytes}, func(t *tunnel) error {
				return download(name, t.procs(e.app), target{url: t.url.String() + "/bytes", connect: t.connect})
			})
		})
	}
	if err := e.steps(steps...); err != nil {
		return nil, err
	}
	var out []result
	for _, m := range modes {
		out = append(out, throughput(fmt.Sprintf("HTTPS HTTP/1.1 download of %s, MB/s: %s", formatBytes(e.cfg.Download), m.label), got["download-base"], got["download-"+m.name]))
	}
	return out, nil
}

// rowGRPC: gRPC unary latency over TLS, a TLS ReverseProxy hop speaking
// h2c to the app against an https endpoint with app protocol h2c; and
// ping-pongs on one bidi stream, direct (h2c, no hop) against the same
// endpoint.
func rowGRPC(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	grpcLoad := func(name, kind string, procs []*benchproc.Proc, authority, connect string, tls bool) error {
		args := []string{"-kind", kind, "-url", authority, "-connect", connect}
		if tls {
			args = append(args, "-ca", e.caFile)
		}
		n := e.cfg.GRPCCalls
		if kind == "grpc-bidi" {
			n = e.cfg.PingPongs
		}
		res, err := e.goLoad(ctx, name, procs, "call", args, "-n", int64(n))
		got[name] = res
		return err
	}
	steps := []func() error{
		func() error {
			e.caseName = "grpc-bidi-direct"
			return grpcLoad("grpc-bidi-direct", "grpc-bidi", []*benchproc.Proc{e.app}, e.appGRPC, e.appGRPC, false)
		},
		func() error {
			return e.withProxy(ctx, "grpc-unary-base", []string{"-to", "http://" + e.appGRPC, "-tls", e.dir, "-h2c"}, func(rp *benchproc.Proc) error {
				return grpcLoad("grpc-unary-base", "grpc-unary", []*benchproc.Proc{rp, e.app}, "grpc."+domain+":"+port(rp.Fields["addr"]), rp.Fields["addr"], true)
			})
		},
	}
	for _, m := range modes {
		steps = append(steps, func() error {
			return e.withTunnel(ctx, "grpc-"+m.name, plainLink, endpoint{url: "https://grpc", appProto: "h2c", to: e.appGRPC, bytes: m.bytes}, func(t *tunnel) error {
				for _, kind := range []string{"grpc-unary", "grpc-bidi"} {
					name := kind + "-" + m.name
					if err := grpcLoad(name, kind, t.procs(e.app), t.url.Host, t.connect, true); err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
	if err := e.steps(steps...); err != nil {
		return nil, err
	}
	var out []result
	for _, m := range modes {
		base, tun := got["grpc-unary-base"], got["grpc-unary-"+m.name]
		what := fmt.Sprintf("gRPC unary over TLS (%d calls), %%s µs: %s", e.cfg.GRPCCalls, m.label)
		out = append(out, latency(fmt.Sprintf(what, "p50"), base.P50, tun.P50), latency(fmt.Sprintf(what, "p99"), base.P99, tun.P99))
	}
	for _, m := range modes {
		base, tun := got["grpc-bidi-direct"], got["grpc-bidi-"+m.name]
		what := fmt.Sprintf("gRPC bidi ping-pong (%d on one stream), %%s µs, vs direct h2c: %s", e.cfg.PingPongs, m.label)
		out = append(out, latency(fmt.Sprintf(what, "p50"), base.P50, tun.P50), latency(fmt.Sprintf(what, "p99"), base.P99, tun.P99))
	}
	return out, nil
}

// tcpCases runs the TCP baseline (two relays) and the tunnel's tcp://
// endpoint over each of links, measuring each with measure, in the order
// of the run.
func (e *env) tcpCases(ctx context.Context, row string, links []string, measure func(name string, procs []*benchproc.Proc, connect string) error) error {
	steps := []func() error{func() error {
		return e.withRelays(ctx, row+"-base", func(procs []*benchproc.Proc, connect string) error {
			return measure(row+"-base", procs, connect)
		})
	}}
	for _, l := range links {
		name := row + "-" + l
		steps = append(steps, func() error {
			return e.withTunnel(ctx, name, l, endpoint{url: "tcp://", to: e.appEcho, bytes: true}, func(t *tunnel) error {
				return measure(name, t.procs(e.app), t.connect)
			})
		})
	}
	return e.steps(steps...)
}

// rowBulk: the half-closed echo of -bulk bytes through two plain relays
// against a tcp:// endpoint over both links.
func rowBulk(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	err := e.tcpCases(ctx, "bulk", []string{plainLink, tlsLink}, func(name string, procs []*benchproc.Proc, connect string) error {
		res, err := e.goLoad(ctx, name, procs, "GB", []string{"-kind", "bulk", "-connect", connect}, "-size", e.cfg.Bulk)
		got[name] = res
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []result
	for _, l := range links {
		out = append(out, throughput(fmt.Sprintf("TCP bulk, half-closed echo of %s, MB/s: %s", formatBytes(e.cfg.Bulk), l.label), got["bulk-base"], got["bulk-"+l.name]))
	}
	return out, nil
}

// rowRTT: 64-byte round trips on an open connection.
func rowRTT(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	err := e.tcpCases(ctx, "rtt", []string{plainLink}, func(name string, procs []*benchproc.Proc, connect string) error {
		res, err := e.goLoad(ctx, name, procs, "RTT", []string{"-kind", "rtt", "-connect", connect}, "-n", int64(e.cfg.RTTs))
		got[name] = res
		return err
	})
	if err != nil {
		return nil, err
	}
	base, tun := got["rtt-base"], got["rtt-"+plainLink]
	what := "TCP 64 B round trip on an open connection, %s µs: plaintext link"
	return []result{latency(fmt.Sprintf(what, "p50"), base.P50, tun.P50), latency(fmt.Sprintf(what, "p99"), base.P99, tun.P99)}, nil
}

// rowConns: new connections per second, each with one 64-byte round trip.
func rowConns(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	err := e.tcpCases(ctx, "conns", []string{plainLink}, func(name string, procs []*benchproc.Proc, connect string) error {
		args := []string{"-kind", "conns", "-connect", connect, "-c", strconv.Itoa(e.cfg.ConnWorkers)}
		res, err := e.goLoad(ctx, name, procs, "conn", args, "-d", int64(e.cfg.Duration))
		got[name] = res
		return err
	})
	if err != nil {
		return nil, err
	}
	base, tun := got["conns-base"], got["conns-"+plainLink]
	return []result{
		rate(fmt.Sprintf("TCP new connections/s (dial, 64 B round trip, close; %d clients): plaintext link", e.cfg.ConnWorkers), "conns/s", base, tun),
		latency("TCP new connection's whole life, p50 µs: plaintext link", base.P50, tun.P50),
	}, nil
}

// rowInteractive: 64-byte round trips on one connection while another one
// to the same place moves bulk data both ways; through the tunnel both are
// streams of one agent session.
func rowInteractive(ctx context.Context, e *env) ([]result, error) {
	got := map[string]loadResult{}
	err := e.tcpCases(ctx, "interactive", []string{plainLink, tlsLink}, func(name string, procs []*benchproc.Proc, connect string) error {
		// No unit: the CPU time is the bulk stream's, not the round trips'.
		res, err := e.goLoad(ctx, name, procs, "", []string{"-kind", "interactive", "-connect", connect}, "-n", int64(e.cfg.RTTs))
		got[name] = res
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []result
	paths := []struct{ name, label string }{{"base", "two relays (a TCP connection each)"}}
	for _, l := range links {
		paths = append(paths, struct{ name, label string }{l.name, "tunnel, one agent session, " + l.label})
	}
	for _, p := range paths {
		r := got["interactive-"+p.name]
		note := fmt.Sprintf("(bulk %.0f MB/s meanwhile)", r.mbps())
		for _, q := range []struct {
			label string
			d     time.Duration
		}{{"p50", r.P50}, {"p99", r.P99}} {
			l := latency(fmt.Sprintf("64 B round trip beside a bulk stream, %s µs vs idle p50 (baseline column): %s", q.label, p.label), r.IdleP50, q.d)
			l.Note = note
			out = append(out, l)
		}
	}
	return out, nil
}

// rowIdle: the memory of idle agent sessions, at the edge (per session,
// over -sessions of them) and in an agent's process (its one session).
func rowIdle(ctx context.Context, e *env) ([]result, error) {
	var out []result
	for _, l := range links {
		edgeCost, agentOne, agentEach, err := e.idleSessions(ctx, l.name)
		if err != nil {
			return nil, err
		}
		n := e.cfg.Sessions
		out = append(out,
			memResult(fmt.Sprintf("edge: memory per idle agent session (%d sessions), KiB: %s", n, l.label), edgeCost, ""),
			memResult("agent: memory of its one session, KiB: "+l.label, agentOne,
				fmt.Sprintf("; each further session in one process: %.1f KiB, %.1f goroutines", kib(agentEach.heap+agentEach.stack), agentEach.goroutines)))
	}
	return out, nil
}

// perSession is a memory cost per session.
type perSession struct {
	heap, stack float64 // bytes
	goroutines  float64
}

func kib(b float64) float64 { return b / 1024 }

func memResult(what string, m perSession, more string) result {
	return result{
		What: what, Unit: "KiB", Lower: true, Base: math.NaN(), Tun: kib(m.heap + m.stack),
		Note: fmt.Sprintf("(heap %.1f + stacks %.1f KiB, %.1f goroutines%s)", kib(m.heap), kib(m.stack), m.goroutines, more),
	}
}

// idleSessions opens -sessions idle agent sessions (in one process) to a
// fresh edge whose agent port speaks link, and returns what each costs
// the edge, and what the first and each further one cost the agents'
// process.
func (e *env) idleSessions(ctx context.Context, link string) (edgeCost, agentOne, agentEach perSession, err error) {
	e.caseName = "idle-" + link
	edgeArgs := []string{"-dir", e.dir, "-link", link}
	if !e.cfg.Logs {
		edgeArgs = append(edgeArgs, "-access-log=false")
	}
	edge, err := e.spawn(ctx, "edge", "edge", readyTimeout, edgeArgs...)
	if err != nil {
		return
	}
	defer closeInto(&err, edge)
	m0, err := edge.Mem(ctx)
	if err != nil {
		return
	}
	args := []string{"-edge", edge.Fields["agents"], "-n", strconv.Itoa(e.cfg.Sessions)}
	if link == tlsLink {
		args = append(args, "-edge-ca", e.caFile)
	}
	agents, err := e.spawn(ctx, "agents", "agents", readyTimeout+time.Duration(e.cfg.Sessions)*20*time.Millisecond, args...)
	if err != nil {
		return
	}
	defer closeInto(&err, agents)
	m1, err := edge.Mem(ctx)
	if err != nil {
		return
	}
	n := float64(e.cfg.Sessions)
	d := m1.Sub(m0)
	edgeCost = perSession{float64(d.Heap) / n, float64(d.Stack) / n, float64(d.Goroutines) / n}
	one, err := benchproc.ParseMem(agents.Fields, "one_")
	if err != nil {
		return
	}
	agentOne = perSession{float64(one.Heap), float64(one.Stack), float64(one.Goroutines)}
	each, err := benchproc.ParseMem(map[string]string{
		"heap": agents.Fields["per_heap"], "stack": agents.Fields["per_stack"], "goroutines": agents.Fields["per_milligoroutines"],
	}, "")
	if err != nil {
		return
	}
	agentEach = perSession{float64(each.Heap), float64(each.Stack), float64(each.Goroutines) / 1000}
	return
}

// port returns the port of host:port.
func port(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}
