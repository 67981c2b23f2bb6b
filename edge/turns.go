package edge

import (
	"crypto/tls"
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// Agents' TLS handshakes computed in turn (Limits.Handshakes). A handshake
// takes its turn once its ClientHello was read whole (GetConfigForClient)
// and gives it back when the edge writes its answer, or when its conn
// closes: a turn covers the edge's work on the handshake (its key shares,
// its signature), never a wait for the agent, so that a client that sends
// half a handshake and stalls holds none.

// errNoTurn fails a handshake whose turn did not come before its deadline.
var errNoTurn = errors.New("edge: too many agent handshakes under way: this one's turn did not come within the handshake timeout")

// turnConn is an agent's conn whose TLS handshake takes a turn.
type turnConn struct {
	net.Conn
	s        *Server
	deadline time.Time // of the handshake: waiting for a turn past it is pointless
	held     atomic.Bool
}

// turnTLS wraps c, an agent's conn about to be served TLS with cfg, and
// returns it with the configuration that takes its turn.
func (s *Server) turnTLS(c net.Conn, cfg *tls.Config) (*turnConn, *tls.Config) {
	tc := &turnConn{Conn: c, s: s, deadline: time.Now().Add(s.cfg().handshake)}
	if s.cfg().handshake <= 0 {
		tc.deadline = time.Now().Add(DefaultHandshakeTimeout)
	}
	cfg = cfg.Clone()
	next := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		if err := tc.take(); err != nil {
			return nil, err
		}
		if next != nil {
			return next(hello)
		}
		return nil, nil
	}
	return tc, cfg
}

// take waits for the handshake's turn.
func (c *turnConn) take() error {
	c.s.turns.SetMax(c.s.cfg().handshakes) // it may have changed (Reconfigure)
	if !c.s.turns.Acquire(c.deadline, c.s.stopping) {
		return errNoTurn
	}
	c.held.Store(true)
	if time.Now().After(c.deadline) { // its agent has given up
		c.done()
		return errNoTurn
	}
	return nil
}

// done gives the turn back, if the conn holds it.
func (c *turnConn) done() {
	if c.held.Load() && c.held.Swap(false) {
		c.s.turns.Release()
	}
}

func (c *turnConn) Write(p []byte) (int, error) {
	c.done() // the edge's answer: its work on the handshake is done
	return c.Conn.Write(p)
}

func (c *turnConn) Close() error {
	c.done()
	return c.Conn.Close()
}
