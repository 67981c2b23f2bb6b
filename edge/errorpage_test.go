package edge_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/policy"
	"github.com/tunnelkit/tunnelkit/router"
)

// The public sees words, not the inside (issue #39, item 10): a request
// the edge cannot pass on, or that an agent's forwarder answers for its
// app, gets a page that says what happened in words, with its Reason and
// a request ID (also in the Tunnelkit-Request-Id header). The detail (a
// dial error, an address, a certificate's error) goes to the logs under
// that ID: the edge's for its own answers, the agent's for the
// forwarder's, and the edge's access log has the ID of both. Only an
// endpoint whose agent asked for VerboseErrors shows the detail.

// httpReasons returns the Reasons the edge answers HTTP requests with.
func httpReasons() []edge.Reason {
	var rs []edge.Reason
	for _, r := range edge.Reasons() {
		if edge.ReasonStatus(r) != 0 {
			rs = append(rs, r)
		}
	}
	return rs
}

// pageEdge is an edge of a cluster, with its logs.
type pageEdge struct {
	*clusterEdge
	log, access *testtools.Buffer
}

// brokenRouter is a MemoryRouter whose lookups of one name fail, as a
// Router whose store is out of reach fails: with err.
type brokenRouter struct {
	*router.MemoryRouter
	name string
	err  error
}

func (r *brokenRouter) Lookup(ctx context.Context, proto, host string) ([]router.Route, error) {
	if host == r.name {
		return nil, r.err
	}
	return r.MemoryRouter.Lookup(ctx, proto, host)
}

// LookupPath fails as Lookup does: the edge asks it for HTTP requests.
func (r *brokenRouter) LookupPath(ctx context.Context, proto, host, path string) ([]router.Route, error) {
	if host == r.name {
		return nil, r.err
	}
	return r.MemoryRouter.LookupPath(ctx, proto, host, path)
}

