package edge_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/sni"
)

// Agent sessions on the public TLS port (issue #24): one port for public
// https, tls:// passed through, ECH and agents, told apart by server name
// and ALPN.

// onePortEdge is an edge on loopback with one listener, its public TLS
// port: https and tls endpoints, ECH (a key for echPublicName) and agent
// sessions. Its certificate covers *.example.test, example.test (the
// domain itself, which no agent can bind: the name agents dial) and
// 127.0.0.1 (for agents that dial the address, and so send no name).
type onePortEdge struct {
	srv     *edge.Server
	pki     *testpki.CA
	addr    string
	port    string
	configs []byte // the ECH key's ECHConfigList
	obs     *watchedTally
}

func startOnePortEdge(t testing.TB, configure func(*edge.Server)) *onePortEdge {
	t.Helper()
	return startOnePortEdgeWith(t, nil, configure)
}

// startOnePortEdgeWith starts a onePortEdge with an agent port too, when
// agents is not nil.
func startOnePortEdgeWith(t testing.TB, agents net.Listener, configure func(*edge.Server)) *onePortEdge {
	t.Helper()
	pki := testpki.New(t)
	key, configs, err := sni.NewECHKey(echPublicName)
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t)
	obs := newWatchedTally()
	srv := &edge.Server{
		Domain:       "example.test",
		Certificates: []tls.Certificate{pki.Issue(t, "*.example.test", "example.test", "127.0.0.1")},
		ECHKeys:      []tls.EncryptedClientHelloKey{key},
		Observer:     obs,
	}
	if configure != nil {
		configure(srv)
	}
	if err := srv.Start(edge.Listeners{TLS: ln, Agents: agents}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return &onePortEdge{srv: srv, pki: pki, addr: ln.Addr().String(), port: port, configs: configs, obs: obs}
}

// agent returns an agent of the edge's TLS port that dials it as name
// (empty: by its address, sending no name), closed at the test's end.
func (e *onePortEdge) agent(t testing.TB, name string) *agent.Client {
	c := &agent.Client{Addrs: []string{e.addr}, TLSConfig: &tls.Config{RootCAs: e.pki.Pool, ServerName: name}}
	t.Cleanup(func() { c.Close() })
	return c
}

// listenCtx bounds an agent's Listen in these tests: an agent waits for
// its edge for good, and an edge that does not take it would hang the
// test rather than fail it.
func listenCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// bindWithin binds url with c within listenCtx.
func bindWithin(t testing.TB, c *agent.Client, url string) *agent.Listener {
	t.Helper()
	l, err := c.Listen(listenCtx(t), url)
	if err != nil {
		t.Fatalf("binding %s: %v", url, err)
	}
	return l
}

// serveHTTP binds url with c and serves h on it (HTTP/1.1, and HTTP/2
// with prior knowledge).
func serveHTTP(t testing.TB, c *agent.Client, url string, h http.Handler) {
	t.Helper()
	l := bindWithin(t, c, url)
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	hs := &http.Server{Handler: h, Protocols: p}
	done := make(chan struct{})
	go func() { defer close(done); hs.Serve(l) }()
	t.Cleanup(func() { hs.Close(); <-done })
}

// serveHTTPS binds url, a tls endpoint, with c and serves h on it over
// TLS with cert, by ALPN h2 or http/1.1.
func serveHTTPS(t testing.TB, c *agent.Client, url string, cert tls.Certificate, h http.Handler) {
	t.Helper()
	l := bindWithin(t, c, url)
	hs := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}}
	done := make(chan struct{})
	go func() { defer close(done); hs.ServeTLS(l, "", "") }()
	t.Cleanup(func() { hs.Close(); <-done })
}

