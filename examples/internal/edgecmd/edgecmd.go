// Package edgecmd is the tunnelkit command's edge, without the flags that
// need modules the core must not depend on: examples/tunnelkit adds those (routes
// shared through etcd, Prometheus metrics) as an Extension.
package edgecmd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/internal/admin"
	"github.com/tunnelkit/tunnelkit/examples/internal/cli"
	"github.com/tunnelkit/tunnelkit/examples/internal/logbuf"
	"github.com/tunnelkit/tunnelkit/internal/safefile"
	"github.com/tunnelkit/tunnelkit/policy/rules"

	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/sni"
)

// Extension adds to the command: flags of its own, and a Router.
type Extension struct {
	// Flags adds flags to the command's set before it is parsed.
	Flags func(fs *flag.FlagSet)
	// Configure sets up what the Server shares with others (its Router,
	// its Observer...) once the flags are parsed and srv.ID is set, and
	// returns a func that releases it after the edge stopped. Nil: the
	// Server as the flags made it.
	Configure func(ctx context.Context, srv *edge.Server, log *slog.Logger) (release func(), err error)
}

// Main runs the command named name with the process's arguments until
// SIGINT (a shutdown: what is in flight gets 10 s) or SIGTERM (a drain,
// within -drain-timeout), reading its settings again at each SIGHUP (see
// reloader), and exits 2 on an error (0 after -h and -version).
func Main(name string, args []string, ext *Extension) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sig)
	if err := run(ctx, name, args, os.Stdout, os.Stderr, ext, sig); err != nil {
		if errors.Is(err, cli.ErrExit) {
			return // -h, -version: printed
		}
		// The edge package's errors carry "edge: ", which the name would
		// double.
		fmt.Fprintln(os.Stderr, name+":", strings.TrimPrefix(err.Error(), "edge: "))
		os.Exit(2)
	}
}

// Run runs the command with args until ctx is done, printing results to
// stdout and logging to stderr.
func Run(ctx context.Context, name string, args []string, stdout, stderr io.Writer, ext *Extension) error {
	return run(ctx, name, args, stdout, stderr, ext, nil)
}

