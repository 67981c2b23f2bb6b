// Command agent exposes a local address through a tunnel edge. It prints
// the public URL alone on one stdout line and logs to stderr: for an http
// or https URL a line per request (method, path, status, bytes, duration,
// client), for the others a line per connection. -edge takes one edge's
// agent address or several, separated by commas: edges that share their
// names, which the agent moves between when its session ends. An edge's
// agent address is its agent port, or its public TLS port (443) when it
// takes agents there.
//
//	agent -edge 127.0.0.1:7000 -url http://abc.example.test -to 127.0.0.1:3001
//	agent -edge 127.0.0.1:7000 -url https://abc.example.test -inspect 127.0.0.1:4040 -to 127.0.0.1:3001
//	agent -edge 127.0.0.1:7000 -url https://grpc.example.test -app-protocol h2c -to 127.0.0.1:50051
//	agent -edge 127.0.0.1:7000 -url http://abc.example.test -log-requests=false -proxy-proto 1 -to 127.0.0.1:3001
//	agent -edge 127.0.0.1:7000 -url tls://app.example.test -to 127.0.0.1:9443
//	agent -edge 127.0.0.1:7000 -url tcp://:20001 -proxy-proto 2 -pool -to 127.0.0.1:22
//	agent -edge edge1.example.com:7000,edge2.example.com:7000 -url https://abc.example.com -to 127.0.0.1:3001
//	agent -edge edge.example.com:7000 -token T -wait 1m -url https://abc.example.com -to 127.0.0.1:3001
//	agent -edge example.com:443 -url https://abc.example.com -to 127.0.0.1:3001
//	agent -edge edge.example.com:7000 -proxy http://user:password@proxy.corp:3128 -url https://abc.example.com -to 127.0.0.1:3001
//	HTTPS_PROXY=socks5://proxy.corp:1080 agent -edge edge.example.com:7000 -url https://abc.example.com -to 127.0.0.1:3001
//
// Without -proxy, the agent takes its proxy from HTTPS_PROXY, else
// ALL_PROXY, unless NO_PROXY lists the edge (agent.ProxyFromEnvironment).
//
// The agent waits for its edge at startup: while the edge is not up, or
// refuses for now, it tries again with backoff, logging a line for each
// attempt (what failed, when the next comes), for good or for -wait. A
// token refused, a name taken or an address that is not an edge's agent
// port end it at once, with a message that says which flag to change.
//
// The traffic policy flags (-cidr-allow, -basic-auth, -oidc-issuer,
// -rate-limit, -verify-webhook, ...) declare rules the edge enforces before
// a connection or request reaches -to; list flags repeat. See package
// policy.
//
//	agent -edge edge.example.com:7000 -url https://abc.example.com -to 127.0.0.1:3001 \
//	      -basic-auth ann:s3cret -cidr-deny 203.0.113.0/24 -rate-limit 20/s \
//	      -request-header-add 'X-Env: prod' -response-header-remove Server
package main

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
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/examples/internal/logbuf"
	"github.com/tunnelkit/tunnelkit/metrics"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // the usage is out
		}
		fmt.Fprintln(os.Stderr, message(err))
		os.Exit(2)
	}
}