// TestOnePortHTTPSPassthroughECHAndAgents: an edge with one TLS port and
// nothing else. Agents connect on it, by name, by address (no name) and
// with ECH, and serve an https endpoint (terminated at the edge, HTTP/2),
// a tls endpoint (passed through) and a tls endpoint reached with ECH
// (split mode). Chromium (which sends GREASE ECH) and curl load pages of
// the first two on that port; a Go client with the ECH configuration
// reaches the third, and the https endpoint, with ECH accepted; and an
// agent that connects while Chromium loads its page serves too.
func TestOnePortHTTPSPassthroughECHAndAgents(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "chromium", "curl")
	e := startOnePortEdge(t, nil)
	appCA := testpki.New(t)
	passCert := appCA.Issue(t, "pass.example.test")
	secretCert := appCA.Issue(t, "secret.example.test")

	serveHTTP(t, e.agent(t, "example.test"), "https://web", protocolPage("web"))
	serveHTTPS(t, e.agent(t, ""), "tls://pass.example.test", passCert, protocolPage("pass"))
	echAgent := e.agent(t, "example.test")
	echAgent.TLSConfig.EncryptedClientHelloConfigList = e.configs
	serveHTTPS(t, echAgent, "tls://secret.example.test", secretCert, echoInfo)
	if n := e.obs.get("sessions"); n != 3 {
		t.Fatalf("%d agent sessions on the TLS port, want 3", n)
	}

	// Chromium, beside an agent that connects meanwhile.
	late := make(chan error, 1)
	lateAgent, ctx := e.agent(t, "example.test"), listenCtx(t)
	go func() {
		l, err := lateAgent.Listen(ctx, "https://late")
		if err == nil {
			go http.Serve(l, nameHandler("late"))
		}
		late <- err
	}()
	for _, c := range []struct{ url, want string }{
		{"https://web.example.test:" + e.port + "/", "page=web proto=h2"},
		{"https://pass.example.test:" + e.port + "/", "page=pass proto=h2"},
	} {
		if dom := chromium(t, c.url); !strings.Contains(dom, c.want) {
			t.Errorf("Chromium at %s: want %q, DOM:\n%s", c.url, c.want, dom)
		}
	}
	if err := <-late; err != nil {
		t.Fatalf("an agent connecting while Chromium browses: %v", err)
	}

	// curl, HTTP/2 to the https endpoint, and through to the app's TLS.
	dir := t.TempDir()
	edgeCA, passCA := filepath.Join(dir, "edge-ca.pem"), filepath.Join(dir, "app-ca.pem")
	if err := errors.Join(os.WriteFile(edgeCA, e.pki.PEM, 0o600), os.WriteFile(passCA, appCA.PEM, 0o600)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, ca, want string
	}{
		{"web", edgeCA, "page=web"},
		{"late", edgeCA, "late /"},
		{"pass", passCA, "page=pass"},
	} {
		host := c.name + ".example.test"
		out, err := runCommand("curl", "-sS", "--http2", "--max-time", "30", "--cacert", c.ca,
			"--resolve", host+":"+e.port+":127.0.0.1", "-w", " via HTTP/%{http_version}", "https://"+host+":"+e.port+"/")
		if err != nil || !strings.Contains(out, c.want) || !strings.HasSuffix(out, " via HTTP/2") {
			t.Errorf("curl %s: %v, want %q over HTTP/2:\n%s", host, err, c.want, out)
		}
	}

	// ECH, to the tls endpoint (split mode) and to the https one.
	for _, c := range []struct {
		name  string
		roots *testpki.CA
		want  string
	}{
		{"secret.example.test", appCA, "host=secret.example.test"},
		{"web.example.test", e.pki, "page=web"},
	} {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, n, e.addr)
			},
			TLSClientConfig: &tls.Config{RootCAs: c.roots.Pool, EncryptedClientHelloConfigList: e.configs},
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://" + c.name + "/")
		body := readAll(t, resp, err)
		tr.CloseIdleConnections()
		if !resp.TLS.ECHAccepted || !strings.Contains(body, c.want) {
			t.Errorf("ECH to %s: ECHAccepted %v, body %q, want %q", c.name, resp.TLS.ECHAccepted, body, c.want)
		}
	}
	if n := e.obs.get("sessions"); n != 4 {
		t.Errorf("%d agent sessions at the end, want 4", n)
	}
}

// appOffers is a TLS app that records the ALPN protocols each client
// offered, and answers "app got " and the first 8 bytes it read.
type appOffers struct {
	offered chan []string
}

// serveApp binds url, a tls endpoint, with c and serves TLS with cert,
// selecting no protocol by ALPN.
func (a *appOffers) serve(t testing.TB, c *agent.Client, url string, cert tls.Certificate) {
	t.Helper()
	l := bindWithin(t, c, url)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		select {
		case a.offered <- h.SupportedProtos:
		default: // the test looks at the first few
		}
		return nil, nil
	}}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := tls.Server(conn, cfg)
				defer tc.Close()
				b := make([]byte, 8)
				if _, err := io.ReadFull(tc, b); err == nil {
					fmt.Fprintf(tc, "app got %q", b)
				}
			}()
		}
	}()
}

