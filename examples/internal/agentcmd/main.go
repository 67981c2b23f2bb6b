// Package agentcmd is the tunnelkit command's agent: it exposes local apps
// through a tunnel edge, on one session to the edge, any number of
// endpoints on it. It prints each endpoint's public URL alone on a stdout
// line as the edge grants it, and logs to stderr: for an http or https URL
// a line per request (method, path, status, bytes, duration, client), for
// the others a line per connection.
//
//	tunnelkit http 3000                               # http://localhost:3000 at a new random name
//	tunnelkit agent -edge edge.example.com:443 -url https://app.example.com -to 3000
//	tunnelkit agent -config agent.yml                 # many endpoints, one session
//
// The shorthand "tunnelkit PROTO TO" (http, https, tcp or tls) binds a new
// random name (a free port for tcp), or -url, forwarding to TO. -to takes a port (on
// 127.0.0.1), host:port, http://host:port, https://host:port (an app that
// speaks TLS, whose certificate is checked against the system's roots or
// -to-ca, for -to-server-name when the name differs from the address) or
// unix:/path.
//
// A -config file holds the session's settings and a list of endpoints, in
// YAML, read strictly (an unknown key is an error at its line); ${VAR}
// takes its value from the environment. Flags win over the file. SIGHUP
// reads the file again: endpoints added are bound, endpoints removed
// unbound, endpoints whose url stays changed in place, and the connections
// of the others go on untouched.
//
//	edge: edge.example.com:443
//	token: ${TUNNELKIT_TOKEN}
//	endpoints:
//	  - url: https://app.example.com
//	    to: 3000
//	  - url: https://admin.example.com
//	    to: https://127.0.0.1:8443
//	    to_ca: dev-ca.pem
//	    policy:
//	      basic_auth: ["ann:${ADMIN_PASSWORD}"]
//	  - url: tcp://
//	    to: 127.0.0.1:22
//
// -state FILE keeps the session's and endpoints' tickets, so that an agent
// started again, even after kill -9, gets the same URLs back at once. By
// default it is $XDG_STATE_HOME/tunnelkit/agent-HASH.json
// (~/.local/state/tunnelkit/... when the variable is not set), one file for
// each -config file or each command line's edges and endpoint.
//
// The agent waits for its edge at startup: while the edge (or the proxy on
// the way) cannot be reached, or refuses for now, it tries again with
// backoff, logging a line for each attempt (what failed, when the next
// comes), for good or for -wait. A token refused, a name taken or an
// address that is not an edge's agent port end it at once, with a message
// that says which flag to change.
//
// Without -proxy, the agent takes its proxy from HTTPS_PROXY, else
// ALL_PROXY, unless NO_PROXY lists the edge (agent.ProxyFromEnvironment).
//
// The traffic policy flags (-cidr-allow, -basic-auth, -oidc-issuer,
// -rate-limit, -verify-webhook, ...) declare rules the edge enforces before
// a connection or request reaches the app; list flags repeat. See package
// policy.
package agentcmd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/examples/internal/cli"
	"github.com/tunnelkit/tunnelkit/examples/internal/logbuf"
	"github.com/tunnelkit/tunnelkit/examples/internal/yamlcfg"
	"github.com/tunnelkit/tunnelkit/metrics"
)

// Main runs the agent with args (those after "tunnelkit agent", or the
// shorthand's: "http", "3000") until SIGINT or SIGTERM, reading its -config
// file again at each SIGHUP, and exits 2 on an error (0 after -h and
// -version).
func Main(args []string) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if err := run(ctx, args, os.Stdout, os.Stderr, hup); err != nil {
		if errors.Is(err, cli.ErrExit) {
			os.Exit(0) // -h, -version: printed
		}
		fmt.Fprintln(os.Stderr, message(err))
		os.Exit(2)
	}
}

// Run runs the agent with args until ctx is done, printing its URLs to
// stdout and logging to stderr; SIGHUP is not read.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return run(ctx, args, stdout, stderr, nil)
}

