package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// An agent pointed at something other than an edge's agent port, as it
// speaks to it, says what answered, and gives up at once: waiting would
// not help. The setup's context is generous, and none of these waits for
// it: a misjudged failure would be tried again until the context ends.

// listenOnce returns an error of c.Listen within a minute.
func listenOnce(t *testing.T, c *agent.Client) error {
	t.Helper()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := c.Listen(ctx, "app")
	if err == nil {
		l.Close()
		t.Fatal("Listen succeeded")
	}
	if ctx.Err() != nil {
		t.Fatalf("Listen waited for the setup's context: %v", err)
	}
	return err
}

// TestHTTPPortRecognised points the agent at an edge's public HTTP port,
// which waits an hour for a request line (its handshake timeout): a probe
// with a request of its own tells that an HTTP server listens there.
func TestHTTPPortRecognised(t *testing.T) {
	t.Parallel()
	e := startHTTPEdge(t, &edge.Server{Timeouts: edge.Timeouts{Handshake: time.Hour}})
	addr := "127.0.0.1:" + e.http
	err := listenOnce(t, &agent.Client{Addrs: []string{addr}})
	if want := "agent: not an edge's agent port: " + addr + ` answered in HTTP ("HTTP/1.`; !errors.Is(err, agent.ErrNotAgentPort) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "it may be the edge's public HTTP port") {
		t.Errorf("agent on the edge's HTTP port: %v\nwant ErrNotAgentPort, starting %s... and naming the public HTTP port", err, want)
	}
}

// TestHTTPSPortRecognised points a TLS agent at an HTTPS server, which
// waits for a request line inside TLS.
func TestHTTPSPortRecognised(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ReadHeaderTimeout = time.Hour
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	addr := srv.Listener.Addr().String()
	err := listenOnce(t, &agent.Client{Addrs: []string{addr}, TLSConfig: &tls.Config{RootCAs: roots}})
	if want := "agent: not an edge's agent port: " + addr + ` answered in HTTP over TLS ("HTTP/1.`; !errors.Is(err, agent.ErrNotAgentPort) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("TLS agent on an HTTPS port: %v\nwant ErrNotAgentPort, starting %s", err, want)
	}
}

// TestTLSEdgeRecognised points a plaintext agent at an edge that speaks
// TLS on its agent port, which closes the connection without a word
// (crypto/tls), and at a TLS server that answers with an alert (as
// OpenSSL does); then a TLS agent at a plaintext edge, which closes the
// connection on the ClientHello.
func TestTLSEdgeRecognised(t *testing.T) {
	ca := testpki.New(t)
	tlsEdge := startHTTPEdge(t, &edge.Server{AgentTLS: &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")}}})
	alerting := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		io.ReadFull(c, make([]byte, 5))
		c.Write([]byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46}) // fatal, protocol_version
	})
	for _, addr := range []string{tlsEdge.agents, alerting} {
		err := listenOnce(t, &agent.Client{Addrs: []string{addr}, Plaintext: true})
		if want := "agent: the edge expects TLS: " + addr + " answered in TLS, and the agent spoke plaintext to it"; !errors.Is(err, agent.ErrTLSExpected) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("plaintext agent on %s: %v\nwant ErrTLSExpected, starting %s", addr, err, want)
		}
	}

	plain := startHTTPEdge(t, nil)
	err := listenOnce(t, &agent.Client{Addrs: []string{plain.agents}, TLSConfig: &tls.Config{RootCAs: ca.Pool}})
	if want := "agent: the edge expects plaintext: " + plain.agents + " answered a plaintext session preamble, and the agent spoke TLS to it"; !errors.Is(err, agent.ErrPlaintextExpected) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("TLS agent on a plaintext edge: %v\nwant ErrPlaintextExpected, starting %s", err, want)
	}
}

// TestOtherServerRecognised points the agent at a server that speaks
// first, as SSH does.
func TestOtherServerRecognised(t *testing.T) {
	addr := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		io.WriteString(c, "SSH-2.0-OpenSSH_9.9\r\n")
		io.Copy(io.Discard, c)
	})
	err := listenOnce(t, &agent.Client{Addrs: []string{addr}})
	// The answer is quoted as far as it came in the first read: up to the
	// preamble's 8 bytes.
	if want := "agent: not an edge's agent port: " + addr + ` answered "S`; !errors.Is(err, agent.ErrNotAgentPort) || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), `", which starts no tunnelkit session`) {
		t.Errorf("agent on an SSH server: %v\nwant %s...\", which starts no tunnelkit session", err, want)
	}
}

// TestALPNRefusalRecognised points a TLS agent at a TLS server that
// selects protocols by ALPN, none of them the agent's and none HTTP (an
// edge's public TLS port without agents refuses so too): the agent, which
// offers the agent protocol alone whatever its TLSConfig's NextProtos,
// says the address refused it.
func TestALPNRefusalRecognised(t *testing.T) {
	ca := testpki.New(t)
	offered := make(chan []string, 4)
	ln := tls.NewListener(testnet.Listen(t), &tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "127.0.0.1")},
		NextProtos:   []string{"imap"},
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			select {
			case offered <- h.SupportedProtos:
			default:
			}
			return nil, nil
		},
	})
	addr := testnet.Serve(t, ln, func(c net.Conn) { c.(*tls.Conn).Handshake() })
	err := listenOnce(t, &agent.Client{Addrs: []string{addr}, TLSConfig: &tls.Config{RootCAs: ca.Pool, NextProtos: []string{"h2"}}})
	if want := "agent: not an edge's agent port: " + addr + " refused the agent protocol (ALPN tunnelkit/1) in its TLS handshake"; !errors.Is(err, agent.ErrNotAgentPort) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("TLS agent on a server refusing its ALPN: %v\nwant ErrNotAgentPort, starting %s", err, want)
	}
	if got := <-offered; len(got) != 1 || got[0] != "tunnelkit/1" {
		t.Errorf("the agent offered %q, want [tunnelkit/1]", got)
	}
}