// TestTLSAgentHelloForAPassthroughName: a hello offering the agent
// protocol for a name bound over tls goes to that endpoint's app
// untouched, whatever it offers: the client completes its handshake with
// the app's certificate and no protocol selected, the app saw the
// client's offer, and the app, not an edge, answers the session preamble;
// with ECH, the inner hello's name decides, as for any client.
// An agent that dials that name fails, saying that no agent port answered.
// No session opens at the edge but the app's own agent's.
func TestTLSAgentHelloForAPassthroughName(t *testing.T) {
	t.Parallel()
	e := startOnePortEdge(t, nil)
	appCA := testpki.New(t)
	app := &appOffers{offered: make(chan []string, 4)}
	app.serve(t, e.agent(t, "example.test"), "tls://pass.example.test", appCA.Issue(t, "pass.example.test"))

	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", e.addr,
		&tls.Config{ServerName: "pass.example.test", RootCAs: appCA.Pool, NextProtos: []string{wire.ALPN}})
	if err != nil {
		t.Fatalf("handshake with the app: %v", err)
	}
	cs := conn.ConnectionState()
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != "pass.example.test" || cs.NegotiatedProtocol != "" {
		t.Errorf("certificate for %q, protocol %q; want the app's, none", cn, cs.NegotiatedProtocol)
	}
	if got := <-app.offered; len(got) != 1 || got[0] != wire.ALPN {
		t.Errorf("the app saw the offer %q, want [%s]", got, wire.ALPN)
	}
	wire.WritePreamble(conn, wire.DefaultWindow)
	got, _ := io.ReadAll(conn)
	conn.Close()
	if want := fmt.Sprintf("app got %q", append([]byte("TKT1"), 0, 4, 0, 0)); string(got) != want {
		t.Errorf("answer to the preamble %q, want the app's %q", got, want)
	}

	// With ECH, by the inner hello: its name is passed through.
	conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", e.addr,
		&tls.Config{ServerName: "pass.example.test", RootCAs: appCA.Pool, NextProtos: []string{wire.ALPN}, EncryptedClientHelloConfigList: e.configs})
	if err != nil {
		t.Fatalf("handshake with the app, with ECH: %v", err)
	}
	cs = conn.ConnectionState()
	conn.Close()
	if cn := cs.PeerCertificates[0].Subject.CommonName; cn != "pass.example.test" || !cs.ECHAccepted {
		t.Errorf("with ECH: certificate for %q, ECHAccepted %v; want the app's, true", cn, cs.ECHAccepted)
	}
	if got := <-app.offered; len(got) != 1 || got[0] != wire.ALPN {
		t.Errorf("with ECH, the app saw the offer %q, want [%s]", got, wire.ALPN)
	}

	c := &agent.Client{Addrs: []string{e.addr}, TLSConfig: &tls.Config{RootCAs: appCA.Pool, ServerName: "pass.example.test"}}
	defer c.Close()
	_, err = c.Listen(listenCtx(t), "http://x")
	if !errors.Is(err, agent.ErrNotAgentPort) || !strings.Contains(err.Error(), "app got") {
		t.Errorf("an agent dialling the passed-through name: %v, want ErrNotAgentPort quoting the app", err)
	}
	if n := e.obs.get("sessions"); n != 1 {
		t.Errorf("%d sessions, want the app's agent's alone", n)
	}
}