// message is err as the agent prints it: once prefixed "agent: " (the
// agent package's errors have it already), with the flag to change when
// the error says which.
func message(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "agent: ") {
		msg = "agent: " + msg
	}
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

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	edgeList := fs.String("edge", "127.0.0.1:7000", "the edge's agent address (its agent port, or its public TLS port when it takes agents there), or several separated by commas (edges that share their names): the agent connects to the first that answers and, when its session ends, moves on to the next")
	url := fs.String("url", "", "public URL to ask for: http://abc.example.test, https://abc.example.test (TLS ends at the edge), tls://app.example.test (TLS passed through to -to), tcp:// (any port) or tcp://:20001 (empty: http with a random name)")
	to := fs.String("to", "", "local address to forward connections to, e.g. 127.0.0.1:3001")
	appProto := fs.String("app-protocol", "", "for an http or https URL, what -to speaks: http1 (HTTP/1.1) or h2c (HTTP/2 without TLS, as gRPC servers do) (empty: http1)")
	logRequests := fs.Bool("log-requests", true, "for an http or https URL, forward request by request and log a line for each; false: copy each connection's bytes and log a line per connection")
	proxyProto := fs.Int("proxy-proto", 0, "send a PROXY protocol header of this version (1 or 2) to -to at the start of each connection (with an http or https URL, needs -log-requests=false); 0: none")
	pool := fs.Bool("pool", false, "join the endpoint's pool rather than fail when it is already bound")
	token := fs.String("token", "", "token to present to the edge")
	edgeCA := fs.String("edge-ca", "", "PEM file of the CA that signed the edges' certificates, each checked against its -edge host name; given, it turns TLS on for a loopback edge too (default: the system's roots)")
	plaintext := fs.Bool("plaintext", false, "connect to the edges without TLS (the default for a loopback edge, unless -edge-ca is given)")
	proxyFlag := fs.String("proxy", "", "reach the edges through this proxy: http://[user:password@]host:port or https://... (CONNECT), socks5://[user:password@]host:port or socks5h://... (default: HTTPS_PROXY, else ALL_PROXY, from the environment, except for edges NO_PROXY lists and loopback edges)")
	proxyCA := fs.String("proxy-ca", "", "PEM file of the CA that signed an https:// proxy's certificate (default: the system's roots)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics (empty: none)")
	wait := fs.Duration("wait", 0, "how long to wait for the edge at startup: while it is not up, or refuses for now, the agent tries again with backoff and logs each attempt; a token refused, a name taken or a wrong port end it at once (0: for good)")
	inspectAddr := fs.String("inspect", "", "serve the request inspector (the last requests, live, with replay) on this loopback address, e.g. 127.0.0.1:4040; http and https URLs with -log-requests (empty: none)")
	var pf policyFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	edges, err := parseEdges(*edgeList)
	if err != nil {
		return err
	}
	if *to == "" {
		return errors.New("-to is required")
	}
	if _, _, err := net.SplitHostPort(*to); err != nil {
		return fmt.Errorf("-to %q: %v", *to, err)
	}
	if *wait < 0 {
		return fmt.Errorf("-wait %v: want a duration, or 0 for good", *wait)
	}
	if *proxyProto < 0 || *proxyProto > 2 {
		return fmt.Errorf("-proxy-proto %d: want 1 or 2 (0: none)", *proxyProto)
	}
	scheme := urlScheme(*url)
	isHTTP := scheme == "http" || scheme == "https"
	switch *appProto {
	case "", "http1", "h2c":
	default:
		return fmt.Errorf("-app-protocol %q: want http1 or h2c", *appProto)
	}
	if *appProto != "" && !isHTTP {
		return fmt.Errorf("-app-protocol %s: only for an http or https URL (a %s endpoint's bytes reach -to as the client sent them)", *appProto, scheme)
	}
	httpMode := isHTTP && *logRequests
	if httpMode && *proxyProto != 0 {
		return fmt.Errorf("-proxy-proto %d: for an http or https URL the agent forwards request by request (-log-requests) over connections to -to that clients share, so no PROXY header could name the client (-to gets X-Forwarded-For instead); pass -log-requests=false to forward each connection's bytes after a PROXY header", *proxyProto)
	}
	pol, err := pf.spec(os.ReadFile)
	if err != nil {
		return err
	}
	if pol != nil {
		if err := pol.Validate(scheme); err != nil {
			return fmt.Errorf("traffic policy for a %s URL: %w", scheme, err)
		}
	}
	var insp *inspect.Inspector
	if *inspectAddr != "" {
		if !httpMode {
			return errors.New("-inspect: for an http or https URL with -log-requests")
		}
		if err := loopback(*inspectAddr); err != nil {
			return fmt.Errorf("-inspect %q: %v", *inspectAddr, err)
		}
		insp = new(inspect.Inspector)
	}
	// A line per request goes out with others, 50 ms later at most, not
	// in a write of its own on the request's path.
	lw := logbuf.New(stderr, 50*time.Millisecond)
	defer lw.Close()
	log := slog.New(slog.NewTextHandler(lw, nil))
	c := &agent.Client{Addrs: edges, Token: *token, Plaintext: *plaintext, Logger: log}
	if *proxyFlag != "" {
		u, err := parseProxy(*proxyFlag)
		if err != nil {
			return err
		}
		c.Proxy = agent.ProxyURL(u) // the environment's proxy variables no longer count
	}
	if *proxyCA != "" {
		roots, err := readCA(*proxyCA)
		if err != nil {
			return fmt.Errorf("-proxy-ca: %w", err)
		}
		c.ProxyTLSConfig = &tls.Config{RootCAs: roots}
	}
	if *edgeCA != "" {
		roots, err := readCA(*edgeCA)
		if err != nil {
			return fmt.Errorf("-edge-ca: %w", err)
		}
		// Each edge's certificate is checked against its own host name.
		c.TLSConfig = &tls.Config{RootCAs: roots}
	}
	defer c.Close()
	if *metricsAddr != "" {
		m := metrics.NewAgent()
		reg := prometheus.NewRegistry()
		reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("-metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
		c.Observer, c.OnEvent = m, m.Event
		log.Info("metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	}
	// The wait for the edge: for good, or -wait.
	setup, cancel := ctx, context.CancelFunc(func() {})
	if *wait > 0 {
		setup, cancel = context.WithTimeoutCause(ctx, *wait, fmt.Errorf("-wait %v passed", *wait))
	}
	defer cancel()
	l, err := c.ListenEndpoint(setup, agent.Endpoint{URL: *url, AppProtocol: *appProto, Pool: *pool, Policy: pol})
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while it waited
		}
		return err
	}
	fmt.Fprintln(stdout, l.URL())
	if insp != nil {
		ln, err := net.Listen("tcp", *inspectAddr)
		if err != nil {
			return fmt.Errorf("-inspect: %w", err)
		}
		hs := &http.Server{Handler: insp, ReadHeaderTimeout: 10 * time.Second}
		go hs.Serve(ln)
		defer hs.Close()
		log.Info("inspector", "url", "http://"+ln.Addr().String()+"/")
	}
	if httpMode {
		log.Info("forwarding requests", "url", l.URL(), "to", *to, "app_protocol", l.AppProtocol())
	} else {
		log.Info("forwarding", "url", l.URL(), "to", *to)
	}
	go func() { <-ctx.Done(); l.Close() }()
	var fwd interface{ Serve(net.Listener) error } = forward.Bytes{To: *to, ProxyProtocol: *proxyProto, Logger: log}
	if httpMode {
		// The app protocol is l's.
		h := forward.HTTP{To: *to, Logger: log}
		if insp != nil {
			h.Recorder = insp
		}
		fwd = h
	}
	if err := fwd.Serve(l); err != nil {
		return err
	}
	if ctx.Err() == nil {
		return errors.New("session to the edge ended")
	}
	return nil
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

// readCA reads a PEM file of CA certificates.
func readCA(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
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

// urlScheme returns the scheme of an endpoint URL as the agent package
// reads it: "http" for "" and for a bare name.
func urlScheme(u string) string {
	scheme, _, ok := strings.Cut(u, "://")
	if u == "" || !ok {
		return "http"
	}
	return strings.ToLower(scheme)
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