// command is the agent's help.
var command = cli.Command{
	Name:     "tunnelkit agent",
	Synopsis: "expose local apps through a tunnel edge",
	Examples: []string{
		"tunnelkit http 3000  http://localhost:3000 at a new random name on the edge at 127.0.0.1:7000",
		"tunnelkit agent -edge edge.example.com:443 -url https://app.example.com -to 3000  https://app.example.com (TLS ends at the edge) to the app at 127.0.0.1:3000",
		"tunnelkit agent -config agent.yml  many endpoints on one session, as the file lists them",
	},
	More: `The shorthand 'tunnelkit PROTO TO' (PROTO: http, https, tcp or tls) binds a new random
name (or -url) and forwards to TO, which takes what -to takes: a port (on 127.0.0.1),
host:port, http://host:port, https://host:port (an app that speaks TLS) or unix:/path.

A -config file is YAML: edge, token, proxy, edge_ca... at the top (the flags' names,
with _ for -), then endpoints, a list of url, to, to_ca, to_server_name, host_header,
app_protocol, log_requests, pool, proxy_proto, verbose_errors, health_check (path, or
tcp: true; interval, timeout, unhealthy_after, healthy_after) and policy (the traffic
policy, in the form the edge's -policy takes). ${VAR} takes its value from the environment. Flags
win over the file. SIGHUP reads the file again.

An http or https url may end in a path (http://app.example.com/api): the endpoint takes
the requests for the name whose path is that one or under it, the longest path winning,
and the name's url without a path the others; strip_prefix (-strip-prefix) has the edge
send the app the path without it.`,
}

// message is err as the agent prints it: prefixed "tunnelkit agent: ",
// in the place of the "agent: " of the agent package's errors, with the
// flag to change when the error says which.
func message(err error) string {
	msg := "tunnelkit agent: " + strings.TrimPrefix(err.Error(), "agent: ")
	switch {
	case errors.Is(err, agent.ErrNoToken):
		msg += " (give the edge's token with -token)"
	case errors.Is(err, agent.ErrUnauthorized):
		msg += " (check -token)"
	case errors.Is(err, agent.ErrNotAgentPort):
		msg += "; -edge takes the edge's agent address: its -agents flag, 127.0.0.1:7000 by default"
	case errors.Is(err, agent.ErrTLSExpected):
		msg += "; turn TLS on with -edge-ca FILE, the CA of the edge's certificate, and without -plaintext (TLS is the default for an edge not on loopback)"
	case errors.Is(err, agent.ErrPlaintextExpected):
		msg += "; -plaintext connects without TLS (only on a private network: the token travels in the clear)"
	}
	return msg
}

// shorthands are the first words of "tunnelkit PROTO TO".
var shorthands = map[string]bool{"http": true, "https": true, "tcp": true, "tls": true}

// cmdline is what the command line says.
type cmdline struct {
	fs       *flag.FlagSet
	g        globals
	config   string
	endpoint endpointSpec // of the endpoint flags
	pf       policyFlags
	edgeList string
	health   healthSpec // -health-check, -health-interval
}

// endpointFlags are the flags of one endpoint, which a -config file's
// endpoints take as keys (with _ for -).
var endpointFlags = []string{"url", "to", "to-ca", "to-server-name", "host-header", "app-protocol", "log-requests", "pool", "proxy-proto", "verbose-errors", "strip-prefix"}

