package edge_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/sni"
)

const echPublicName = "public.example.test"

// echEdge starts an https edge holding one ECH key for echPublicName, and
// returns it with the key's ECHConfigList.
func echEdge(t testing.TB) (*httpsEdge, []byte) {
	t.Helper()
	return echEdgeFor(t, echPublicName, nil)
}

// echEdgeFor starts an https edge holding one ECH key for publicName,
// configured by configure, and returns it with the key's ECHConfigList.
func echEdgeFor(t testing.TB, publicName string, configure func(*edge.Server)) (*httpsEdge, []byte) {
	t.Helper()
	key, list, err := sni.NewECHKey(publicName)
	if err != nil {
		t.Fatal(err)
	}
	e := startHTTPSEdge(t, func(s *edge.Server) {
		s.ECHKeys = []tls.EncryptedClientHelloKey{key}
		if configure != nil {
			configure(s)
		}
	})
	return e, list
}

// appHello is what a TLS app saw of a connection: whether the hello it
// got carried the encrypted_client_hello extension (in split mode, the
// inner one), and the state after the handshake.
type appHello struct {
	ech   bool
	state tls.ConnectionState
}

// tlsApp binds url with an agent of its own and serves TLS on it with a
// certificate for name from ca, holding no ECH key, configured by
// configure; what it saw of each connection goes to seen, and the app
// answers "name: " and what it read.
func tlsApp(t testing.TB, e *httpsEdge, url, name string, ca *testpki.CA, configure func(*tls.Config), seen chan<- appHello) *atomic.Int32 {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, name)}}
	if configure != nil {
		configure(cfg)
	}
	var conns atomic.Int32
	go func() {
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				var ech bool
				c := cfg.Clone()
				c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
					ech = slices.Contains(h.Extensions, 0xfe0d)
					return nil, nil
				}
				conn := tls.Server(raw, c)
				defer conn.Close()
				if err := conn.Handshake(); err != nil {
					return
				}
				if seen != nil {
					seen <- appHello{ech, conn.ConnectionState()}
				}
				buf := make([]byte, 64)
				n, _ := conn.Read(buf)
				io.WriteString(conn, name+": "+string(buf[:n]))
			}()
		}
	}()
	return &conns
}

// echDial connects to the edge's TLS port as serverName with ECH configs,
// sends "ping" and returns the answer and the connection state.
func echDial(e *httpsEdge, serverName string, configs []byte, roots *tls.Config) (string, tls.ConnectionState, error) {
	cfg := roots.Clone()
	cfg.ServerName = serverName
	cfg.EncryptedClientHelloConfigList = configs
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", e.tlsAddr, cfg)
	if err != nil {
		return "", tls.ConnectionState{}, err
	}
	defer conn.Close()
	io.WriteString(conn, "ping")
	b, err := io.ReadAll(conn)
	return string(b), conn.ConnectionState(), err
}

