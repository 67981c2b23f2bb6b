package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// HealthCheck is an active check of an endpoint's app, which the agent
// runs and reports to the edge (Endpoint.HealthCheck): the edge routes
// nothing to the endpoint while its app is down, nor before the first
// check passed, and a pool's other members take its traffic; when every
// member is down, clients get 503 app_unhealthy with Retry-After. The
// app is down after UnhealthyAfter failed checks in a row, and up again
// after HealthyAfter passed ones; the first check, at once, that passes
// makes it up.
type HealthCheck struct {
	// Check checks the app once, within ctx (Timeout): nil is healthy.
	// HTTPCheck and TCPCheck make the usual ones. Required.
	Check func(ctx context.Context) error

	// Interval is the time between two checks. Zero: 10 s; at least 1 s.
	Interval time.Duration

	// Timeout bounds each check. Zero: 2 s, or half the Interval when
	// that is less; less than Interval.
	Timeout time.Duration

	// UnhealthyAfter and HealthyAfter are how many checks in a row must
	// fail, or pass, for the app to go down, or up again. Zero: 3 and 2.
	UnhealthyAfter, HealthyAfter int
}

// Defaults of HealthCheck.
const (
	DefaultHealthInterval       = 10 * time.Second
	DefaultHealthTimeout        = 2 * time.Second
	DefaultHealthUnhealthyAfter = 3
	DefaultHealthHealthyAfter   = 2
)

// ErrHealthCheck is what is wrong with a HealthCheck.
var ErrHealthCheck = errors.New("agent: health check")

// resolved returns hc with its defaults, or what is wrong with it.
func (hc HealthCheck) resolved() (HealthCheck, error) {
	if hc.Check == nil {
		return hc, fmt.Errorf("%w: no Check", ErrHealthCheck)
	}
	if hc.Interval == 0 {
		hc.Interval = DefaultHealthInterval
	}
	if hc.Timeout == 0 {
		hc.Timeout = min(DefaultHealthTimeout, hc.Interval/2)
	}
	if hc.UnhealthyAfter == 0 {
		hc.UnhealthyAfter = DefaultHealthUnhealthyAfter
	}
	if hc.HealthyAfter == 0 {
		hc.HealthyAfter = DefaultHealthHealthyAfter
	}
	switch {
	case hc.Interval < time.Second:
		return hc, fmt.Errorf("%w: interval %v: want 1s at least", ErrHealthCheck, hc.Interval)
	case hc.Timeout < 0 || hc.Timeout >= hc.Interval:
		return hc, fmt.Errorf("%w: timeout %v: want less than the interval, %v", ErrHealthCheck, hc.Timeout, hc.Interval)
	case hc.UnhealthyAfter < 1 || hc.HealthyAfter < 1:
		return hc, fmt.Errorf("%w: unhealthy_after %d, healthy_after %d: want 1 at least", ErrHealthCheck, hc.UnhealthyAfter, hc.HealthyAfter)
	}
	return hc, nil
}

// HTTPCheck returns a Check that GETs url with client (nil: a client of
// its own, which dials url's host): the app is healthy when it answers
// 2xx or 3xx. Redirects are not followed. The protocol is client's
// Transport's: for an app that speaks HTTP/2 alone (h2c, as gRPC
// servers), give one whose Protocols allow unencrypted HTTP/2 only.
func HTTPCheck(client *http.Client, url string) func(ctx context.Context) error {
	return HTTPCheckHost(client, url, "")
}

// HTTPCheckHost is HTTPCheck with host as the requests' Host header
// (empty: url's host and port), for an app that answers only to its own
// name.
func HTTPCheckHost(client *http.Client, url, host string) func(ctx context.Context) error {
	c := &http.Client{}
	if client != nil {
		*c = *client
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			return err
		}
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode > 399 {
			return fmt.Errorf("GET %s: %s", req.URL.Path, resp.Status)
		}
		return nil
	}
}