// run is Run, which also takes the signals of sig: SIGTERM drains the
// edge, SIGHUP reads the settings again.
func run(ctx context.Context, name string, args []string, stdout, stderr io.Writer, ext *Extension, sig <-chan os.Signal) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	agents := fs.String("agents", "127.0.0.1:7000", "address agents connect to (empty: none; agents connect on -tls, see -tls-agents)")
	httpAddr := fs.String("http", "127.0.0.1:8080", "the address of the public HTTP port")
	domain := fs.String("domain", "example.test", "the domain the endpoints' names are under: NAME.DOMAIN (with localhost, URLs work on this machine as they are printed)")
	tlsAddr := fs.String("tls", "", "the address of the public TLS port, routed by the name each client asks for (SNI) (empty: none)")
	tlsAgents := fs.Bool("tls-agents", true, "with -cert or -acme-directory, take agent sessions on -tls too, told apart by ALPN (tunnelkit/1), unless their server name is a tls endpoint's; false: agents connect on -agents only")
	tcpPorts := fs.String("tcp-ports", "", "range of ports for TCP endpoints, e.g. 20000-20100 (empty: none)")
	fs.String("token", "", "shared secret agents must present, as identity \"token\" (empty, and no -tokens: any agent is accepted, each its own identity; see -anonymous)")
	fs.String("tokens", "", "file of \"token identity\" lines: agents present a token, and its identity owns their names; a file that names none refuses every agent until it does (SIGHUP reads it again; a file others may read or write is refused)")
	anonymous := fs.Bool("anonymous", false, "take any agent without a token, each an identity of its own: what an edge without -token, -tokens or the -config file's tokens does, said on purpose (with them: an error)")
	fs.String("log-level", "info", "the least level of the lines logged: debug, info, warn or error")
	ticketKey := fs.String("ticket-key", "", "file with the hex key that signs agents' tickets, created with a new random key if missing; keep it across restarts so that anonymous agents keep their identity, and their names; a file others may read or write, or a link, is refused (empty: a new key each start)")
	stateDir := fs.String("state", "", "directory for the record of who holds which name (names.jsonl), so that a restart gives each name back to the identity that held it when the edge stopped; a first start has none (default: -ticket-key's directory; empty and no -ticket-key: no record, names go to whoever asks first after a restart; unused with -etcd, which keeps the names)")
	allowCatchAll := fs.Bool("allow-catch-all", false, "let agents bind * and *.DOMAIN (every name under the domain: single-tenant edges only)")
	fs.Int("max-pending", 0, "agent connections waiting for their hello at most; past it, the oldest of the address that has the most is closed (0: 1024, negative: no bound)")
	fs.Int("max-pending-per-source", 0, "agent connections waiting for their hello that one address (an IPv6 /64) has at most; past it, its own oldest is closed (0: 64, negative: no bound)")
	fs.Int("max-sessions-per-identity", 0, "agent sessions one identity (one token's agents) holds on this edge at once; past it a hello is refused, and the agent tries its next edge (0: 1024; a fleet of devices sharing a token needs more, each session costing about 30 KB: negative: no bound)")
	fs.Int("max-endpoints", 0, "endpoints per agent session at most (0: 1024, negative: no bound)")
	fs.Int("max-endpoints-per-identity", 0, "endpoints one identity holds on this edge at most, over all its sessions (0: 4096, negative: no bound)")
	fs.Int("max-endpoints-per-source", 0, "endpoints the anonymous agents of one address (an IPv6 /64) hold on this edge at most (0: 1024, negative: no bound)")
	fs.Int("max-endpoints-total", 0, "endpoints on this edge at most, every agent's together (0: 65536, negative: no bound)")
	fs.Int("max-reservations", 0, "the operator's reservations of names (PUT /v1/reservations) the edge holds at most, with -etcd the cluster's; past it, PUT answers 409 (0: 65536; each costs about 200 bytes of memory and a 70-byte line of -state's record for a short name and identity, at most 2.6 KB and 540 bytes; negative: no bound)")
	fs.Int("max-reservations-per-identity", 0, "the operator's reservations of names for one identity at most, as -max-reservations (0: 1024, negative: no bound)")
	fs.Int("max-refused-binds", 0, "refused binds one identity (or the anonymous agents of one address) may have at once; past it each of its binds waits a second more for each refusal (0: 10, negative: no bound)")
	fs.Int("max-auth-failures", 0, "failed agent authentications per source address per minute before its connections are closed at once (0: 10, negative: no limit)")
	fs.Float64("client-share", 0, "part of an endpoint's streams one client address may hold (0: 1/16, negative: no bound)")
	fs.Int("conns-per-source", 0, "connections one client address (an IPv6 /64) may hold at once on -http, and on -tls (0: 1024, negative: no bound)")
	fs.Int("handshakes-per-source", 0, "TLS handshakes for https endpoints one client address (an IPv6 /64) may have under way at once (0: 64, negative: no bound)")
	fs.Int("agent-handshakes", 0, "agents' TLS handshakes whose keys the edge computes at once; the others wait in line, in the order they came, within the handshake timeout, so that the first of a dead edge's thousands of agents get through in milliseconds (0: twice the CPUs, at least 4; negative: no bound)")
	heartbeat := fs.Duration("heartbeat-interval", 0, "ping an agent that was silent this long, and end its session after 15s more of silence (agents ping on their own -heartbeat-interval; keep the two equal, and under the idle timeout of the NATs and proxies between them) (0: 30s)")
	bodyTimeout := fs.Duration("body-timeout", 0, "cut off an HTTP request body that stops moving this long (0: 60s, negative: never)")
	httpIdle := fs.Duration("http-idle", 0, "end an HTTP exchange whose bytes stop moving this long, a silent response too: an event stream, a streamed long poll or a WebSocket that sends nothing for as long is cut, however alive its client; and close keep-alive connections idle as long (0: 2m, negative: never)")
	var proxyFrom prefixList
	fs.Var(&proxyFrom, "proxy-protocol-from", "the load balancers' addresses, as `CIDR,...` (prefixes or single addresses; the flag repeats): their connections to -http, -tls and TCP endpoints must start with a PROXY protocol header (v1 or v2) naming the client; other peers are clients at their own address, never read for a header (empty: no PROXY protocol)")
	agentCert := fs.String("agent-cert", "", "PEM certificate for TLS on -agents (with -agent-key; empty: plaintext)")
	agentKey := fs.String("agent-key", "", "PEM private key of -agent-cert")
	certFile := fs.String("cert", "", "PEM certificate (chain) for https endpoints on -tls, e.g. a wildcard for *.DOMAIN (with -key)")
	keyFile := fs.String("key", "", "PEM private key of -cert")
	acmeDir := fs.String("acme-directory", "", "ACME directory URL to get certificates for https endpoints from, on demand, for names agents bind (implies accepting the CA's terms)")
	acmeCA := fs.String("acme-ca", "", "PEM file of the CA that signs the ACME server's own HTTPS certificate (a test CA; default: the system's roots)")
	acmeEmail := fs.String("acme-email", "", "contact address for the ACME CA")
	acmeCache := fs.String("acme-cache", "", "directory for the ACME account key, certificates and the record of what the order budgets spent, each -acme-directory's apart (default: tunnelkit/acme under the user's cache directory)")
	acmeRenew := fs.Duration("acme-renew-before", 0, "renew ACME certificates this long before they expire (0: the lesser of 30 days and a third of their lifetime)")
	acmePerHour := fs.Int("acme-orders-per-hour", 0, "ACME orders the edge places per hour, renewals included (0: 100, negative: no bound)")
	acmePerWeek := fs.Int("acme-orders-per-week", 0, "ACME orders for first certificates the edge places per 7 days (0: 50, Let's Encrypt's certificates per registered domain; negative: no bound)")
	acmePerIdentity := fs.Int("acme-orders-per-identity", 0, "ACME orders for first certificates the names of one identity (or of every anonymous agent together) may cause per hour (0: 5, negative: no bound)")
	acmeShare := fs.Float64("acme-identity-share", 0, "part of -acme-orders-per-week the names of one identity may spend (0: 1/5, negative: no bound)")
	acmeGrace := fs.Duration("acme-grace", 0, "keep and renew the certificate of a name no agent binds any more this long, then drop it from memory and the cache (0: 7 days, negative: none)")
	publicHTTP := fs.String("public-http-port", "", "the port the edge writes into the http:// URLs it gives agents: where the public reaches -http, behind a load balancer, NAT or docker -p (80: none written; empty: -http's own port)")
	publicTLS := fs.String("public-tls-port", "", "the port the edge writes into the https:// and tls:// URLs it gives agents: where the public reaches -tls (443: none written; empty: -tls's own port)")
	redirectHTTPS := fs.Bool("redirect-https", false, "answer plain-HTTP requests for names bound over https only with 308 to https (default: 404 https_only)")
	accessLog := fs.Bool("access-log", true, "log one line per public HTTP request")
	relayAddr := fs.String("relay", "", "address other edges of the cluster reach this one on, relaying connections to the agents it holds (empty: no relay; a lone edge)")
	id := fs.String("id", "", "this edge's ID in the cluster, which other edges dial to relay (default: -relay's address; it must be reachable by them)")
	relayCert := fs.String("relay-cert", "", "PEM certificate of this edge for relay sessions, both ways (with -relay-key and -relay-ca): it names the edge's ID in the SAN URI:tunnelkit-edge://<ID>, for serverAuth and clientAuth")
	relayKey := fs.String("relay-key", "", "PEM private key of -relay-cert")
	relayCA := fs.String("relay-ca", "", "PEM file of the CA that signs every edge's -relay-cert")
	echKey := fs.String("ech-key", "", "PEM file of an ECH key (PRIVATE KEY and ECHCONFIG blocks, as OpenSSL and nginx read): route -tls connections that use Encrypted ClientHello by the name inside, without terminating them")
	echKeygen := fs.String("ech-keygen", "", "write a new ECH key for -public-name to this PEM file, print its ECHConfigList in base64 (for the DNS HTTPS record's ech= parameter) and exit")
	publicName := fs.String("public-name", "", "the public name of the key -ech-keygen makes: the name clients show in clear (an operator's name under the domain, covered by -cert)")
	fs.String("policy", "", "file of the operator's traffic policy, in the JSON form agents send (docs/PROTOCOL.md, bind.policy), enforced on every endpoint beside the agent's: allow lists intersect, deny lists add up, the lower rate limit holds, the operator's headers come last; a login, client CAs or webhook check here leaves none to agents (empty: none)")
	fs.String("policy-kinds", "", "the kinds of traffic policy agents may declare, comma separated (cidr_allow,cidr_deny,rate_limit,basic_auth,oidc,mutual_tls,request_headers,response_headers,webhook, and the phases of rules: on_tcp_connect,on_http_request,on_http_response); others are refused (empty: every kind)")
	fs.String("policy-actions", "", "the actions agents' traffic policy rules may use, comma separated (deny,custom-response,redirect,url-rewrite,add-headers,remove-headers,rate-limit,restrict-ips,basic-auth,verify-webhook,jwt-validation,oidc); others are refused (empty: every action)")
	adminAddr := fs.String("admin", "", "address of the admin API: /healthz (200 while serving, 503 while draining, for load balancers), and with -admin-token-file the control plane's /v1/ (empty: none)")
	fs.String("admin-token-file", "", "file whose first line is the bearer token of the admin API's /v1/ (16 bytes at least; a file others may read or write is refused)")
	drainTimeout := fs.Duration("drain-timeout", 30*time.Second, "how long SIGTERM (or POST /v1/drain) gives the edge to drain: its agents move to other edges of the cluster (256 at a time, for two thirds of it at most; those left then are cut off, and reconnect) and what is in flight finishes, then it exits")
	drainNotice := fs.Duration("drain-notice", 0, "while draining, go on taking public connections this long at least, for load balancers' health checks to see /healthz fail (their interval times the failures they wait for; 0: none, for a load balancer that retries refused connections)")
	fs.Var(new(stringList), "oidc-issuer-allowed", "an OpenID provider's issuer URL that agents' oidc policies may name (repeat for more; empty: any https issuer)")
	configFile := fs.String("config", "", "read the settings from this YAML file: each flag's name, with _ for -, is a key; tokens and policy also take the list of tokens and the policy themselves; flags given win over the file")
	if ext != nil && ext.Flags != nil {
		ext.Flags(fs)
	}
	cmd := edgeCommand(name)
	if err := cmd.Parse(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return &cli.UsageError{Msg: fmt.Sprintf("unexpected argument %q: every setting is a flag (-name value)\nRun '%s -h' for every flag.", fs.Arg(0), name)}
	}
	file := &fileConfig{}
	if *configFile != "" {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var err error
		if file, err = applyConfig(fs, *configFile, given); err != nil {
			return err
		}
	}
	if *domain == "" {
		return errors.New("-domain is required")
	}
	if *echKeygen != "" {
		return echKeygenTo(*echKeygen, *publicName, stdout)
	}
	settings, err := readLive(fs, file)
	if err != nil {
		return err
	}
	if *anonymous && settings.tokensGiven {
		return errors.New("-anonymous takes any agent without a token: drop it, or drop -token, -tokens and the -config file's tokens")
	}
	// The access log's line per request goes out with others, 50 ms later
	// at most, not in a write of its own on the request's path.
	lw := logbuf.New(stderr, 50*time.Millisecond)
	defer lw.Close()
	level := new(slog.LevelVar)
	level.Set(settings.level)
	log := slog.New(slog.NewTextHandler(lw, &slog.HandlerOptions{Level: level}))
	certs, acme, err := certificates(*certFile, *keyFile, *acmeDir, *acmeCA, *acmeEmail, *acmeCache)
	if err != nil {
		return err
	}
	if *acmeRenew != 0 {
		if acme == nil || *acmeRenew < 0 {
			return errors.New("-acme-renew-before: want a positive duration, with -acme-directory")
		}
		acme.RenewBefore = *acmeRenew
	}
	if acme == nil && (*acmePerHour != 0 || *acmePerWeek != 0 || *acmePerIdentity != 0 || *acmeShare != 0 || *acmeGrace != 0) {
		return errors.New("-acme-orders-per-hour, -acme-orders-per-week, -acme-orders-per-identity, -acme-identity-share and -acme-grace need -acme-directory")
	}
	if acme != nil {
		acme.OrdersPerHour, acme.OrdersPerWeek, acme.OrdersPerIdentity = *acmePerHour, *acmePerWeek, *acmePerIdentity
		acme.IdentityShare, acme.Grace = *acmeShare, *acmeGrace
	}
	if (len(certs) > 0 || acme != nil) && *tlsAddr == "" {
		return errors.New("-cert and -acme-directory serve https endpoints on -tls: give -tls too")
	}
	var echKeys []tls.EncryptedClientHelloKey
	if *echKey != "" {
		b, err := os.ReadFile(*echKey)
		if err != nil {
			return fmt.Errorf("-ech-key: %w", err)
		}
		key, _, err := sni.ParseECHKeyPEM(b)
		if err != nil {
			return fmt.Errorf("-ech-key %s: %w", *echKey, err)
		}
		if *tlsAddr == "" {
			return errors.New("-ech-key routes -tls connections: give -tls too")
		}
		echKeys = append(echKeys, key)
	}
	agentsOnTLS := *tlsAgents && (len(certs) > 0 || acme != nil)
	if *agents == "" && !agentsOnTLS {
		return errors.New("-agents is empty: agents then connect on -tls, which takes them with -cert or -acme-directory, and without -tls-agents=false")
	}
	for _, p := range []struct{ flag, port string }{{"-public-http-port", *publicHTTP}, {"-public-tls-port", *publicTLS}} {
		if n, err := strconv.Atoi(p.port); p.port != "" && (err != nil || n < 1 || n > 65535) {
			return fmt.Errorf("%s %q: want a port, 1 to 65535", p.flag, p.port)
		}
	}
	if *publicTLS != "" && *tlsAddr == "" {
		return errors.New("-public-tls-port is the public port of -tls: give -tls too")
	}
	srv := &edge.Server{
		PolicyEngine:      rules.Engine{},
		HTTPPort:          *publicHTTP,
		TLSPort:           *publicTLS,
		ID:                *id,
		NoAgentsOnTLS:     !*tlsAgents,
		ECHKeys:           echKeys,
		Certificates:      certs,
		ACME:              acme,
		RedirectHTTP:      *redirectHTTPS,
		Domain:            *domain,
		Logger:            log,
		AllowCatchAll:     *allowCatchAll,
		ProxyProtocolFrom: proxyFrom,
		Limits:            settings.limits,
		Timeouts:          edge.Timeouts{Body: *bodyTimeout, HTTPIdle: *httpIdle, DrainNotice: *drainNotice, HeartbeatInterval: *heartbeat, Move: movesWithin(*drainTimeout)},
	}
	var tokens *atomic.Pointer[identities] // swapped at SIGHUP; nil: any agent is taken
	switch {
	case settings.tokensGiven:
		tokens = new(atomic.Pointer[identities])
		tokens.Store(&settings.ids)
		srv.Authenticate = func(ctx context.Context, token string) (string, error) {
			return tokens.Load().authenticate(ctx, token)
		}
		if len(settings.ids) == 0 {
			log.Warn("no tokens: every agent is refused until the file names one (SIGHUP reads it again)")
		} else {
			log.Info("agents need a token", "tokens", len(settings.ids))
		}
	case *anonymous:
		log.Info("the edge takes any agent without a token, each an identity of its own (-anonymous)")
	default:
		log.Warn("the edge takes any agent without a token, each an identity of its own: give -tokens to require one, or -anonymous to say so")
	}
	var op *atomic.Pointer[policy.Operator] // swapped at SIGHUP; nil: none
	if settings.hasPolicy {
		op = new(atomic.Pointer[policy.Operator])
		op.Store(&settings.op)
		srv.Policy = func(string) policy.Operator { return *op.Load() }
	}
	if *accessLog {
		srv.AccessLog = log.With("log", "access")
	}
	if *ticketKey != "" {
		key, err := loadTicketKey(*ticketKey)
		if err != nil {
			return err
		}
		srv.TicketKey = key
	}
	srv.StateDir = *stateDir
	if !flagSet(fs, "state") && *ticketKey != "" {
		srv.StateDir = filepath.Dir(*ticketKey)
	}
	if (*agentCert == "") != (*agentKey == "") {
		return errors.New("-agent-cert and -agent-key go together")
	}
	if *agentCert != "" {
		cert, err := tls.LoadX509KeyPair(*agentCert, *agentKey)
		if err != nil {
			return fmt.Errorf("-agent-cert: %w", err)
		}
		srv.AgentTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if *tcpPorts != "" {
		r, err := edge.ParsePortRange(*tcpPorts)
		if err != nil {
			return err
		}
		srv.TCPPorts = r
		if host, _, err := net.SplitHostPort(*httpAddr); err == nil {
			srv.TCPListenHost = host
		}
	}
	relay, err := relayOf(srv, *relayAddr, *relayCert, *relayKey, *relayCA)
	if err != nil {
		return err
	}
	if ext != nil && ext.Configure != nil {
		release, err := ext.Configure(ctx, srv, log)
		if err != nil {
			return err
		}
		defer release()
	}
	var lns []net.Listener
	listen := func(addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
		return ln, nil
	}
	var agentLn net.Listener
	if *agents != "" {
		if agentLn, err = listen(*agents); err != nil {
			return err
		}
	}
	httpLn, err := listen(*httpAddr)
	if err != nil {
		return err
	}
	var tlsLn, relayLn, adminLn net.Listener
	if *tlsAddr != "" {
		if tlsLn, err = listen(*tlsAddr); err != nil {
			return err
		}
	}
	if *adminAddr != "" {
		if adminLn, err = listen(*adminAddr); err != nil {
			return fmt.Errorf("-admin: %w", err)
		}
	}
	if relay != nil {
		if relayLn, err = listen(*relayAddr); err != nil {
			return err
		}
	}
	agentAddr := "" // none
	if agentLn != nil {
		agentAddr = agentLn.Addr().String()
	}
	log.Info("edge up", "id", srv.ID, "state", srv.StateDir, "agents", agentAddr, "agents_on_tls", agentsOnTLS, "http", httpLn.Addr().String(), "tls", *tlsAddr, "relay", *relayAddr, "tcp_ports", *tcpPorts, "domain", *domain, "https", len(certs) > 0 || acme != nil)
	// Start registers every listener before any agent can bind, so that
	// the first URL handed out names the public ports.
	if err := srv.Start(edge.Listeners{Agents: agentLn, HTTP: httpLn, TLS: tlsLn}); err != nil {
		return err
	}
	errc := make(chan error, 1)
	if relay != nil {
		go func() { errc <- relay.Serve(relayLn) }()
		defer relay.Close()
	}
	drainc := make(chan struct{}, 1) // POST /v1/drain
	var api *admin.API
	if adminLn != nil {
		api = &admin.API{Server: srv, Token: settings.adminToken, Logger: log, Drain: func() {
			select {
			case drainc <- struct{}{}:
			default:
			}
		}}
		hs := admin.NewServer(api)
		go hs.Serve(adminLn)
		defer hs.Close() // after the drain: /healthz answers 503 meanwhile
		if tokens != nil {
			api.KnownIdentity = func(identity string) bool { return tokens.Load().has(identity) }
		}
		log.Info("admin API", "url", "http://"+adminLn.Addr().String()+"/healthz", "v1", settings.adminToken != [32]byte{})
	}
	re := &reloader{srv: srv, log: log, level: level, tokens: tokens, op: op, api: api, args: args, start: fs, cur: settings}
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
		case err = <-errc:
		case s := <-sig:
			if s == syscall.SIGHUP {
				re.reload()
				continue
			}
			drainEdge(ctx, srv, log, *drainTimeout)
		case <-drainc:
			drainEdge(ctx, srv, log, *drainTimeout)
		}
		break
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx) // after a drain, it returns at once
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// drainEdge drains srv within d, or until ctx (SIGINT) ends it sooner.
func drainEdge(ctx context.Context, srv *edge.Server, log *slog.Logger, d time.Duration) {
	log.Info("draining", "timeout", d)
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	if err := srv.Drain(dctx); err != nil {
		log.Warn("drained, cutting short what was in flight", "err", err, "took", time.Since(start).Round(time.Millisecond))
		return
	}
	log.Info("drained", "took", time.Since(start).Round(time.Millisecond))
}