// TestECHSplitMode: a client using ECH reaches the tls endpoint of the
// inner name, whose keyless crypto/tls server completes the handshake: the
// client has ECH accepted and the inner name's certificate, and the app's
// server got the inner hello (Go 1.26's server does not set ECHAccepted as
// a split-mode backend, only when it decrypts itself: the inner
// encrypted_client_hello extension in the hello it got is the proof).
func TestECHSplitMode(t *testing.T) {
	t.Parallel()
	for _, hrr := range []bool{false, true} {
		name := map[bool]string{false: "direct", true: "HelloRetryRequest"}[hrr]
		t.Run(name, func(t *testing.T) {
			e, configs := echEdge(t)
			ca := testpki.New(t)
			seen := make(chan appHello, 1)
			configure := func(c *tls.Config) {
				if hrr {
					// Go clients send X25519MLKEM768 and X25519 shares:
					// a server that takes only P-256 must ask again.
					c.CurvePreferences = []tls.CurveID{tls.CurveP256}
				}
			}
			tlsApp(t, e, "tls://secret.example.test", "secret.example.test", ca, configure, seen)

			got, cs, err := echDial(e, "secret.example.test", configs, &tls.Config{RootCAs: ca.Pool})
			if err != nil {
				t.Fatal(err)
			}
			if got != "secret.example.test: ping" {
				t.Errorf("answer %q", got)
			}
			if !cs.ECHAccepted || cs.PeerCertificates[0].Subject.CommonName != "secret.example.test" {
				t.Errorf("client: ECHAccepted %v, certificate for %q", cs.ECHAccepted, cs.PeerCertificates[0].Subject.CommonName)
			}
			if hrr && cs.CurveID != tls.CurveP256 {
				t.Errorf("curve %v: the backend did not force a HelloRetryRequest", cs.CurveID)
			}
			select {
			case app := <-seen:
				if !app.ech || app.state.ServerName != "secret.example.test" {
					t.Errorf("the app's server got a hello for %q with the ECH extension %v; want the inner hello", app.state.ServerName, app.ech)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the app saw no handshake")
			}
		})
	}
}

// TestECHStaleConfigGetsRetryConfigs: a client with a configuration the
// edge has no key for (an old key) reaches the edge's public name, which
// nobody bound: the edge completes the handshake as the client-facing
// server with its own certificate and sends its current configuration,
// with which the client then succeeds.
func TestECHStaleConfigGetsRetryConfigs(t *testing.T) {
	t.Parallel()
	e, _ := echEdge(t)
	ca := testpki.New(t)
	tlsApp(t, e, "tls://secret.example.test", "secret.example.test", ca, nil, nil)
	_, stale, err := sni.NewECHKey(echPublicName)
	if err != nil {
		t.Fatal(err)
	}
	roots := e.pki.Pool.Clone()
	roots.AppendCertsFromPEM(ca.PEM)
	_, _, err = echDial(e, "secret.example.test", stale, &tls.Config{RootCAs: roots})
	var rej *tls.ECHRejectionError
	if !errors.As(err, &rej) || len(rej.RetryConfigList) == 0 {
		t.Fatalf("stale config: %v, want an ECHRejectionError with retry configs", err)
	}
	got, cs, err := echDial(e, "secret.example.test", rej.RetryConfigList, &tls.Config{RootCAs: roots})
	if err != nil || got != "secret.example.test: ping" || !cs.ECHAccepted {
		t.Fatalf("with the retry configs: %q, ECHAccepted %v, %v", got, cs.ECHAccepted, err)
	}
}

// deepPublicName is a public name with a name of its own above it under
// the domain, so that a tenant's wildcard could cover it without being a
// catch-all.
const deepPublicName = "ech.edge.example.test"

// TestECHPublicNameIsTheOperators: the public name of the edge's ECH keys
// is the operator's, with its tree: no agent binds it, over any protocol,
// nor a name above it (a wildcard over it, a catch-all even where they are
// allowed) or under it, and the refusal says why. Its neighbours are free.
func TestECHPublicNameIsTheOperators(t *testing.T) {
	t.Parallel()
	e, _ := echEdgeFor(t, deepPublicName, func(s *edge.Server) { s.AllowCatchAll = true })
	for _, url := range []string{
		"tls://" + deepPublicName,
		"https://" + deepPublicName,
		"http://" + deepPublicName,
		"tls://ECH.Edge.Example.Test.",
		"tls://*.edge.example.test",
		"https://*.edge.example.test",
		"http://edge.example.test",
		"tls://x." + deepPublicName,
		"https://*." + deepPublicName,
		"http://*",
		"tls://*.example.test",
	} {
		c := &agent.Client{Addrs: []string{e.agentAddr}}
		_, err := c.Listen(context.Background(), url)
		c.Close()
		if !errors.Is(err, agent.ErrNameTaken) || !strings.Contains(err.Error(), deepPublicName) || !strings.Contains(err.Error(), "Encrypted ClientHello") {
			t.Errorf("binding %s: %v; want ErrNameTaken saying it overlaps the public name %s", url, err, deepPublicName)
		}
	}
	for _, url := range []string{
		"tls://other.edge.example.test",
		"https://*.other.edge.example.test",
		"http://app",
		"http://", // random names
	} {
		c := &agent.Client{Addrs: []string{e.agentAddr}}
		if _, err := c.Listen(context.Background(), url); err != nil {
			t.Errorf("binding %s beside the public name: %v", url, err)
		}
		c.Close()
	}
}

// TestECHStaleConfigWhileATenantHoldsAWildcardOverThePublicName: a
// client whose ECH configuration is stale shows the edge's public name in
// clear; while a tenant holds a wildcard over that name (bound, as a Router
// shared by edges may hold one, by an edge without these keys or before
// them), the client still gets its retry configurations from the edge and
// then reaches its own endpoint; a client without ECH for the public name
// reaches the edge too; the tenant's app gets nothing.
func TestECHStaleConfigWhileATenantHoldsAWildcardOverThePublicName(t *testing.T) {
	t.Parallel()
	rt := &router.MemoryRouter{}
	ca := testpki.New(t)
	e, _ := echEdgeFor(t, deepPublicName, func(s *edge.Server) {
		s.Router = rt
		s.Certificates = append(s.Certificates, ca.Issue(t, deepPublicName)) // the edge's, for its public name
	})
	tlsApp(t, e, "tls://secret.example.test", "secret.example.test", ca, nil, nil)
	hijacker := tlsApp(t, e, "tls://app.example.test", deepPublicName, ca, nil, nil)
	holdOverPublicName(t, rt, "app.example.test")

	_, stale, err := sni.NewECHKey(deepPublicName)
	if err != nil {
		t.Fatal(err)
	}
	roots := e.pki.Pool.Clone()
	roots.AppendCertsFromPEM(ca.PEM)
	_, _, err = echDial(e, "secret.example.test", stale, &tls.Config{RootCAs: roots})
	var rej *tls.ECHRejectionError
	if !errors.As(err, &rej) || len(rej.RetryConfigList) == 0 {
		t.Fatalf("stale config: %v, want an ECHRejectionError with retry configs", err)
	}
	got, cs, err := echDial(e, "secret.example.test", rej.RetryConfigList, &tls.Config{RootCAs: roots})
	if err != nil || got != "secret.example.test: ping" || !cs.ECHAccepted {
		t.Fatalf("with the retry configs: %q, ECHAccepted %v, %v", got, cs.ECHAccepted, err)
	}
	// A client without ECH that names the public name reaches the edge
	// too.
	plain, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", e.tlsAddr, &tls.Config{ServerName: deepPublicName, RootCAs: roots})
	if err != nil {
		t.Fatalf("plain TLS to the public name: %v", err)
	}
	plain.Close()
	if n := hijacker.Load(); n != 0 {
		t.Errorf("the tenant holding *.edge.example.test got %d connections for the public name", n)
	}
	// And the edge itself refuses that wildcard to an agent.
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	defer c.Close()
	if _, err := c.Listen(context.Background(), "tls://*.edge.example.test"); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("binding the wildcard over the public name: %v, want ErrNameTaken", err)
	}
}