// TestTLSWithoutAgentALPNGetsNoAgentProtocol: a TLS client that does not
// offer the agent protocol gets none of it on the one port: for a name
// with no endpoint (the name agents dial) or no name at all, its
// connection is closed before the edge says a word; for an https
// endpoint's name, the session preamble it sends is answered in HTTP:
// HTTP/1.1 400 without ALPN or with http/1.1, an HTTP/2 server's SETTINGS
// with h2. Nothing opens a session.
func TestTLSWithoutAgentALPNGetsNoAgentProtocol(t *testing.T) {
	t.Parallel()
	e := startOnePortEdge(t, nil)
	serveHTTP(t, e.agent(t, "example.test"), "https://web", echoInfo)
	dial := func(name string, protos ...string) (*tls.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", e.addr,
			&tls.Config{ServerName: name, RootCAs: e.pki.Pool, NextProtos: protos})
	}
	for _, name := range []string{"example.test", "127.0.0.1"} {
		for _, protos := range [][]string{nil, {"h2", "http/1.1"}} {
			if conn, err := dial(name, protos...); !errors.Is(err, io.EOF) {
				if conn != nil {
					conn.Close()
				}
				t.Errorf("TLS to %s offering %q: %v, want the connection closed (EOF) before the ServerHello", name, protos, err)
			}
		}
	}
	for _, protos := range [][]string{nil, {"http/1.1"}, {"h2"}} {
		conn, err := dial("web.example.test", protos...)
		if err != nil {
			t.Fatalf("TLS to the https endpoint offering %q: %v", protos, err)
		}
		wire.WritePreamble(conn, wire.DefaultWindow)
		if len(protos) > 0 && protos[0] == "h2" {
			// The server's HTTP/2 preface: a SETTINGS frame (type 4, on
			// stream 0), sent before it reads the client's (24 bytes,
			// which it waits for).
			var h [9]byte
			_, err := io.ReadFull(conn, h[:])
			if err != nil || h[3] != 0x04 || !bytes.Equal(h[5:], []byte{0, 0, 0, 0}) {
				t.Errorf("the preamble to the https endpoint offering h2: answered % x, %v; want an HTTP/2 SETTINGS frame", h, err)
			}
			conn.Close()
			continue
		}
		// The preamble, ended as a line, is a malformed request line: no
		// wait for the server's header timeout.
		io.WriteString(conn, "\r\n")
		got, _ := io.ReadAll(conn)
		conn.Close()
		if want := "HTTP/1.1 400 Bad Request"; !strings.HasPrefix(string(got), want) {
			t.Errorf("the preamble to the https endpoint offering %q: answered %q, want %q...", protos, got, want)
		}
	}
	if n := e.obs.get("sessions"); n != 1 {
		t.Errorf("%d sessions, want the endpoint's agent's alone", n)
	}
}

// TestTLSAgentsTurnedOff: with NoAgentsOnTLS, or without a certificate,
// the TLS port takes the agent protocol for any other: a hello offering
// it for a name with no endpoint, or none, is closed before the
// ServerHello, and one for an https endpoint's name is refused for want
// of a common protocol. An agent there fails saying it found no agent
// port, while the agent port serves as ever.
func TestTLSAgentsTurnedOff(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		configure func(*edge.Server)
	}{
		{"NoAgentsOnTLS", func(s *edge.Server) { s.NoAgentsOnTLS = true }},
		{"no certificate", func(s *edge.Server) { s.Certificates = nil; s.ECHKeys = nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			agents := listen(t)
			e := startOnePortEdgeWith(t, agents, c.configure)
			https := len(e.srv.Certificates) > 0
			ac := &agent.Client{Addrs: []string{agents.Addr().String()}}
			defer ac.Close()
			if https {
				serveHTTP(t, ac, "https://web", echoInfo)
			} else {
				serveHTTP(t, ac, "http://web", echoInfo)
			}
			for _, name := range []string{"example.test", "127.0.0.1"} {
				conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", e.addr,
					&tls.Config{ServerName: name, RootCAs: e.pki.Pool, NextProtos: []string{wire.ALPN}})
				if !errors.Is(err, io.EOF) {
					if conn != nil {
						conn.Close()
					}
					t.Errorf("an agent hello for %s: %v, want the connection closed (EOF)", name, err)
				}
			}
			if https {
				a := e.agent(t, "web.example.test")
				_, err := a.Listen(listenCtx(t), "http://x")
				if !errors.Is(err, agent.ErrNotAgentPort) || !strings.Contains(err.Error(), "answered in HTTP over TLS") {
					t.Errorf("an agent dialling the https endpoint's name: %v, want ErrNotAgentPort finding HTTP over TLS", err)
				}
			}
			if n := e.obs.get("sessions"); n != 1 {
				t.Errorf("%d sessions, want the agent port's alone", n)
			}
		})
	}
}

