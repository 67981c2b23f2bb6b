package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// What answered, when an attempt to open a session did not find an edge's
// agent port where it looked: an HTTP server (most often the edge's own
// public port), a TLS server to a client speaking plaintext, a plaintext
// edge to a client speaking TLS. Such an attempt fails with ErrNotAgentPort,
// ErrTLSExpected or ErrPlaintextExpected, which say what to change, rather
// than with the bytes that broke the preamble; trying again would not help.
//
// The first bytes of the answer tell most cases at once. Two cases need a
// probe, a connection of its own to the same address (through the same
// proxy), which sends no token: an HTTP server answers nothing until it has
// a request line, so an attempt still unanswered after probeAfter sends
// one a HEAD request; and a Go TLS server closes a plaintext connection
// without a word, so a plaintext attempt closed before the edge's first
// byte tries a TLS handshake (and, the other way round, a TLS attempt
// closed during its handshake sends a plaintext preamble).

// probeAfter is how long an attempt waits for its session to open before
// it probes the address: an edge answers the preamble at once.
const probeAfter = 2 * time.Second

// probeTimeout bounds a probe.
const probeTimeout = 3 * time.Second

// watcher probes the address of an attempt that is not answered within
// probeAfter. A probe that finds something other than an edge closes the
// attempt's connection, which ends the attempt, and keeps what it found.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the probing goroutine ends

	mu    sync.Mutex
	found error // what the probe found; nil: nothing, or no probe
}

// watch starts watching an attempt on conn, the transport to addr, within
// ctx. tlsCfg is the attempt's (nil: plaintext). The caller calls stop.
func (c *Client) watch(ctx context.Context, conn net.Conn, addr string, tlsCfg *tls.Config) *watcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTimer(probeAfter)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.log().Debug("the edge has not answered; probing what listens there", "edge", addr)
		if err := c.probeHTTP(ctx, addr, tlsCfg); err != nil {
			w.mu.Lock()
			w.found = err
			w.mu.Unlock()
			conn.Close()
		}
	}()
	return w
}

// stop ends the watch, waits for its probe, and returns what the probe
// found, if anything.
func (w *watcher) stop() error {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.found
}

// diagnose returns the error of an attempt on addr that failed with err:
// in its TLS handshake (handshake set) or in the session preamble. When
// the answer, or a probe, shows that addr is not an edge's agent port as
// the client speaks to it, the error says so; otherwise it is err, said
// as the agent's.
func (c *Client) diagnose(ctx context.Context, addr string, tlsCfg *tls.Config, handshake bool, err error) error {
	if found := c.recognise(ctx, addr, tlsCfg, handshake, err); found != nil {
		return found
	}
	var pe *wire.PreambleError
	switch {
	case errors.As(err, &pe) && len(pe.Got) == 0 && closedEarly(pe.Err):
		return fmt.Errorf("agent: the connection closed before the edge's session preamble (an edge that restarts, or limits this address, closes it so; so does a port that is not an edge's agent port): %w", pe.Err)
	case errors.As(err, &pe) && pe.Err != nil:
		return fmt.Errorf("agent: the edge's session preamble: %w", pe.Err)
	}
	return err
}

// recognise returns what the answer of a failed attempt, or a probe, tells
// of addr; nil when they tell nothing.
func (c *Client) recognise(ctx context.Context, addr string, tlsCfg *tls.Config, handshake bool, err error) error {
	var (
		rh tls.RecordHeaderError
		pe *wire.PreambleError
	)
	switch {
	case errors.As(err, &rh):
		// The answer to the ClientHello is not TLS.
		return notAgentPort(addr, rh.RecordHeader[:], false)
	case errors.As(err, &pe) && pe.Err == nil && strings.HasPrefix(string(pe.Got), "TKT"):
		// An edge, of another version or out of its mind.
		return &sentinelError{kind: ErrRefused, msg: fmt.Sprintf("%s answered a session preamble this agent does not take (%q)", addr, pe.Got)}
	case errors.As(err, &pe) && pe.Err == nil:
		// Bytes that are not a preamble.
		if tlsCfg == nil && looksTLS(pe.Got) {
			return tlsExpected(addr)
		}
		return notAgentPort(addr, pe.Got, tlsCfg != nil)
	case tlsCfg != nil && handshake && remoteAlert(err, alertNoApplicationProtocol):
		// A TLS server that selects protocols by ALPN, and not the
		// agent's: an HTTPS server, or an edge's public TLS port that
		// takes no agents.
		if found := c.probeHTTP(ctx, addr, tlsCfg); found != nil {
			return found
		}
		return &sentinelError{kind: ErrNotAgentPort, msg: fmt.Sprintf("%s refused the agent protocol (ALPN %s) in its TLS handshake: it may be an edge's public TLS port that takes no agents (edge.Server.NoAgentsOnTLS), or another TLS server", addr, wire.ALPN)}
	case ctx.Err() != nil || !closedEarly(err):
		return nil
	case tlsCfg == nil && errors.As(err, &pe) && len(pe.Got) == 0:
		// Closed before the first byte: a Go TLS server does that.
		if c.probeTLS(ctx, addr) {
			return tlsExpected(addr)
		}
	case tlsCfg != nil && handshake:
		// Closed during the handshake: a plaintext edge does that, having
		// read a ClientHello for a preamble.
		if c.probePlaintext(ctx, addr) {
			return &sentinelError{kind: ErrPlaintextExpected, msg: addr + " answered a plaintext session preamble, and the agent spoke TLS to it (Client.Plaintext speaks plaintext, for a private network only)"}
		}
	}
	return nil
}