// holdOverPublicName gives the tenant's tls route of name a twin in rt
// under *.edge.example.test, a wildcard over deepPublicName, as a Router
// shared by edges may hold one (bound by an edge without the ECH keys, or
// before them): the edge refuses it to agents.
func holdOverPublicName(t testing.TB, rt *router.MemoryRouter, name string) {
	t.Helper()
	routes, err := rt.Lookup(context.Background(), wire.ProtoTLS, name)
	if err != nil || len(routes) != 1 {
		t.Fatalf("the tenant's route: %v, %v", routes, err)
	}
	wildcard := routes[0]
	wildcard.Name = "*.edge.example.test"
	if err := rt.Bind(context.Background(), wildcard); err != nil {
		t.Fatal(err)
	}
}

// TestECHChromiumGREASEForThePublicName: Chromium, which sends GREASE ECH
// on every connection, loading a page of the public name while a tenant
// holds a wildcard over it, reaches the edge itself (which has no page
// there), never the tenant.
func TestECHChromiumGREASEForThePublicName(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "chromium")
	rt := &router.MemoryRouter{}
	ca := testpki.New(t)
	edgeCert := ca.Issue(t, deepPublicName)
	e, _ := echEdgeFor(t, deepPublicName, func(s *edge.Server) {
		s.Router = rt
		s.Certificates = append(s.Certificates, edgeCert)
	})
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	tenantCert := ca.Issue(t, deepPublicName, "app.example.test")
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	tl, err := c.Listen(context.Background(), "tls://app.example.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go http.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{tenantCert}}), protocolPage("tenant"))
	holdOverPublicName(t, rt, "app.example.test")

	dom := chromium(t, "https://"+deepPublicName+":"+tlsPort+"/")
	if strings.Contains(dom, "page=tenant") || !strings.Contains(dom, "no_endpoint") {
		t.Errorf("Chromium at the public name: want the edge's own answer (no_endpoint), not the tenant's page; DOM:\n%s", dom)
	}
}