// TestTLSAgentServedAsOnTheAgentPort: an agent on the TLS port goes
// through what one on the agent port does: its token is checked (refused
// when wrong), its identity owns its names (another's bind of them is
// refused) and the edge serves its endpoints.
func TestTLSAgentServedAsOnTheAgentPort(t *testing.T) {
	t.Parallel()
	e := startOnePortEdge(t, func(s *edge.Server) { s.Authenticate = tokens })
	wrong := e.agent(t, "example.test")
	wrong.Token = "mallory-token"
	if _, err := wrong.Listen(listenCtx(t), "http://x"); !errors.Is(err, agent.ErrUnauthorized) {
		t.Fatalf("a wrong token on the TLS port: %v, want ErrUnauthorized", err)
	}
	alice := e.agent(t, "example.test")
	alice.Token = "alice-token"
	serveHTTP(t, alice, "https://app", nameHandler("alice"))
	bob := e.agent(t, "")
	bob.Token = "bob-token"
	if _, err := bob.Listen(listenCtx(t), "https://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob binding alice's name: %v, want ErrNameTaken", err)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.pki.Pool},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://app.example.test/x")
	if body := readAll(t, resp, err); body != "alice /x" {
		t.Fatalf("the endpoint: %q", body)
	}
}

// TestShutdownEndsTLSAgentSessions: Shutdown waits for public connections
// to finish, not for agent sessions, which it ends: an agent session on
// the TLS port, though it came on a public listener, does not hold it up
// until its context ends.
func TestShutdownEndsTLSAgentSessions(t *testing.T) {
	t.Parallel()
	e := startOnePortEdge(t, nil)
	serveHTTP(t, e.agent(t, "example.test"), "https://app", nameHandler("app"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with an agent on the TLS port: %v", err)
	}
}

// watchedTally is a tally that tells of each change, for tests to wait on
// counts.
type watchedTally struct {
	tally
	changed chan struct{} // a token after each change
}

func newWatchedTally() *watchedTally { return &watchedTally{changed: make(chan struct{}, 1)} }

func (w *watchedTally) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *watchedTally) Session(d int)              { w.tally.Session(d); w.poke() }
func (w *watchedTally) Refused(reason edge.Reason) { w.tally.Refused(reason); w.poke() }

// await waits until the count k is want, and fails if it goes past it.
// (A minute without a change fails the test too, rather than hang it.)
func (w *watchedTally) await(t testing.TB, k string, want int64) {
	t.Helper()
	for {
		n := w.get(k)
		if n == want {
			return
		}
		if n > want {
			t.Fatalf("%s = %d, want %d", k, n, want)
		}
		select {
		case <-w.changed:
		case <-time.After(time.Minute):
			t.Fatalf("%s = %d after a minute without a change, want %d", k, n, want)
		}
	}
}

// agentHello returns the first flight of a TLS client offering the agent
// protocol, with no server name (an agent that dialled an address).
func agentHello(t testing.TB) []byte {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{wire.ALPN}}).Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, 16<<10)
	n, err := b.Read(buf)
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// flooder opens connections to the edge's TLS port, each made to do
// something by an attack, and tells when the edge closes them.
type flooder struct {
	t      testing.TB
	dial   func(context.Context, string, string) (net.Conn, error)
	addr   string
	mu     sync.Mutex
	conns  []net.Conn
	closed chan net.Conn // each conn the edge closed, with what it read
	reads  sync.Map      // net.Conn -> []byte: what each read before its end
}

// newFlooder returns a flooder of the edge at addr, whose conns dial
// opens (nil: a net.Dialer's).
func newFlooder(t testing.TB, addr string, dial func(context.Context, string, string) (net.Conn, error)) *flooder {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	f := &flooder{t: t, dial: dial, addr: addr, closed: make(chan net.Conn, 1024)}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	})
	return f
}

// open opens n connections and runs attack on each; attack returns the
// conn to read until its end.
func (f *flooder) open(n int, attack func(net.Conn) net.Conn) {
	f.t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		raw, err := f.dial(ctx, "tcp", f.addr)
		cancel()
		if err != nil {
			f.t.Fatal(err)
		}
		f.mu.Lock()
		f.conns = append(f.conns, raw)
		f.mu.Unlock()
		c := attack(raw)
		go func() {
			var got bytes.Buffer
			io.Copy(&got, c)
			f.reads.Store(raw, got.Bytes())
			f.closed <- raw
		}()
	}
}