// startPageCluster starts edges A and B sharing rt, each with a
// certificate for *.example.test of pki, logging (every level) and an
// access log into buffers of their own; configure (when not nil) is
// called on each before it starts.
func startPageCluster(t *testing.T, pki *testpki.CA, rt router.Router, configure func(i int, s *edge.Server)) (a, b *pageEdge) {
	t.Helper()
	var logs []*pageEdge
	i := 0
	edges := startClusterOf(t, testpki.New(t), rt, func(s *edge.Server, _ *relay.Relay) {
		pe := &pageEdge{log: new(testtools.Buffer), access: new(testtools.Buffer)}
		s.Certificates = []tls.Certificate{pki.Issue(t, "*.example.test")}
		s.Logger = slog.New(slog.NewTextHandler(pe.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s.AccessLog = slog.New(slog.NewTextHandler(pe.access, nil))
		if configure != nil {
			configure(i, s)
		}
		i++
		logs = append(logs, pe)
	}, "127.0.0.1", "127.0.0.1")
	for j, e := range edges {
		logs[j].clusterEdge = e
	}
	return logs[0], logs[1]
}

// pageClient is a client of addr for every name, following no redirect:
// HTTP/2 when h2, else HTTP/1.1; over TLS with cfg (trusting pki), or
// plaintext (h2c with prior knowledge) for a nil cfg.
func pageClient(t *testing.T, addr string, pki *testpki.CA, cfg *tls.Config, h2 bool) *http.Client {
	p := new(http.Protocols)
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}, Protocols: p}
	switch {
	case cfg != nil:
		cfg = cfg.Clone()
		cfg.RootCAs = pki.Pool
		tr.TLSClientConfig = cfg
		p.SetHTTP1(!h2)
		p.SetHTTP2(h2)
	default:
		p.SetHTTP1(!h2)
		p.SetUnencryptedHTTP2(h2)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// stalled is a request body that sends its first bytes, then nothing
// until it is closed (as the client's transport closes it once the
// request is answered) or the test ends.
type stalled struct {
	first  []byte
	done   <-chan struct{}
	closed chan struct{}
	once   sync.Once
}

func newStalled(first string, done <-chan struct{}) *stalled {
	return &stalled{first: []byte(first), done: done, closed: make(chan struct{})}
}

func (s *stalled) Read(p []byte) (int, error) {
	if len(s.first) > 0 {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	select {
	case <-s.done:
	case <-s.closed:
	}
	return 0, errors.New("the body ended")
}

func (s *stalled) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// pageCase is a way to get an error answer for real.
type pageCase struct {
	reason edge.Reason
	name   string // how the answer comes
	// h1Only says why HTTP/2 cannot produce it, when it cannot.
	h1Only string
	// send sends the request, with c (HTTP/2 when h2) or otherwise.
	send func(t *testing.T, h2 bool) (*http.Response, string)
	// agent is set when the agent's forwarder answers (its log has the
	// detail), else the edge does.
	agent bool
	// by is the edge that answers the client; nil: A.
	by *pageEdge
	// detail is what the log that has the request ID says of the cause;
	// empty for a refusal of the client's own doing, or a cause with no
	// words to look for.
	detail string
}

// TestErrorAnswersShowNoDetail produces each Reason the edge answers HTTP
// requests with, for real, over HTTP/1.1 and HTTP/2 (the TLS port where
// the Reason needs TLS, else the HTTP port, h2c with prior knowledge),
// and the answers of an agent's forwarder, in front of apps that refuse
// the connection, have a certificate the agent does not trust, close
// without answering or never answer, directly and relayed through
// another edge. Each answer says what happened in words, with its code
// and a request ID in the header and the body, and shows no IP address,
// no port of an app or edge it reached, no dial, TLS or certificate
// error, no Go error text of its cause. The edge's access log has the
// request ID with the code, and the log of whoever answered (the edge or
// the agent) the same ID with the detail.
func TestErrorAnswersShowNoDetail(t *testing.T) {
	t.Parallel()
	end := make(chan struct{})
	var endOnce sync.Once
	t.Cleanup(func() { endOnce.Do(func() { close(end) }) })
	down := deadAddr(t)
	_, dialErr := net.Dial("tcp", down)
	downRelay := deadAddr(t)
	pki := testpki.New(t)
	appCA, otherCA := testpki.New(t), testpki.New(t)
	tlsApp := startTLSAppOf(t, appCA)
	closer := startClosingApp(t)
	rt := &brokenRouter{MemoryRouter: &router.MemoryRouter{}, name: "broken.example.test", err: fmt.Errorf("the routes' store: %w", dialErr)}
	a, b := startPageCluster(t, pki, rt, func(i int, s *edge.Server) {
		if i == 0 {
			s.Timeouts = edge.Timeouts{ResponseHeader: 500 * time.Millisecond, Body: 500 * time.Millisecond}
			s.Limits = edge.Limits{StreamsPerSession: 3, ClientShare: -1}
			s.OIDC = func(ctx context.Context, cfg policy.OIDCConfig) (policy.Provider, error) {
				// A provider whose discovery cannot reach the issuer.
				c, err := (&net.Dialer{}).DialContext(ctx, "tcp", down)
				if err == nil {
					c.Close()
				}
				return nil, fmt.Errorf("oidc: the discovery of %s: %w", cfg.Issuer, err)
			}
			return
		}
		s.Limits = edge.Limits{StreamsPerSession: 2, ClientShare: 0.5}
	})
	var agentLog testtools.Buffer
	agentLogger := slog.New(slog.NewTextHandler(&agentLog, nil))
	heldApp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		select {
		case <-r.Context().Done():
		case <-end:
		}
	})
	// bind binds ep on e with agent c (a new one for nil) and serves it
	// with serve.
	bind := func(e *pageEdge, c *agent.Client, ep agent.Endpoint, serve func(net.Listener) error) {
		t.Helper()
		if c == nil {
			c = &agent.Client{Addrs: []string{e.agentAddr}}
		}
		l, err := c.ListenEndpoint(context.Background(), ep)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); serve(l) }()
		t.Cleanup(func() { c.Close(); <-done })
	}
	httpServe := func(h http.Handler) func(net.Listener) error {
		return func(l net.Listener) error { return (&http.Server{Handler: h}).Serve(l) }
	}
	ca, cb := &agent.Client{Addrs: []string{a.agentAddr}}, &agent.Client{Addrs: []string{b.agentAddr}}
	t.Cleanup(func() { ca.Close(); cb.Close() })
	bytesTo := func(to string, cfg *tls.Config) func(net.Listener) error {
		return forward.Bytes{To: to, TLSConfig: cfg}.Serve
	}
	httpTo := func(to string, cfg *tls.Config) func(net.Listener) error {
		return forward.HTTP{To: to, TLSConfig: cfg, Logger: agentLogger}.Serve
	}
	untrusted := &tls.Config{RootCAs: otherCA.Pool}
	bind(a, ca, agent.Endpoint{URL: "https://secure"}, httpServe(echoInfo))
	bind(a, ca, agent.Endpoint{URL: "http://refused-bytes"}, bytesTo(down, nil))
	bind(a, ca, agent.Endpoint{URL: "http://untrusted-bytes"}, bytesTo(tlsApp, untrusted))
	bind(a, ca, agent.Endpoint{URL: "http://closes-bytes"}, bytesTo(closer, nil))
	bind(a, ca, agent.Endpoint{URL: "http://refused-http"}, httpTo(down, nil))
	bind(a, ca, agent.Endpoint{URL: "http://untrusted-http"}, httpTo(tlsApp, untrusted))
	bind(a, ca, agent.Endpoint{URL: "http://closes-http"}, httpTo(closer, nil))
	bind(a, ca, agent.Endpoint{URL: "http://silent"}, httpServe(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-end:
		}
	})))
	bind(a, ca, agent.Endpoint{URL: "http://reader"}, httpServe(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })))
	bind(a, ca, agent.Endpoint{URL: "http://denied", Policy: &policy.Spec{CIDRDeny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}, httpServe(echoInfo))
	bind(a, ca, agent.Endpoint{URL: "http://login", Policy: &policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:s3cret"}}}}, httpServe(echoInfo))
	bind(a, ca, agent.Endpoint{URL: "http://limited", Policy: &policy.Spec{RateLimit: &policy.RateLimit{Requests: 1, Seconds: 3600}}}, httpServe(echoInfo))
	bind(a, ca, agent.Endpoint{URL: "http://hook", Policy: &policy.Spec{Webhook: &policy.Webhook{Provider: policy.WebhookGitHub, Secret: "s"}}}, httpServe(echoInfo))
	// A rule that fails at run time: a url-rewrite may not change the host.
	bind(a, ca, agent.Endpoint{URL: "http://badrule", Policy: &policy.Spec{OnHTTPRequest: []policy.Rule{{Name: "to elsewhere", Actions: []policy.Action{
		{Type: policy.ActionURLRewrite, Config: []byte(`{"to":"http://elsewhere.test/"}`)}}}}}}, httpServe(echoInfo))
	for _, p := range []string{"h1", "h2"} {
		bind(a, nil, agent.Endpoint{URL: "http://busy-" + p}, httpServe(heldApp))
		bind(b, nil, agent.Endpoint{URL: "http://share-" + p}, httpServe(heldApp))
	}
	// An app whose agent's health check fails, saying where it looked:
	// down, and never passed.
	bind(a, ca, agent.Endpoint{URL: "http://sick", HealthCheck: &agent.HealthCheck{Check: agent.TCPCheck("tcp", down)}}, httpTo(down, nil))
	bind(b, cb, agent.Endpoint{URL: "http://relayed-bytes"}, bytesTo(down, nil))
	bind(b, cb, agent.Endpoint{URL: "http://relayed-http"}, httpTo(down, nil))
	// Routes no agent of this test bound: one held by an edge that is
	// down, one of another edge whose policy needs an OIDC provider that
	// this edge cannot reach.
	oidcSpec, _ := json.Marshal(policy.Spec{OIDC: &policy.OIDC{Issuer: "https://" + down, ClientID: "c", AllowDomains: []string{"example.com"}}})
	for _, r := range []router.Route{
		{Proto: "http", Name: "offline.example.test", TunnelID: "t1", SessionID: "s1", Identity: "ghost", Edge: downRelay},
		{Proto: "https", Name: "nopolicy.example.test", TunnelID: "t2", SessionID: "s2", Identity: "ghost", Edge: "elsewhere", Policy: string(oidcSpec)},
	} {
		if err := rt.Bind(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	// The rate limit's one request.
	if resp, err := pageClient(t, a.httpAddr, pki, nil, false).Get("http://limited.example.test/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the rate limit's first request: %v, %v", resp, err)
	}

	plain := func(e *pageEdge, h2 bool) *http.Client { return pageClient(t, e.httpAddr, pki, nil, h2) }
	overTLS := func(h2 bool, serverName string) *http.Client {
		return pageClient(t, a.tlsAddr, pki, &tls.Config{ServerName: serverName}, h2)
	}
	send := func(t *testing.T, c *http.Client, req *http.Request) (*http.Response, string) {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s (Host %s): %v", req.Method, req.URL, req.Host, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	request := func(method, url string, body io.Reader, n int64) *http.Request {
		req, err := http.NewRequest(method, url, body)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.ContentLength = n
		}
		return req
	}
	get := func(name string) func(t *testing.T, h2 bool) (*http.Response, string) {
		return func(t *testing.T, h2 bool) (*http.Response, string) {
			return send(t, plain(a, h2), request("GET", "http://"+name+".example.test/x", nil, 0))
		}
	}
	// held sends requests for name to e, each held by its app, until
	// one is answered otherwise.
	held := func(e *pageEdge, name string) func(t *testing.T, h2 bool) (*http.Response, string) {
		return func(t *testing.T, h2 bool) (*http.Response, string) {
			p := "-h1"
			if h2 {
				p = "-h2"
			}
			c := plain(e, h2)
			for range 8 {
				resp, err := c.Get("http://" + name + p + ".example.test/")
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusOK {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					return resp, string(b)
				}
				// Held by the app, its body never ending.
			}
			t.Fatalf("%s: 8 requests held, none refused", name)
			return nil, ""
		}
	}
	raw := func(req string) func(t *testing.T, h2 bool) (*http.Response, string) {
		return func(t *testing.T, h2 bool) (*http.Response, string) { return rawHTTPOpen(t, a.httpAddr, req) }
	}

	cases := []pageCase{
		{reason: edge.ReasonBadRequest, name: "malformed Host", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			req := request("GET", "http://app.example.test/", nil, 0)
			req.Host = "a..example.test"
			return send(t, plain(a, h2), req)
		}},
		{reason: edge.ReasonMissingHost, name: "no Host", h1Only: "net/http's HTTP/2 client always sends :authority", send: raw("GET / HTTP/1.0\r\n\r\n")},
		{reason: edge.ReasonNoEndpoint, name: "no tunnel", send: get("nobody")},
		{reason: edge.ReasonHTTPSOnly, name: "https only", send: get("secure")},
		{reason: edge.ReasonMisdirected, name: "a connection of another name", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			return send(t, overTLS(h2, "secure.example.test"), request("GET", "https://nobody.example.test/", nil, 0))
		}},
		{reason: edge.ReasonBodyTimeout, name: "a stalled body", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			if !h2 {
				return rawHTTPOpen(t, a.httpAddr, "POST / HTTP/1.1\r\nHost: reader.example.test\r\nContent-Length: 100\r\n\r\n0123456789")
			}
			return send(t, plain(a, h2), request("POST", "http://reader.example.test/", newStalled("0123456789", end), 100))
		}},
		{reason: edge.ReasonClientLimit, name: "a client holding its share", by: b, send: held(b, "share")},
		{reason: edge.ReasonAgentBusy, name: "a session at its streams", send: held(a, "busy")},
		{reason: edge.ReasonAgentOffline, name: "relayed to an edge that is down", send: get("offline"), detail: downRelay},
		{reason: edge.ReasonRoutingUnavailable, name: "the Router failed", send: get("broken"), detail: dialErr.Error()},
		{reason: edge.ReasonAppTimeout, name: "an app that does not answer", send: get("silent")},
		{reason: edge.ReasonAppUnreachable, name: "bytes: an app that refuses", send: get("refused-bytes"), detail: dialErr.Error()},
		{reason: edge.ReasonAppUnreachable, name: "bytes: an untrusted certificate", send: get("untrusted-bytes"), detail: "x509: certificate signed by unknown authority"},
		{reason: edge.ReasonAppUnreachable, name: "bytes, relayed: an app that refuses", send: get("relayed-bytes"), detail: dialErr.Error()},
		{reason: edge.ReasonAppUnhealthy, name: "an app its agent's check finds down", send: get("sick"), detail: "the app is down"},
		{reason: edge.ReasonAppUnreachable, name: "requests: an app that refuses", send: get("refused-http"), agent: true, detail: dialErr.Error()},
		{reason: edge.ReasonAppUnreachable, name: "requests: an untrusted certificate", send: get("untrusted-http"), agent: true, detail: "x509: certificate signed by unknown authority"},
		{reason: edge.ReasonAppUnreachable, name: "requests, relayed: an app that refuses", send: get("relayed-http"), agent: true, detail: dialErr.Error()},
		{reason: edge.ReasonAppError, name: "bytes: an app that closes", send: get("closes-bytes")},
		{reason: edge.ReasonAppError, name: "requests: an app that closes", send: get("closes-http"), agent: true, detail: "the app closed the connection before it answered"},
		{reason: edge.ReasonPolicyDenied, name: "cidr_deny", send: get("denied")},
		{reason: edge.ReasonUnauthorized, name: "basic_auth", send: get("login")},
		{reason: edge.ReasonRateLimited, name: "rate_limit", send: get("limited")},
		{reason: edge.ReasonWebhookInvalid, name: "webhook", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			return send(t, plain(a, h2), request("POST", "http://hook.example.test/", strings.NewReader("{}"), 2))
		}},
		{reason: edge.ReasonBodyTooLarge, name: "webhook", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			if !h2 {
				return rawHTTPOpen(t, a.httpAddr, "POST / HTTP/1.1\r\nHost: hook.example.test\r\nContent-Length: 104857600\r\n\r\n")
			}
			return send(t, plain(a, h2), request("POST", "http://hook.example.test/", newStalled("", end), 100<<20))
		}},
		{reason: edge.ReasonPolicyError, name: "a rule that fails", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			return send(t, plain(a, h2), request("GET", "http://badrule.example.test/", nil, 0))
		}},
		{reason: edge.ReasonPolicyUnavailable, name: "an OIDC provider out of reach", send: func(t *testing.T, h2 bool) (*http.Response, string) {
			return send(t, overTLS(h2, "nopolicy.example.test"), request("GET", "https://nopolicy.example.test/", nil, 0))
		}, detail: dialErr.Error()},
	}
	// Not produced here: login_failed needs an OIDC provider that answers
	// (policy/oidc's tests); its messages are words, or the provider's
	// error code that the client's own callback carries, bounded and
	// printable.
	notHere := []edge.Reason{edge.ReasonLoginFailed}
	covered := map[edge.Reason]bool{}
	for _, r := range notHere {
		covered[r] = true
	}
	for _, tc := range cases {
		covered[tc.reason] = true
	}
	for _, r := range httpReasons() {
		if !covered[r] {
			t.Errorf("no case answers %s", r)
		}
	}

	apps := []string{down, downRelay, tlsApp, closer, a.agentAddr, b.agentAddr, a.relayAddr, b.relayAddr}
	for _, tc := range cases {
		for _, h2 := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s/%s", tc.reason, tc.name, protoName(h2)), func(t *testing.T) {
				if h2 && tc.h1Only != "" {
					t.Skip(tc.h1Only)
				}
				by := a
				if tc.by != nil {
					by = tc.by
				}
				resp, body := tc.send(t, h2)
				id := resp.Header.Get("Tunnelkit-Request-Id")
				status := edge.ReasonStatus(tc.reason)
				if resp.StatusCode != status || resp.Header.Get("Tunnelkit-Error") != string(tc.reason) ||
					!strings.HasPrefix(body, string(tc.reason)+": ") || !strings.HasSuffix(body, "\nrequest id: "+id+"\n") || strings.Count(body, "\n") != 2 {
					t.Fatalf("%s, header %v, body %q; want %d %s, the words and the request ID", resp.Status, resp.Header, body, status, tc.reason)
				}
				if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
					t.Errorf("request ID %q; want 16 hex digits", id)
				}
				if leaks := testtools.Leaks(resp.Header, body, apps, tc.detail); leaks != nil {
					t.Errorf("the answer shows %q: %q", leaks, body)
				}
				// The access log has the ID with the code.
				access := fmt.Sprintf(`status=%d bytes=%d .* error=%s request_id=%s`, status, len(body), tc.reason, id)
				waitLine(t, "the access log of "+by.srv.ID, by.access, access)
				// The log of whoever answered has it with the detail.
				if tc.agent {
					waitLine(t, "the agent's log", &agentLog, `level=WARN msg="http error" code=`+string(tc.reason)+` request_id=`+id+` .*`+regexp.QuoteMeta(tc.detail))
				} else {
					waitLine(t, "the log of "+by.srv.ID, by.log, fmt.Sprintf(`msg="http error" status=%d code=%s request_id=%s .*`, status, tc.reason, id)+regexp.QuoteMeta(tc.detail))
				}
			})
		}
	}
}

