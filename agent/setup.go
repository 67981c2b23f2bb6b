package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// How Listen waits for its edge: it opens the session if none is open and
// binds the endpoint, and tries again, with the backoff of reconnections,
// while the failures may pass (the edge not up yet, restarting, or unable
// to grant the endpoint for now), until it succeeds, a failure that
// waiting would not cure comes, or the setup's context ends.

// setup binds b: on the open session, or on one it opens first, to the
// next edge. A failure that may pass is tried again after the backoff
// (rounds of one attempt per edge, the first of a round after the wait,
// as reconnections go), logged, and told as a Reconnecting event; a
// permanent one (see permanent) ends it when its round has no edge left
// to try. When ctx ends, its error says so, and why the attempts failed.
func (c *Client) setup(ctx context.Context, b wire.Bind, edges []string) (*Listener, error) {
	// Close ends the wait, and an attempt under way.
	c.mu.Lock()
	c.initLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	var (
		bo       = c.newBackoff()
		attempts int
		round    = map[string]error{} // this round's failures, by edge
		latest   = map[string]error{} // each edge's latest failure
		order    []string             // the edges in latest, as they first failed
	)
	for {
		attempts++
		l, addr, bound, err := c.listenOnce(ctx, b, edges)
		if err == nil {
			return l, nil
		}
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			// The attempt may have failed at the deadline (a dial's i/o
			// timeout) before the context's own timer ended it: wait for
			// that, which is due, so that the context says why.
			select {
			case <-ctx.Done():
			case <-c.ctx.Done():
			}
		}
		if c.ctx.Err() != nil {
			return nil, fmt.Errorf("agent: %w", net.ErrClosed)
		}
		if bound && permanent(err) {
			return nil, err // the endpoint is refused for good
		}
		if ctx.Err() != nil && latest[addr] != nil {
			// The setup's context cut this attempt short: the edge's
			// previous answer says more than the deadline does.
			return nil, c.gaveUp(ctx, attempts, order, latest)
		}
		if _, ok := latest[addr]; !ok {
			order = append(order, addr)
		}
		latest[addr], round[addr] = err, err
		if ctx.Err() != nil {
			return nil, c.gaveUp(ctx, attempts, order, latest)
		}
		// A round ends with a bind not granted yet (the session is fine:
		// the endpoint waits), or once each edge failed.
		var delay time.Duration
		if bound || len(round) == len(edges) {
			if err := roundError(edges, round); err != nil {
				return nil, err // the caller tells it
			}
			clear(round)
			delay = bo.next()
		}
		// One line per failed attempt: what failed, and when the next
		// comes.
		next := addr
		if bound {
			c.log().Warn("endpoint not granted yet", "edge", addr, "err", err, "attempt", attempts, "retry_in", delay.Round(time.Millisecond))
		} else {
			next = c.nextEdge(edges)
			c.log().Warn("connecting to edge failed", "edge", addr, "err", err, "attempt", attempts, "retry_in", delay.Round(time.Millisecond))
		}
		c.emit(Event{Kind: Reconnecting, Attempt: attempts + 1, Delay: delay, Err: err, Addr: next})
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				if c.ctx.Err() != nil {
					return nil, fmt.Errorf("agent: %w", net.ErrClosed)
				}
				return nil, c.gaveUp(ctx, attempts, order, latest)
			}
		}
	}
}

// listenOnce binds b on the open session, or on one it opens to the next
// edge first, and returns the edge, and whether the failure, if any, is
// the bind's on an open session (bound).
func (c *Client) listenOnce(ctx context.Context, b wire.Bind, edges []string) (l *Listener, addr string, bound bool, err error) {
	mux, addr, err := c.session(ctx, edges)
	if err != nil {
		return nil, addr, false, err
	}
	c.binding.RLock()
	defer c.binding.RUnlock()
	resp, err := c.bind(ctx, mux, b)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, ErrUnavailable) && !permanent(err) {
			// The session broke: the next attempt opens another.
			mux.Close()
			return nil, addr, false, err
		}
		return nil, addr, true, err
	}
	l = &Listener{
		c:     c,
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
	}
	l.setBound(mux, b, resp)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, addr, true, fmt.Errorf("agent: %w", net.ErrClosed)
	}
	c.listeners[l] = struct{}{}
	c.byTunnel[resp.TunnelID] = l
	c.mu.Unlock()
	c.log().Info("listening", "url", resp.URL, "edge", addr)
	return l, addr, true, nil
}