// parseArgs parses the command line, the shorthand "PROTO TO" first or
// last among the flags.
func parseArgs(args []string, stdout, stderr io.Writer) (*cmdline, error) {
	cl := &cmdline{}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	cl.fs = fs
	e := &cl.endpoint
	fs.StringVar(&cl.edgeList, "edge", "127.0.0.1:7000", "the edge's agent address: its agent port, or its public TLS port when it takes agents there; or several, separated by commas (edges that share their names): the agent connects to the first that answers and, when its session ends, moves on to the next")
	fs.StringVar(&cl.config, "config", "", "read the session's settings and its endpoints from this YAML file (see below); flags given win over the file, and SIGHUP reads it again")
	fs.StringVar(&e.URL, "url", "", "the public URL to ask for: http://abc.example.test, https://abc.example.test (TLS ends at the edge), tls://app.example.test (TLS passed through to the app), tcp:// (any port) or tcp://:20001 (empty: http at a new random name)")
	fs.StringVar(&e.To, "to", "", "the app to forward connections to: a port (3000, on 127.0.0.1), host:port, http://host:port, https://host:port (an app that speaks TLS) or unix:/path")
	fs.StringVar(&e.ToCA, "to-ca", "", "with -to https://..., a PEM file of the CA that signed the app's certificate (default: the system's roots); the agent always checks the app's certificate, and has no way to skip the check")
	fs.StringVar(&e.ToServerName, "to-server-name", "", "with -to https://..., the name the app's certificate must carry, when it is not -to's host (e.g. -to https://127.0.0.1:8443 -to-server-name dev.local)")
	fs.StringVar(&e.HostHeader, "host-header", "", "the Host header the app gets: empty keeps the client's; \"rewrite\" sets -to's host:port; any other value is sent as it is (http and https URLs; the requests then go through a reverse proxy hop, which -inspect does not show)")
	fs.StringVar(&e.AppProtocol, "app-protocol", "", "for an http or https URL, what the app speaks: http1 (HTTP/1.1) or h2c (HTTP/2 without TLS, as gRPC servers do; with -to https://, HTTP/2 over TLS) (empty: http1)")
	fs.BoolVar(&e.LogRequests, "log-requests", true, "for an http or https URL, forward request by request and log a line for each; false: copy each connection's bytes and log a line per connection")
	fs.IntVar(&e.ProxyProto, "proxy-proto", 0, "send a PROXY protocol header of this version (1 or 2) to the app at the start of each connection, naming the client (with an http or https URL, needs -log-requests=false); 0: none")
	fs.BoolVar(&e.Pool, "pool", false, "join the endpoint's pool, when agents of the same token hold it already, rather than fail")
	fs.BoolVar(&e.StripPrefix, "strip-prefix", false, "for an http or https URL with a path (-url http://app.example.test/api), have the edge send the app each request's path without it (/api/x as /x), with X-Forwarded-Prefix: /api")
	fs.BoolVar(&e.VerboseErrors, "verbose-errors", false, "for an http or https URL, show the public the detail of an error (the app's address, the dial or certificate error) in the error pages, as for development; false: the pages say what happened, with a request ID under which this agent's log (or the edge's) has the detail")
	fs.StringVar(&cl.health.Path, "health-check", "", "check the app: an HTTP GET of this path (2xx and 3xx are healthy), or \"tcp\" for a connection, every -health-interval; the edge sends the endpoint nothing while the app is down (3 checks failed in a row) or before the first check passed, and a pool's other members take its traffic (empty: no check)")
	fs.StringVar(&cl.health.Interval, "health-interval", "", "with -health-check, the time between two checks (empty: 10s; 1s at least)")
	fs.StringVar(&cl.g.token, "token", "", "the token to present to the edge (empty: none)")
	fs.StringVar(&cl.g.edgeCA, "edge-ca", "", "PEM file of the CA that signed the edges' certificates, each checked against its -edge host name; given, it turns TLS on for an edge on loopback too (default: the system's roots)")
	fs.BoolVar(&cl.g.plaintext, "plaintext", false, "connect to the edges without TLS (the default for an edge on loopback, unless -edge-ca is given)")
	fs.StringVar(&cl.g.proxy, "proxy", "", "reach the edges through this proxy: http://[user:password@]host:port or https://... (CONNECT), socks5://[user:password@]host:port or socks5h://... (default: HTTPS_PROXY, else ALL_PROXY, from the environment, except for edges NO_PROXY lists and edges on loopback)")
	fs.StringVar(&cl.g.proxyCA, "proxy-ca", "", "PEM file of the CA that signed an https:// proxy's certificate (default: the system's roots)")
	fs.StringVar(&cl.g.metrics, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics (empty: none)")
	fs.DurationVar(&cl.g.wait, "wait", 0, "how long to wait for the edge at startup: while it, or the proxy on the way, cannot be reached or refuses for now, the agent tries again with backoff and logs each attempt; a token refused, a name taken or a wrong port end it at once (0: for good)")
	fs.DurationVar(&cl.g.heartbeat, "heartbeat-interval", 0, "ping the edge when it was silent this long, and end the session after 15s more of silence, then connect again; keep it under the idle timeout of the NATs and proxies on the way, and equal to the edge's (0: 30s)")
	fs.StringVar(&cl.g.inspect, "inspect", "", "serve the request inspector (the last requests, live, with replay) on this loopback address, e.g. 127.0.0.1:4040; http and https URLs with -log-requests (empty: none)")
	fs.StringVar(&cl.g.state, "state", "", "the file where the agent keeps its session's and endpoints' tickets, so that it gets the same URLs back at once when it starts again, even after kill -9 (default: $XDG_STATE_HOME/tunnelkit/agent-HASH.json, or ~/.local/state/tunnelkit/..., one for each -config file or command line; -state '' keeps none)")
	cl.pf.register(fs)

	// "tunnelkit http 3000 -flags": the shorthand first.
	var pos []string
	if len(args) >= 1 && shorthands[args[0]] {
		n := 1
		if len(args) >= 2 && !strings.HasPrefix(args[1], "-") {
			n = 2 // "http 3000"; "http -h" is a flag
		}
		pos, args = args[:n], args[n:]
	}
	if err := command.Parse(fs, args, stdout, stderr); err != nil {
		return nil, err
	}
	if pos == nil && fs.NArg() > 0 {
		// "tunnelkit agent -flags http 3000 -more-flags": the shorthand after some.
		rest := fs.Args()
		n := 1
		if shorthands[rest[0]] || len(rest) >= 2 && !strings.HasPrefix(rest[1], "-") {
			n = min(2, len(rest)) // "http 3000", or a protocol mistyped: "htpp 3000"
		}
		pos = rest[:n]
		if err := command.Parse(fs, rest[n:], stdout, stderr); err != nil {
			return nil, err
		}
	}
	if fs.NArg() > 0 {
		return nil, usageError("unexpected argument %q", fs.Arg(0))
	}
	if len(pos) > 0 {
		if err := cl.shorthand(pos); err != nil {
			return nil, err
		}
	}
	cl.g.stateSet = cli.FlagGiven(fs, "state")
	return cl, nil
}

// shorthand reads "PROTO TO" into the endpoint.
func (cl *cmdline) shorthand(pos []string) error {
	if !shorthands[pos[0]] {
		if len(pos) == 2 {
			msg := fmt.Sprintf("unknown protocol %q: want http, https, tcp or tls", pos[0])
			if near := cli.Closest(pos[0], []string{"http", "https", "tcp", "tls"}); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			return usageError("%s", msg)
		}
		if cl.endpoint.To == "" && len(pos) == 1 {
			return usageError("unexpected argument %q: to expose a port, write 'tunnelkit http %s' or -to %s", pos[0], pos[0], pos[0])
		}
		return usageError("unexpected argument %q: the shorthand is 'tunnelkit PROTO TO', PROTO one of http, https, tcp, tls", pos[0])
	}
	proto := pos[0]
	if len(pos) != 2 {
		return usageError("'tunnelkit %s' needs what to forward to: 'tunnelkit %s 3000'", proto, proto)
	}
	if cli.FlagGiven(cl.fs, "to") {
		return usageError("'tunnelkit %s %s' names the app already: leave out -to", proto, pos[1])
	}
	if cl.config != "" {
		return usageError("'tunnelkit %s %s' and -config: list the endpoint in the file, or leave out -config", proto, pos[1])
	}
	cl.endpoint.To = pos[1]
	u := cl.endpoint.URL
	switch {
	case u == "":
		cl.endpoint.URL = proto + "://" // a random name (tls: the agent's, see runner.bind)
	case !strings.Contains(u, "://"):
		cl.endpoint.URL = proto + "://" + u
	case !strings.EqualFold(cl.endpoint.scheme(), proto):
		return usageError("'tunnelkit %s' and -url %s: the schemes differ", proto, u)
	}
	return nil
}

func usageError(format string, args ...any) error {
	return &cli.UsageError{Msg: fmt.Sprintf(format, args...) + "\nRun 'tunnelkit agent -h' for every flag."}
}

// load returns the settings and endpoints the command line and its
// -config file, if any, say; lookup reads the environment for the file's
// ${VAR}.
func (cl *cmdline) load(lookup func(string) (string, bool)) (globals, []endpointSpec, error) {
	g := globals{}
	var specs []endpointSpec
	if cl.config != "" {
		f, err := yamlcfg.Load(cl.config, lookup)
		if err != nil {
			return g, nil, err
		}
		if specs, err = g.fromFile(f); err != nil {
			return g, nil, err
		}
		for _, name := range []string{"url", "to"} {
			if cli.FlagGiven(cl.fs, name) {
				return g, nil, fmt.Errorf("-%s names one endpoint, and -config lists them: add it to %s", name, cl.config)
			}
		}
	}
	// Flags given win over the file.
	given := func(name string) bool { return cli.FlagGiven(cl.fs, name) }
	if given("edge") || len(g.edges) == 0 {
		edges, err := parseEdges(cl.edgeList)
		if err != nil {
			return g, nil, err
		}
		g.edges = edges
	}
	for name, dst := range map[string]*string{"token": &g.token, "proxy": &g.proxy, "proxy-ca": &g.proxyCA, "edge-ca": &g.edgeCA, "metrics": &g.metrics, "inspect": &g.inspect} {
		if given(name) {
			*dst = cl.fs.Lookup(name).Value.String()
		}
	}
	if given("plaintext") {
		g.plaintext = cl.g.plaintext
	}
	if given("wait") {
		g.wait = cl.g.wait
	}
	if given("heartbeat-interval") {
		g.heartbeat = cl.g.heartbeat
	}
	if g.heartbeat < 0 {
		return g, nil, fmt.Errorf("-heartbeat-interval %v: want a duration, or 0 for the default", g.heartbeat)
	}
	if given("state") {
		g.state, g.stateSet = cl.g.state, true
	}
	if g.wait < 0 {
		return g, nil, fmt.Errorf("-wait %v: want a duration, or 0 for good", g.wait)
	}
	pol, err := cl.pf.spec(os.ReadFile)
	if err != nil {
		return g, nil, err
	}
	var health *healthSpec // of the flags
	if given("health-check") || given("health-interval") {
		h := cl.health
		if h.Path == "tcp" {
			h.Path, h.TCP = "", true
		}
		if h.Path == "" && !h.TCP {
			return g, nil, errors.New("-health-interval: with -health-check PATH (or tcp)")
		}
		health = &h
	}
	if cl.config == "" {
		e := cl.endpoint
		e.Policy, e.flags, e.where = pol, true, "the command line"
		e.HealthCheck = health
		if e.To == "" {
			return g, nil, errNoEndpoint
		}
		specs = []endpointSpec{e}
	} else {
		// The endpoint flags given win over each endpoint's keys.
		for i := range specs {
			s, f := &specs[i], cl.endpoint
			for _, name := range endpointFlags {
				if !given(name) {
					continue
				}
				switch name {
				case "to-ca":
					s.ToCA = f.ToCA
				case "to-server-name":
					s.ToServerName = f.ToServerName
				case "host-header":
					s.HostHeader = f.HostHeader
				case "app-protocol":
					s.AppProtocol = f.AppProtocol
				case "log-requests":
					s.LogRequests = f.LogRequests
				case "pool":
					s.Pool = f.Pool
				case "strip-prefix":
					s.StripPrefix = f.StripPrefix
				case "proxy-proto":
					s.ProxyProto = f.ProxyProto
				case "verbose-errors":
					s.VerboseErrors = f.VerboseErrors
				}
			}
			if pol != nil {
				s.Policy = pol
			}
			if health != nil {
				s.HealthCheck = health
			}
		}
	}
	seen := map[string]string{}
	for i := range specs {
		if err := specs[i].check(os.ReadFile); err != nil {
			return g, nil, err
		}
		if prev, dup := seen[specs[i].stateKey()]; dup && specs[i].URL != "" && !strings.HasSuffix(specs[i].URL, "://") {
			return g, nil, fmt.Errorf("%s: the same URL and app as %s", specs[i].where, prev)
		}
		seen[specs[i].stateKey()] = specs[i].where
	}
	return g, specs, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal) error {
	cl, err := parseArgs(args, stdout, stderr)
	if err != nil {
		return err
	}
	g, specs, err := cl.load(os.LookupEnv)
	if err != nil {
		return err
	}
	interrupted := ctx // SIGINT, SIGTERM
	httpAny := false
	for _, s := range specs {
		httpAny = httpAny || s.httpMode()
	}
	var insp *inspect.Inspector
	if g.inspect != "" {
		if !httpAny {
			return errors.New("-inspect: for an http or https URL with -log-requests")
		}
		if err := loopback(g.inspect); err != nil {
			return fmt.Errorf("-inspect %q: %v", g.inspect, err)
		}
		insp = new(inspect.Inspector)
	}
	// A line per request goes out with others, 50 ms later at most, not
	// in a write of its own on the request's path.
	lw := logbuf.New(stderr, 50*time.Millisecond)
	defer lw.Close()
	log := slog.New(slog.NewTextHandler(lw, nil))

	state, err := cl.openState(g, specs, log)
	if err != nil {
		return err
	}
	defer state.close()

	c := &agent.Client{Addrs: g.edges, Token: g.token, Plaintext: g.plaintext, Logger: log, ResumeTicket: state.session(), HeartbeatInterval: g.heartbeat}
	if g.proxy != "" {
		u, err := parseProxy(g.proxy)
		if err != nil {
			return err
		}
		c.Proxy = agent.ProxyURL(u) // the environment's proxy variables no longer count
	}
	if g.proxyCA != "" {
		roots, err := readCA(g.proxyCA, os.ReadFile)
		if err != nil {
			return fmt.Errorf("-proxy-ca: %w", err)
		}
		c.ProxyTLSConfig = &tls.Config{RootCAs: roots}
	}
	if g.edgeCA != "" {
		roots, err := readCA(g.edgeCA, os.ReadFile)
		if err != nil {
			return fmt.Errorf("-edge-ca: %w", err)
		}
		// Each edge's certificate is checked against its own host name.
		c.TLSConfig = &tls.Config{RootCAs: roots}
	}
	defer c.Close()
	// The session ticket changes at each session, and when renewed: kept at once.
	saved := make(chan struct{}, 1)
	var m *metrics.Agent
	hint := &reachHint{log: log}
	c.OnEvent = func(e agent.Event) {
		if m != nil {
			m.Event(e)
		}
		hint.see(e)
		if e.Kind == agent.Connected || e.Kind == agent.TicketRenewed {
			select {
			case saved <- struct{}{}:
			default:
			}
		}
	}
	if g.metrics != "" {
		m = metrics.NewAgent()
		reg := prometheus.NewRegistry()
		reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		ln, err := net.Listen("tcp", g.metrics)
		if err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
		c.Observer = m
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &runner{c: c, log: log, insp: insp, stdout: stdout, state: state, failed: cancel, many: cl.config != ""}
	defer r.stopAll()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-saved:
				if err := state.update(func(d *stateData) { d.Session = c.Ticket() }); err != nil {
					log.Warn("state file not written", "file", state.path, "err", err)
				}
			}
		}
	}()

	// The wait for the edge: for good, or -wait.
	setup, cancelSetup := ctx, context.CancelFunc(func() {})
	if g.wait > 0 {
		setup, cancelSetup = context.WithTimeoutCause(ctx, g.wait, fmt.Errorf("-wait %v passed", g.wait))
	}
	for _, s := range specs {
		if err := r.start(setup, s); err != nil {
			cancelSetup()
			if interrupted.Err() != nil {
				return nil // interrupted while it waited
			}
			return err
		}
	}
	cancelSetup()
	if insp != nil {
		ln, err := net.Listen("tcp", g.inspect)
		if err != nil {
			return fmt.Errorf("-inspect: %w", err)
		}
		hs := &http.Server{Handler: insp, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
		log.Info("inspector", "url", "http://"+ln.Addr().String()+"/")
	}
	for {
		select {
		case <-ctx.Done():
			if interrupted.Err() != nil {
				return nil
			}
			return context.Cause(ctx) // an endpoint lost for good
		case <-hup:
			if cl.config == "" {
				log.Warn("SIGHUP: there is no -config file to read again")
				continue
			}
			r.reload(ctx, cl, g)
		}
	}
}