// waitLine waits until log has a line that matches pattern: the access
// log's line comes once the handler returned, which may be after the
// client read its answer.
func waitLine(t *testing.T, what string, log *testtools.Buffer, pattern string) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	testwait.Within(t, 10*time.Second, what+" has a line matching "+pattern+":\n"+log.String(), func() bool {
		return slices.ContainsFunc(strings.Split(log.String(), "\n"), re.MatchString)
	})
}

// startTLSAppOf serves an HTTP app over TLS with a certificate of ca for
// 127.0.0.1, and returns its address.
func startTLSAppOf(t *testing.T, ca *testpki.CA) string {
	ln := listen(t)
	srv := &http.Server{Handler: echoInfo, TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}}, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// startClosingApp serves an app that reads each connection's first
// request head and closes the connection without a word, and returns its
// address.
func startClosingApp(t *testing.T) string {
	return testnet.Serve(t, listen(t), func(c net.Conn) {
		http.ReadRequest(bufio.NewReader(c))
		c.Close()
	})
}

// TestVerboseErrorsShowDetail: an endpoint whose agent asked for
// VerboseErrors shows the detail behind its error answers, for
// development: the edge's pages (an agent whose app refuses, reporting
// its dial error; the route relayed from the edge that holds its agent,
// which the Router carries), and the forwarder's (which its listener's
// VerboseErrors turns on). The agent refuses it for a tcp endpoint, where
// there is no page.
func TestVerboseErrorsShowDetail(t *testing.T) {
	t.Parallel()
	down := deadAddr(t)
	_, dialErr := net.Dial("tcp", down)
	pki := testpki.New(t)
	a, b := startPageCluster(t, pki, &router.MemoryRouter{}, nil)
	var agentLog testtools.Buffer
	for _, ep := range []struct {
		e    *pageEdge
		name string
		fwd  func(net.Listener) error
	}{
		{a, "bytes", forward.Bytes{To: down}.Serve},
		{a, "requests", forward.HTTP{To: down, Logger: slog.New(slog.NewTextHandler(&agentLog, nil))}.Serve},
		{b, "relayed", forward.Bytes{To: down}.Serve},
	} {
		c := &agent.Client{Addrs: []string{ep.e.agentAddr}}
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://" + ep.name, VerboseErrors: true})
		if err != nil {
			t.Fatal(err)
		}
		if !l.VerboseErrors() {
			t.Errorf("%s: the listener says no verbose errors", ep.name)
		}
		done := make(chan struct{})
		go func() { defer close(done); ep.fwd(l) }()
		t.Cleanup(func() { c.Close(); <-done })
	}
	for _, name := range []string{"bytes", "requests", "relayed"} {
		for _, h2 := range []bool{false, true} {
			resp, err := pageClient(t, a.httpAddr, pki, nil, h2).Get("http://" + name + ".example.test/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			id := resp.Header.Get("Tunnelkit-Request-Id")
			want := "app_unreachable: the app behind the tunnel cannot be reached\nrequest id: " + id + "\ndetail: "
			if resp.StatusCode != http.StatusBadGateway || id == "" || !strings.HasPrefix(string(body), want) || !strings.Contains(string(body), dialErr.Error()) {
				t.Errorf("%s %s: %s %q; want %q, then the dial's error, %q", name, protoName(h2), resp.Status, body, want, dialErr)
			}
		}
	}
	c := &agent.Client{Addrs: []string{a.agentAddr}}
	defer c.Close()
	if _, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "tcp://", VerboseErrors: true}); err == nil || !strings.Contains(err.Error(), "verbose errors need an http or https endpoint") {
		t.Errorf("a tcp endpoint with verbose errors: %v; want refused", err)
	}
}