// session returns the open session and its edge, or opens one to the
// next edge first (one attempt).
func (c *Client) session(ctx context.Context, edges []string) (*wire.Session, string, error) {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	c.mu.Lock()
	c.initLocked()
	closed, mux, edge := c.closed, c.mux, c.edge
	c.mu.Unlock()
	if closed {
		return nil, "", fmt.Errorf("agent: %w", net.ErrClosed)
	}
	if mux != nil {
		return mux, edge, nil
	}
	edge = c.takeEdge(edges)
	mux, err := c.connect(ctx, edge)
	return mux, edge, err
}

// permanent reports whether err is a failure that trying again would not
// cure: the edge refused the request for good (a token, a name, a
// version), the address is not an edge's agent port as the client speaks
// to it, the edge's certificate or TLS refused, a proxy failed otherwise
// than by being out of reach. Others (no answer, a refused or reset
// connection, an edge closing the connection, ErrUnavailable, a proxy that
// cannot be reached or cannot reach the edge) may pass.
func permanent(err error) bool {
	if pe := (*proxyError)(nil); errors.As(err, &pe) && pe.passing {
		return false
	}
	for _, s := range [...]error{ErrUnauthorized, ErrNameTaken, ErrRefused, ErrNotAgentPort, ErrTLSExpected, ErrPlaintextExpected, ErrProxy} {
		if errors.Is(err, s) {
			return true
		}
	}
	var (
		cert  *tls.CertificateVerificationError
		alert tls.AlertError
	)
	return errors.As(err, &cert) || errors.As(err, &alert)
}

// roundError returns the error that ends the setup after a round whose
// attempts failed with failed, by edge, when one of them is permanent; nil
// when waiting may help. It names each edge when there are several.
func roundError(edges []string, failed map[string]error) error {
	var one error
	for _, err := range failed {
		if permanent(err) {
			one = err
		}
	}
	if one == nil {
		return nil
	}
	if len(failed) == 1 {
		return one
	}
	e := &edgesError{}
	for _, a := range edges {
		if err, ok := failed[a]; ok {
			e.addrs = append(e.addrs, a)
			e.errs = append(e.errs, err)
		}
	}
	return e
}

// gaveUp is the error of a setup whose context ended after attempts
// failed, each edge's latest failure in latest; edges in the order they
// first failed. The only attempt's own error says it all.
func (c *Client) gaveUp(ctx context.Context, attempts int, edges []string, latest map[string]error) error {
	e := &waitError{cause: context.Cause(ctx), attempts: attempts}
	for _, a := range edges {
		e.failed.addrs = append(e.failed.addrs, a)
		e.failed.errs = append(e.failed.errs, latest[a])
	}
	if attempts == 1 {
		return e.failed.errs[0]
	}
	return e
}

// waitError is a setup that ran out of time: it wraps the context's cause
// and the edges' latest failures.
type waitError struct {
	cause    error
	attempts int
	failed   edgesError
}

func (e *waitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent: gave up waiting for the edge after %d attempts (%v): ", e.attempts, e.cause)
	if len(e.failed.errs) == 1 {
		b.WriteString("the last failed: ")
		b.WriteString(strings.TrimPrefix(e.failed.errs[0].Error(), "agent: "))
	} else {
		e.failed.list(&b)
	}
	return b.String()
}

func (e *waitError) Unwrap() []error { return append([]error{e.cause}, e.failed.errs...) }

// backoff is the wait before each round of attempts: from MinBackoff,
// doubling up to MaxBackoff, each wait drawn at random between half and
// all of it.
type backoff struct{ cur, max time.Duration }

func (c *Client) newBackoff() *backoff {
	minB, maxB := c.MinBackoff, c.MaxBackoff
	if minB <= 0 {
		minB = 250 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 30 * time.Second
	}
	return &backoff{cur: minB, max: max(minB, maxB)}
}

// next returns the next wait.
func (b *backoff) next() time.Duration {
	d := b.cur/2 + rand.N(b.cur/2+1)
	b.cur = min(2*b.cur, b.max)
	return d
}