// TCPCheck returns a Check that connects to addr on network ("tcp", or
// "unix" for a socket's path): the app is healthy when it takes the
// connection.
func TCPCheck(network, addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// healthRunner runs a listener's health check, and reports its app's
// state to the edge on each change, and again on each session the
// endpoint is bound on.
type healthRunner struct {
	l     *Listener
	hc    HealthCheck
	stop  chan struct{} // closed to end it
	kick  chan struct{} // the endpoint was bound again: report again
	ended chan struct{} // closed when it returned
}

// startHealth runs hc for l until l closes, or until the next
// startHealth: nil stops the one running.
func (l *Listener) startHealth(hc *HealthCheck) {
	l.mu.Lock()
	old := l.health
	l.health = nil
	if hc != nil {
		l.health = &healthRunner{l: l, hc: *hc, stop: make(chan struct{}), kick: make(chan struct{}, 1), ended: make(chan struct{})}
	}
	h := l.health
	l.mu.Unlock()
	if old != nil {
		close(old.stop)
		<-old.ended
	}
	if h != nil {
		l.c.wg.Go(h.run)
	}
}

// rebound tells l's health check, if any, that l was bound on a session.
func (l *Listener) rebound() {
	l.mu.Lock()
	h := l.health
	l.mu.Unlock()
	if h != nil {
		select {
		case h.kick <- struct{}{}:
		default:
		}
	}
}

func (h *healthRunner) run() {
	defer close(h.ended)
	// The checks and reports end as the runner does: on the next
	// startHealth, on the listener's Close, on the client's.
	ctx, cancel := context.WithCancel(h.l.c.ctx)
	defer cancel()
	go func() {
		select {
		case <-h.stop:
		case <-h.l.done:
		case <-ctx.Done():
		}
		cancel()
	}()
	var (
		known        bool // a state was reached (the first pass, or UnhealthyAfter fails)
		up           bool
		passes, fail int // in a row
		last         error
	)
	t := time.NewTimer(0) // the first check at once
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
			if known {
				h.report(ctx, up, last)
			}
			continue
		case <-t.C:
		}
		checkCtx, cancelCheck := context.WithTimeout(ctx, h.hc.Timeout)
		err := h.hc.Check(checkCtx)
		cancelCheck()
		if ctx.Err() != nil {
			return // stopped in the check: its result counts for nothing
		}
		if err != nil {
			fail, passes, last = fail+1, 0, err
		} else {
			passes, fail = passes+1, 0
		}
		switch {
		case err == nil && (!known || !up && passes >= h.hc.HealthyAfter):
			known, up = true, true
			h.l.c.log().Info("the app is up", "url", h.l.URL())
			h.report(ctx, true, nil)
		case err != nil && (!known || up) && fail >= h.hc.UnhealthyAfter:
			known, up = true, false
			h.l.c.log().Warn("the app is down: the edge sends it nothing until it is up again", "url", h.l.URL(), "err", err)
			h.report(ctx, false, err)
		}
		t.Reset(h.hc.Interval)
	}
}

// report tells the edge the app's state, on the session the endpoint is
// bound on now, if any, within ctx, the runner's.
func (h *healthRunner) report(ctx context.Context, up bool, why error) {
	c := h.l.c
	c.mu.Lock()
	mux := c.mux
	c.mu.Unlock()
	id, ok := h.l.bound(mux)
	if !ok {
		return // the next session's bind kicks a report
	}
	msg := &wire.Health{TunnelID: id, Up: up, RetryAfter: int((h.hc.Interval * time.Duration(h.hc.HealthyAfter)).Seconds())}
	if why != nil {
		msg.Reason = why.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, edgeTimeout)
	defer cancel()
	var resp wire.Response
	if err := c.call(ctx, mux, wire.Request{Op: wire.OpHealth, Health: msg}, &resp); err != nil {
		c.log().Debug("health report", "url", h.l.URL(), "err", err)
	}
}