// TestECHPublicNameAtOrAboveTheDomain: a public name that is the edge's
// domain, or above it, would make every name the operator's: the Server
// refuses to start.
func TestECHPublicNameAtOrAboveTheDomain(t *testing.T) {
	t.Parallel()
	for _, public := range []string{"apps.example.test", "example.test"} {
		key, _, err := sni.NewECHKey(public)
		if err != nil {
			t.Fatal(err)
		}
		srv := &edge.Server{Domain: "apps.example.test", ECHKeys: []tls.EncryptedClientHelloKey{key}}
		err = srv.Start(edge.Listeners{TLS: listen(t)})
		if err == nil || !strings.Contains(err.Error(), "public name "+public) {
			t.Errorf("public name %s: Start: %v, want a refusal naming it", public, err)
		}
	}
}

// TestECHHTTPSEndpoint: an https endpoint, terminated at the edge, takes
// ECH through crypto/tls with the same keys.
func TestECHHTTPSEndpoint(t *testing.T) {
	t.Parallel()
	e, configs := echEdge(t)
	e.serve(t, agent.Endpoint{URL: "https://app"}, echoInfo)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.tlsAddr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.pki.Pool, EncryptedClientHelloConfigList: configs},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://app.example.test/ech")
	if err != nil {
		t.Fatal(err)
	}
	body := mustRead(t)(resp, nil)
	if !resp.TLS.ECHAccepted || !strings.Contains(body, "path=/ech") {
		t.Fatalf("ECHAccepted %v, body %q", resp.TLS.ECHAccepted, body)
	}
}

// TestECHEdgeStillRoutesGREASEAndPlainClients: on an edge with ECH keys,
// Chromium (which sends GREASE ECH) and curl reach a tls endpoint by their
// server name, as before.
func TestECHEdgeStillRoutesGREASEAndPlainClients(t *testing.T) {
	t.Parallel()
	testtools.Need(t, "chromium", "curl")
	e, _ := echEdge(t)
	_, tlsPort, _ := net.SplitHostPort(e.tlsAddr)
	appCA := testpki.New(t)
	appCert := appCA.Issue(t, "pass.example.test")
	c := &agent.Client{Addrs: []string{e.agentAddr}}
	tl, err := c.Listen(context.Background(), "tls://pass.example.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go http.Serve(tls.NewListener(tl, &tls.Config{Certificates: []tls.Certificate{appCert}, NextProtos: []string{"h2", "http/1.1"}}), protocolPage("pass"))

	url := "https://pass.example.test:" + tlsPort + "/"
	if dom := chromium(t, url); !strings.Contains(dom, "page=pass proto=h2") {
		t.Errorf("Chromium: DOM:\n%s", dom)
	}
	ca := t.TempDir() + "/ca.pem"
	if err := writeFile(ca, appCA.PEM); err != nil {
		t.Fatal(err)
	}
	out, err := runCommand("curl", "-sS", "--max-time", "20", "--cacert", ca, "--resolve", "pass.example.test:"+tlsPort+":127.0.0.1", url)
	if err != nil || !strings.Contains(out, "page=pass") {
		t.Errorf("curl: %v\n%s", err, out)
	}
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o600) }

func runCommand(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