// alertNoApplicationProtocol is the TLS alert of a server that selects
// protocols by ALPN and takes none of the client's (RFC 7301).
const alertNoApplicationProtocol tls.AlertError = 120

// remoteAlert reports whether err is the TLS alert a, sent by the peer.
// crypto/tls wraps a received alert in a net.OpError whose error reads as
// the alert does.
func remoteAlert(err error, a tls.AlertError) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error" && oe.Err != nil && oe.Err.Error() == a.Error()
}

// tlsExpected is the error of an attempt in plaintext on an edge that
// speaks TLS.
func tlsExpected(addr string) error {
	return &sentinelError{kind: ErrTLSExpected, msg: addr + " answered in TLS, and the agent spoke plaintext to it (Client.Plaintext is set, or the edge is on loopback and Client.TLSConfig is nil)"}
}

// notAgentPort is the error of an attempt whose answer began with got,
// which is not a preamble; overTLS: within TLS.
func notAgentPort(addr string, got []byte, overTLS bool) error {
	var msg string
	switch {
	case looksHTTP(got) && overTLS:
		msg = fmt.Sprintf("%s answered in HTTP over TLS (%q): it may be the edge's public TLS port", addr, got)
	case looksHTTP(got):
		msg = fmt.Sprintf("%s answered in HTTP (%q): it may be the edge's public HTTP port", addr, got)
	default:
		msg = fmt.Sprintf("%s answered %q, which starts no tunnelkit session", addr, got)
	}
	return &sentinelError{kind: ErrNotAgentPort, msg: msg}
}

// looksHTTP reports whether an answer begins as an HTTP response's.
func looksHTTP(got []byte) bool {
	const p = "HTTP/"
	n := min(len(got), len(p))
	return n > 0 && string(got[:n]) == p[:n]
}

// looksTLS reports whether an answer begins as a TLS record: an alert or
// a handshake message, of any TLS version.
func looksTLS(got []byte) bool {
	return len(got) > 0 && (got[0] == 0x15 || got[0] == 0x16) && (len(got) == 1 || got[1] == 0x03)
}

// probeDial opens a probe's connection to addr, within probeTimeout: it
// returns the probe's context, the conn, which is closed when that context
// ends, and done, which closes it and ends the context.
func (c *Client) probeDial(ctx context.Context, addr string) (context.Context, net.Conn, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	conn, err := c.dialEdge(ctx, addr)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return ctx, conn, func() {
		stop()
		conn.Close()
		cancel()
	}, nil
}

// probeHTTP sends a HEAD request to addr (over TLS when tlsCfg is set,
// whatever the certificate) and returns an ErrNotAgentPort error when an
// HTTP server answers; nil when something else does, or nothing.
func (c *Client) probeHTTP(ctx context.Context, addr string, tlsCfg *tls.Config) error {
	ctx, conn, done, err := c.probeDial(ctx, addr)
	if err != nil {
		return nil
	}
	defer done()
	if tlsCfg != nil {
		tc := tls.Client(conn, probeTLSConfig(tlsCfg.ServerName))
		var rh tls.RecordHeaderError
		if err := tc.HandshakeContext(ctx); errors.As(err, &rh) && looksHTTP(rh.RecordHeader[:]) {
			return notAgentPort(addr, rh.RecordHeader[:], false)
		} else if err != nil {
			return nil
		}
		conn = tc
	}
	if _, err := conn.Write([]byte("HEAD / HTTP/1.0\r\nUser-Agent: tunnelkit-agent (looking for an edge)\r\n\r\n")); err != nil {
		return nil
	}
	line, _ := bufio.NewReaderSize(conn, 128).ReadSlice('\n')
	line = []byte(strings.TrimRight(string(line), "\r\n"))
	if !strings.HasPrefix(string(line), "HTTP/") {
		return nil
	}
	return notAgentPort(addr, line[:min(len(line), 64)], tlsCfg != nil)
}

// probeTLS reports whether addr completes, or answers with an alert, a
// TLS handshake. It checks no certificate: it only asks whether TLS is
// spoken there, and sends nothing after the handshake.
func (c *Client) probeTLS(ctx context.Context, addr string) bool {
	ctx, conn, done, err := c.probeDial(ctx, addr)
	if err != nil {
		return false
	}
	defer done()
	host, _, _ := net.SplitHostPort(addr)
	err = tls.Client(conn, probeTLSConfig(host)).HandshakeContext(ctx)
	var alert tls.AlertError
	return err == nil || errors.As(err, &alert)
}

// probePlaintext reports whether addr answers a plaintext session
// preamble with one.
func (c *Client) probePlaintext(ctx context.Context, addr string) bool {
	_, conn, done, err := c.probeDial(ctx, addr)
	if err != nil {
		return false
	}
	defer done()
	if err := wire.WritePreamble(conn, wire.DefaultWindow); err != nil {
		return false
	}
	_, err = wire.ReadPreamble(conn)
	return err == nil
}

// probeTLSConfig is the configuration of a probe's TLS: it learns whether
// the peer speaks TLS, so any certificate will do.
func probeTLSConfig(serverName string) *tls.Config {
	return &tls.Config{ServerName: serverName, InsecureSkipVerify: true}
}