// awaitClosed waits for n more conns to be closed by the edge, and
// returns what each read.
func (f *flooder) awaitClosed(n int) [][]byte {
	f.t.Helper()
	var got [][]byte
	for range n {
		select {
		case c := <-f.closed:
			b, _ := f.reads.Load(c)
			got = append(got, b.([]byte))
		case <-time.After(time.Minute):
			f.t.Fatalf("%d of %d connections closed by the edge after a minute without one", len(got), n)
		}
	}
	return got
}

// closeAll closes every conn of the flood.
func (f *flooder) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// TestTLSAgentFloodBounded: floods of connections to the TLS port that
// offer the agent protocol and never become sessions are bounded as the
// agent port's are: those that stop in their handshake (the ClientHello
// then silence) and those that stop after it (no session preamble) count
// among the pending sessions, and past Limits.PendingSessions the oldest
// is closed: with 3x the bound open, exactly 2x the bound are closed, as
// ReasonPendingLimit, so never more than the bound are held. A real agent
// then connects during the flood (and pushes out one more). Those that
// send garbage after the handshake are closed at once, having read
// nothing after it.
func TestTLSAgentFloodBounded(t *testing.T) {
	t.Parallel()
	const bound = 16
	hello := agentHello(t)
	for _, c := range []struct {
		name   string
		attack func(*onePortEdge) func(net.Conn) net.Conn
	}{
		{"silent in the handshake", func(*onePortEdge) func(net.Conn) net.Conn {
			return func(c net.Conn) net.Conn { c.Write(hello); return c }
		}},
		{"silent after the handshake", func(e *onePortEdge) func(net.Conn) net.Conn {
			return func(c net.Conn) net.Conn {
				tc := tls.Client(c, &tls.Config{RootCAs: e.pki.Pool, ServerName: "example.test", NextProtos: []string{wire.ALPN}})
				if err := tc.Handshake(); err != nil {
					t.Fatalf("handshake: %v", err)
				}
				return tc
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := startOnePortEdge(t, func(s *edge.Server) {
				s.Limits = edge.Limits{PendingSessions: bound, HandshakesPerSource: -1}
				s.Timeouts = edge.Timeouts{Handshake: time.Hour} // nothing ends for want of time
			})
			f := newFlooder(t, e.addr, nil)
			f.open(3*bound, c.attack(e))
			f.awaitClosed(2 * bound)
			e.obs.await(t, "refused/"+string(edge.ReasonPendingLimit), 2*bound)

			serveHTTP(t, e.agent(t, "example.test"), "https://app", nameHandler("app"))
			f.awaitClosed(1)
			e.obs.await(t, "refused/"+string(edge.ReasonPendingLimit), 2*bound+1)
			if n := e.obs.get("sessions"); n != 1 {
				t.Errorf("%d sessions, want the real agent's", n)
			}
		})
	}
	// A handshake that fails (the client does not trust the edge) ends
	// the connection's place among the pending sessions: were it kept,
	// every failed handshake would hold a place until pushed out. Each
	// connection took its place before the edge sent its certificate,
	// so the count is settled once the last client saw it.
	t.Run("failed handshakes", func(t *testing.T) {
		e := startOnePortEdge(t, func(s *edge.Server) {
			s.Limits = edge.Limits{PendingSessions: bound, HandshakesPerSource: -1}
		})
		for range 3 * bound {
			c, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			tc := tls.Client(c, &tls.Config{ServerName: "example.test", NextProtos: []string{wire.ALPN}})
			if err := tc.Handshake(); err == nil {
				t.Fatal("a client that trusts no one completed its handshake")
			}
			c.Close()
		}
		if n := e.obs.get("refused/" + string(edge.ReasonPendingLimit)); n != 0 {
			t.Errorf("%d pending sessions pushed out by %d failed handshakes, want none", n, 3*bound)
		}
		serveHTTP(t, e.agent(t, "example.test"), "https://app", nameHandler("app"))
	})
	t.Run("garbage after the handshake", func(t *testing.T) {
		e := startOnePortEdge(t, func(s *edge.Server) {
			s.Limits = edge.Limits{PendingSessions: bound, HandshakesPerSource: -1}
			s.Timeouts = edge.Timeouts{Handshake: time.Hour}
		})
		f := newFlooder(t, e.addr, nil)
		f.open(3*bound, func(c net.Conn) net.Conn {
			tc := tls.Client(c, &tls.Config{RootCAs: e.pki.Pool, ServerName: "example.test", NextProtos: []string{wire.ALPN}})
			if err := tc.Handshake(); err != nil {
				t.Fatalf("handshake: %v", err)
			}
			io.WriteString(tc, "GET / HTTP/1.1\r\nHost: example.test\r\n\r\n")
			return tc
		})
		for _, got := range f.awaitClosed(3 * bound) {
			if len(got) > 0 {
				t.Fatalf("a connection that sent garbage read %q", got)
			}
		}
		if n := e.obs.get("refused/" + string(edge.ReasonPendingLimit)); n != 0 {
			t.Errorf("%d pending sessions pushed out, want none: garbage ends at once", n)
		}
		serveHTTP(t, e.agent(t, "example.test"), "https://app", nameHandler("app"))
	})
}

// TestTLSAgentHandshakesPerSource: one source's agent hellos that stop
// in their handshake hold at most Limits.HandshakesPerSource handshakes;
// its further connections wait for one of them to end (see
// TestHandshakesPerSource), none refused; an agent from another source
// connects meanwhile; once the flood ends, an agent from its source
// connects too. The sources are those a load balancer names in PROXY
// protocol headers, as for any client of the TLS port.
func TestTLSAgentHandshakesPerSource(t *testing.T) {
	t.Parallel()
	const bound = 8
	e := startOnePortEdge(t, func(s *edge.Server) {
		s.Limits = edge.Limits{HandshakesPerSource: bound}
		s.Timeouts = edge.Timeouts{Handshake: time.Hour}
		s.ProxyProtocolFrom = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	dialFrom := func(src string) func(context.Context, string, string) (net.Conn, error) {
		return func(ctx context.Context, _, addr string) (net.Conn, error) { return dialAs(ctx, addr, src) }
	}
	flood, other := dialFrom("198.51.100.7:40000"), dialFrom("203.0.113.9:40000")
	hello := agentHello(t)
	f := newFlooder(t, e.addr, flood)
	f.open(3*bound, func(c net.Conn) net.Conn { c.Write(hello); return c })

	a := e.agent(t, "example.test")
	a.DialContext = other
	serveHTTP(t, a, "https://other", nameHandler("other"))

	f.closeAll()
	b := e.agent(t, "example.test")
	b.DialContext = flood
	serveHTTP(t, b, "https://flood", nameHandler("flood"))
	if n := e.obs.get("sessions"); n != 2 {
		t.Errorf("%d sessions, want 2", n)
	}
	if n := e.obs.get("refused/" + string(edge.ReasonHandshakeLimit)); n != 0 {
		t.Errorf("%d connections refused as %s, want none: they wait", n, edge.ReasonHandshakeLimit)
	}
}

// TestAgentHandshakesTakeTurns: with Limits.Handshakes at 1, agents on
// both ports connect one after another while clients that sent a whole
// ClientHello and stalled, or half of one, wait with their handshakes
// unfinished for an hour: a handshake holds its turn only while the edge
// computes its answer, never while it waits for its client. Were a turn
// held until the handshake ends, the first stalled client would hold the
// only one, and no agent would connect.
func TestAgentHandshakesTakeTurns(t *testing.T) {
	t.Parallel()
	agentsLn := listen(t)
	e := startOnePortEdgeWith(t, agentsLn, func(s *edge.Server) {
		s.AgentTLS = &tls.Config{Certificates: s.Certificates}
		s.Limits = edge.Limits{Handshakes: 1}
		s.Timeouts = edge.Timeouts{Handshake: time.Hour}
	})
	hello := agentHello(t)
	for _, addr := range []string{e.addr, agentsLn.Addr().String()} {
		f := newFlooder(t, addr, nil)
		f.open(10, func(c net.Conn) net.Conn { c.Write(hello); return c })
		f.open(10, func(c net.Conn) net.Conn { c.Write(hello[:len(hello)/2]); return c })
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			a := e.agent(t, "example.test")
			if i%2 == 1 {
				a.Addrs = []string{agentsLn.Addr().String()}
			}
			name := fmt.Sprintf("turn%d", i)
			serveHTTP(t, a, "http://"+name, nameHandler(name))
		})
	}
	wg.Wait()
	if n := e.obs.get("sessions"); n != 6 {
		t.Errorf("%d sessions, want 6", n)
	}
}