// prefixList is the value of -proxy-protocol-from: CIDR prefixes or single
// addresses, comma separated, the flag repeatable.
type prefixList []netip.Prefix

func (l *prefixList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// repeats marks a flag that repeats.
func (l *prefixList) repeats() {}

func (l *prefixList) Set(v string) error {
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		p, err := netip.ParsePrefix(f)
		if err != nil {
			if a, aerr := netip.ParseAddr(f); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen()) // one address
			} else {
				return fmt.Errorf("%q is not a CIDR prefix such as 10.0.0.0/8 or 2001:db8::/32, nor an IP address", f)
			}
		}
		*l = append(*l, p)
	}
	return nil
}

// stringList is the value of a repeatable flag.
type stringList []string

func (l *stringList) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

// Get returns the list, for flag.Getter.
func (l *stringList) Get() any { return []string(*l) }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// repeats marks a flag that repeats: a -config file's list sets it once
// for each item.
func (l *stringList) repeats() {}

// operatorPolicy returns the operator's policy of -policy (or the policy
// of the -config file, inline), -policy-kinds and -oidc-issuer-allowed: the
// same for every identity; any reports whether they set one at all.
func operatorPolicy(file string, inline *policy.Spec, kinds, actions string, issuers []string) (op policy.Operator, any bool, err error) {
	if inline != nil {
		op.Policy, file = *inline, "(the -config file's policy)"
	} else if file != "" {
		b, info, err := safefile.Read(file, policy.MaxSpecBytes)
		if err != nil {
			return op, false, fmt.Errorf("-policy: %w", err)
		}
		if op.Policy, err = policy.Parse(b); err != nil {
			return op, false, fmt.Errorf("-policy %s: %w", file, err)
		}
		types := op.Policy.ActionTypes()
		if p := op.Policy; p.BasicAuth != nil && len(p.BasicAuth.Credentials) > 0 || p.OIDC != nil && p.OIDC.ClientSecret != "" || p.Webhook != nil && p.Webhook.Secret != "" ||
			slices.Contains(types, policy.ActionBasicAuth) || slices.Contains(types, policy.ActionVerifyWebhook) || slices.Contains(types, policy.ActionOIDC) {
			if err := safefile.Private(file, info, "it holds passwords or secrets (basic_auth, oidc client_secret, webhook secret, or such actions of rules)"); err != nil {
				return op, false, fmt.Errorf("-policy: %w", err)
			}
		}
	}
	if file != "" {
		// The kinds that fit some protocol must fit it as they are, and
		// its rules must compile: found now, not at every bind.
		for _, proto := range []string{policy.ProtoHTTP, policy.ProtoHTTPS, policy.ProtoTLS, policy.ProtoTCP} {
			fitted, err := policy.Combine(proto, policy.Operator{Policy: op.Policy}, policy.Spec{})
			if err != nil {
				return op, false, fmt.Errorf("-policy %s: %w", file, err)
			}
			if own := fitted.Rules(); !own.IsZero() {
				if _, err := policy.Compile(context.Background(), proto, own, policy.Options{Engine: rules.Engine{}}); err != nil {
					return op, false, fmt.Errorf("-policy %s: %w", file, err)
				}
			}
		}
	}
	if kinds != "" {
		op.Kinds = []string{}
		for k := range strings.SplitSeq(kinds, ",") {
			k = strings.TrimSpace(k)
			if !policy.Fits(k, policy.ProtoHTTP) && !policy.Fits(k, policy.ProtoHTTPS) && !policy.Fits(k, policy.ProtoTCP) {
				return op, false, fmt.Errorf("-policy-kinds: %q is not a kind of traffic policy", k)
			}
			op.Kinds = append(op.Kinds, k)
		}
	}
	if actions != "" {
		op.Actions = []string{}
		for a := range strings.SplitSeq(actions, ",") {
			a = strings.TrimSpace(a)
			if !slices.Contains(policy.Actions(), a) {
				return op, false, fmt.Errorf("-policy-actions: %q is not an action of traffic policy rules (%s)", a, strings.Join(policy.Actions(), ", "))
			}
			op.Actions = append(op.Actions, a)
		}
	}
	for _, iss := range issuers {
		if u, err := url.Parse(iss); err != nil || u.Scheme != "https" || u.Host == "" {
			return op, false, fmt.Errorf("-oidc-issuer-allowed %q: want an https URL", iss)
		}
		op.OIDCIssuers = append(op.OIDCIssuers, iss)
	}
	return op, file != "" || kinds != "" || actions != "" || len(issuers) > 0, nil
}