// openState opens the state file that g says (or the default one for
// this configuration), locked; nil when it keeps none.
func (cl *cmdline) openState(g globals, specs []endpointSpec, log *slog.Logger) (*stateFile, error) {
	path := g.state
	if !g.stateSet {
		key := "config " + cl.config
		if abs, err := filepath.Abs(cl.config); cl.config != "" && err == nil {
			key = "config " + abs
		}
		if cl.config == "" {
			key = strings.Join(g.edges, ",") + " " + specs[0].stateKey()
		}
		p, err := defaultStatePath(key)
		if err != nil {
			log.Warn("no state file: the agent will not get its URLs back at once when it starts again", "err", err)
			return nil, nil
		}
		path = p
	}
	if path == "" {
		return nil, nil
	}
	s, err := openState(path)
	switch {
	case errors.Is(err, errStateBusy) && !g.stateSet:
		log.Warn("another agent runs with the same settings and holds their state file: this one keeps none", "file", path)
		return nil, nil
	case errors.Is(err, errStateBusy):
		return nil, fmt.Errorf("-state %s: %w (each agent needs a state file of its own)", path, err)
	case err != nil:
		return nil, fmt.Errorf("-state: %w", err)
	}
	log.Info("state", "file", path)
	return s, nil
}

// parseProxy parses -proxy's URL; without a scheme it is an http:// proxy,
// as in HTTPS_PROXY.
func parseProxy(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL itself may hold a password
		}
		return nil, fmt.Errorf("-proxy: %v", err)
	}
	switch u.Scheme {
	case "http", "https", "socks5", "socks5h":
	default:
		return nil, fmt.Errorf("-proxy %s: want an http://, https://, socks5:// or socks5h:// URL", u.Redacted())
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("-proxy %s: no host", u.Redacted())
	}
	return u, nil
}

// readCA reads a PEM file of CA certificates with readFile.
func readCA(file string, readFile func(string) ([]byte, error)) (*x509.CertPool, error) {
	pem, err := readFile(file)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", file)
	}
	return roots, nil
}

// parseEdges splits -edge's comma-separated list of host:port addresses.
func parseEdges(list string) ([]string, error) {
	var edges []string
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("-edge %q: want host:port[,host:port...]: %q: %v", list, a, err)
		}
		edges = append(edges, a)
	}
	return edges, nil
}

// loopback checks that addr is a loopback address: the inspector shows
// every request's headers and bodies, and replays them.
func loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return errors.New("the inspector serves only on a loopback address (127.0.0.1, ::1, localhost): it shows every request and replays them")
	}
	return nil
}