// identities maps the SHA-256 of each token to its identity: looking up a
// hash takes the same time whatever the token's bytes.
type identities map[[32]byte]string

// add adds token, of identity, which must be one the edge takes.
func (ids identities) add(token, identity string) error {
	if err := edge.CheckIdentity(identity); err != nil {
		return err
	}
	ids[hashToken(token)] = identity
	return nil
}

// hashToken is what identities keeps of a token.
func hashToken(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// has reports whether a token names identity.
func (ids identities) has(identity string) bool {
	for _, id := range ids {
		if id == identity {
			return true
		}
	}
	return false
}

func (ids identities) authenticate(_ context.Context, token string) (string, error) {
	if id, ok := ids[hashToken(token)]; ok {
		return id, nil
	}
	return "", errors.New("unknown token")
}

// maxTokensFile bounds the -tokens file.
const maxTokensFile = 64 << 20

// load reads "token identity" lines, from a file only its owner may read
// or write.
func (ids identities) load(path string) error {
	b, err := safefile.ReadPrivate(path, maxTokensFile, "its tokens let anyone connect agents as their identities")
	if err != nil {
		return fmt.Errorf("-tokens: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return fmt.Errorf("-tokens %s:%d: want \"token identity\"", path, n)
		}
		if _, dup := ids[hashToken(fields[0])]; dup {
			return fmt.Errorf("-tokens %s:%d: a token given twice", path, n)
		}
		if err := ids.add(fields[0], fields[1]); err != nil {
			return fmt.Errorf("-tokens %s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("-tokens %s: %w", path, err)
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// loadTicketKey reads a hex key of at least 32 bytes, or creates the file
// with a new random one. The key forges any agent's ticket: the file, and
// its directory, are the edge's own (no link, no special file, no mode
// that lets others read or write it; a directory that they may write to,
// where they could swap the key, is refused too).
func loadTicketKey(path string) ([]byte, error) {
	if err := safefile.PrivateDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("-ticket-key: %w", err)
	}
	b, info, err := safefile.ReadOwn(path, 4096)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, 32)
		rand.Read(key)
		// Exclusively: a link planted at path is neither followed nor
		// replaced, nor a key another edge just wrote.
		if err := safefile.CreateFile(path, []byte(hex.EncodeToString(key)+"\n")); err != nil {
			return nil, fmt.Errorf("-ticket-key: %w", err)
		}
		return key, nil
	}
	if err == nil {
		err = safefile.Private(path, info, "the key lets anyone forge agents' tickets, and take their names")
	}
	if err != nil {
		return nil, fmt.Errorf("-ticket-key: %w", err)
	}
	key, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(key) < 32 {
		return nil, fmt.Errorf("-ticket-key %s: want at least 32 bytes in hex", path)
	}
	return key, nil
}

// certificates loads the certificate of -cert and -key, and the ACME
// settings of the -acme flags.
func certificates(certFile, keyFile, dir, caFile, email, cacheDir string) ([]tls.Certificate, *edge.ACME, error) {
	var certs []tls.Certificate
	if (certFile == "") != (keyFile == "") {
		return nil, nil, errors.New("-cert and -key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("-cert: %w", err)
		}
		certs = append(certs, cert)
	}
	if dir == "" {
		if caFile != "" || email != "" || cacheDir != "" {
			return nil, nil, errors.New("-acme-ca, -acme-email and -acme-cache need -acme-directory")
		}
		return certs, nil, nil
	}
	if u, err := url.Parse(dir); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("-acme-directory %q: want an https:// URL", dir)
	}
	acme := &edge.ACME{DirectoryURL: dir, Email: email}
	if cacheDir != "" {
		// It holds the account's and the certificates' keys.
		if err := safefile.PrivateDir(cacheDir); err != nil {
			return nil, nil, fmt.Errorf("-acme-cache: %w", err)
		}
		acme.Cache = autocert.DirCache(cacheDir)
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, nil, fmt.Errorf("-acme-ca: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("-acme-ca %s: no PEM certificate", caFile)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
		acme.HTTPClient = &http.Client{Transport: tr, Timeout: time.Minute}
	}
	return certs, acme, nil
}

// relayOf returns the Relay of -relay and its certificate flags, set as
// srv's Dialer, and fills in srv.ID; nil without -relay.
func relayOf(srv *edge.Server, addr, certFile, keyFile, caFile string) (*relay.Relay, error) {
	if addr == "" {
		if certFile != "" || keyFile != "" || caFile != "" {
			return nil, errors.New("-relay-cert, -relay-key and -relay-ca need -relay")
		}
		return nil, nil
	}
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("-relay needs -relay-cert, -relay-key and -relay-ca: edges authenticate each other")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("-relay %q: %v", addr, err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("-relay-cert: %w", err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("-relay-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-relay-ca %s: no PEM certificate", caFile)
	}
	if srv.ID == "" {
		srv.ID = addr
	}
	rl := &relay.Relay{Server: srv, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool, MinVersion: tls.VersionTLS13}}
	srv.Dialer = rl
	return rl, nil
}

// echKeygenTo writes a new ECH key for publicName to path (refusing to
// overwrite a file) and prints its ECHConfigList in base64 to out.
func echKeygenTo(path, publicName string, out io.Writer) error {
	if publicName == "" {
		return errors.New("-ech-keygen needs -public-name")
	}
	key, list, err := sni.NewECHKey(publicName)
	if err != nil {
		return fmt.Errorf("-public-name: %w", err)
	}
	b, err := sni.MarshalECHKeyPEM(key, list)
	if err != nil {
		return err
	}
	if err := safefile.CreateFile(path, b); err != nil {
		return fmt.Errorf("-ech-keygen: %w", err)
	}
	_, err = fmt.Fprintln(out, base64.StdEncoding.EncodeToString(list))
	return err
}

// movesWithin is the time a drain of drainTimeout gives its agents to
// move: two thirds of it, so that what is in flight on their old sessions
// has the rest to finish (Timeouts.Move's default, 10 s, is the third of
// the default -drain-timeout's). A drain with no time has none.
func movesWithin(drainTimeout time.Duration) time.Duration {
	if drainTimeout <= 0 {
		return 0
	}
	return drainTimeout * 2 / 3
}
