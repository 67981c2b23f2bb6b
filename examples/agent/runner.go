package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/agent/inspect"
)

// runner runs the endpoints of one session: each bound, its URL printed,
// its connections forwarded to its app, until it is stopped (a reload
// that removes it, the agent's end) or lost.
type runner struct {
	c      *agent.Client
	log    *slog.Logger
	insp   *inspect.Inspector
	stdout io.Writer
	state  *stateFile
	failed func(error) // ends the agent with an endpoint lost for good
	many   bool        // endpoints from a file: their lines name their URL

	mu      sync.Mutex
	running map[string]*running // by endpointSpec.key
	order   []string            // the keys, as started
}

// running is an endpoint being served.
type running struct {
	spec endpointSpec
	l    *agent.Listener
	stop bool          // the runner stopped it: its end is no loss
	done chan struct{} // closed when its forwarder returned
}

// start binds the endpoint s within ctx, prints its URL and serves it.
func (r *runner) start(ctx context.Context, s endpointSpec) error {
	l, err := r.bind(ctx, s)
	if err != nil {
		return err
	}
	// Kept before it is printed: whoever reads the URL may kill the
	// agent at once, and its next run must have it.
	if err := r.state.update(func(d *stateData) {
		if d.Endpoints == nil {
			d.Endpoints = map[string]stateEndpoint{}
		}
		d.Endpoints[s.stateKey()] = stateEndpoint{URL: l.URL(), Ticket: l.Ticket(), Since: time.Now().UTC().Truncate(time.Second)}
		d.Session = r.c.Ticket()
	}); err != nil {
		r.log.Warn("state file not written", "file", r.state.path, "err", err)
	}
	fmt.Fprintln(r.stdout, l.URL())
	log := r.log
	if r.many {
		// Each line names its endpoint.
		log = log.With("url", l.URL())
	}
	var fwd interface{ Serve(net.Listener) error }
	if s.httpMode() {
		r.log.Info("forwarding requests", "url", l.URL(), "to", s.target.String(), "app_protocol", l.AppProtocol())
		// The app protocol is l's.
		h := forward.HTTP{To: s.target.addr, Network: s.target.network, TLSConfig: s.toTLS, Logger: log}
		if r.insp != nil {
			h.Recorder = r.insp // not a nil *Inspector in the interface
		}
		fwd = h
		if host := s.target.hostHeader(s.HostHeader); host != "" {
			fwd = hostForwarder{to: s.target, tls: s.toTLS, host: host, logger: log}
		}
	} else {
		r.log.Info("forwarding", "url", l.URL(), "to", s.target.String())
		fwd = forward.Bytes{To: s.target.addr, Network: s.target.network, TLSConfig: s.toTLS, ProxyProtocol: s.ProxyProto, Logger: log}
	}
	run := &running{spec: s, l: l, done: make(chan struct{})}
	r.mu.Lock()
	if r.running == nil {
		r.running = map[string]*running{}
	}
	r.running[s.key()] = run
	r.order = append(r.order, s.key())
	r.mu.Unlock()
	go func() {
		defer close(run.done)
		err := fwd.Serve(l)
		r.mu.Lock()
		stopped := run.stop
		r.mu.Unlock()
		if stopped {
			return
		}
		if err == nil {
			// The listener failed for good: Accept says why.
			_, err = l.Accept()
		}
		r.failed(fmt.Errorf("%s: the endpoint %s was lost: %w", s.where, l.URL(), err))
	}()
	return nil
}

// bind binds s, asking for the URL the state file says it had, with its
// ticket. A name the agent held in an earlier run that the edge still
// keeps for that run's session is waited for: the edge frees it when its
// grace ends.
func (r *runner) bind(ctx context.Context, s endpointSpec) (*agent.Listener, error) {
	ep := agent.Endpoint{URL: s.URL, AppProtocol: s.AppProtocol, Pool: s.Pool, Policy: s.Policy, VerboseErrors: s.VerboseErrors}
	kept, held := r.state.endpoint(s.stateKey())
	if held {
		ep.Ticket = kept.Ticket
		if u, ok := sameEndpoint(s.URL, kept.URL); ok {
			ep.URL = u
		}
	}
	for waited := time.Duration(0); ; {
		if strings.EqualFold(ep.URL, "tls://") {
			// The edge names http, https and tcp endpoints that ask for
			// no name, not tls ones: the agent does, as the edge would.
			ep.URL = "tls://" + randomName()
			r.log.Info("a tls endpoint at a random name: the app's certificate must carry it (or *. and the edge's domain)", "name", strings.TrimPrefix(ep.URL, "tls://"))
		}
		l, err := r.c.ListenEndpoint(ctx, ep)
		if err == nil || !errors.Is(err, agent.ErrNameTaken) || !held {
			return l, err
		}
		if ep.URL != s.URL && agent.KeptUntil(err).IsZero() {
			// The random name of an earlier run went to someone else: a
			// new one.
			r.log.Info("the URL of the earlier run is taken; asking for a new one", "was", kept.URL, "err", err)
			ep.URL, ep.Ticket, held = s.URL, "", false
			continue
		}
		// The name was this agent's in an earlier run, whose session the
		// edge still holds, or keeps the name for: it is free when the
		// edge has seen that session end, and its grace is over.
		delay, until := 5*time.Second, agent.KeptUntil(err)
		if !until.IsZero() {
			delay = max(time.Until(until)+time.Second, time.Second)
		} else if waited > time.Minute {
			return nil, err // nothing says that it will be free
		}
		msg := "the name was this agent's in an earlier run, whose session the edge has not released yet (the agent had no ticket of that session to show); waiting for it"
		if !until.IsZero() {
			msg = "the name was this agent's in an earlier run, and the edge keeps it for that run's session (the agent had no ticket of it to show) until " + until.UTC().Format(time.TimeOnly) + " UTC; waiting for it"
		}
		r.log.Warn(msg, "url", kept.URL, "retry_in", delay.Round(time.Second), "edge_said", err)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for %s, kept for this agent's earlier run: %w", kept.URL, context.Cause(ctx))
		case <-t.C:
		}
		waited += delay
	}
}

// randomName returns a new random name of 10 letters and digits.
func randomName() string {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 10)
	for i := range b {
		b[i] = chars[rand.IntN(len(chars))]
	}
	return string(b)
}

// sameEndpoint returns the URL to ask for to get granted back: for an
// endpoint without a name or port of its own (a random name, any port),
// the one the edge granted, of the same scheme; ok is false otherwise.
func sameEndpoint(asked, granted string) (string, bool) {
	scheme, rest, _ := strings.Cut(asked, "://")
	if asked == "" {
		scheme, rest = "http", ""
	}
	if rest != "" || !strings.Contains(asked+"://", "://") {
		return "", false
	}
	u, err := url.Parse(granted)
	if err != nil || !strings.EqualFold(u.Scheme, scheme) {
		return "", false
	}
	if strings.EqualFold(scheme, "tcp") {
		return "tcp://:" + u.Port(), u.Port() != ""
	}
	return scheme + "://" + u.Hostname(), u.Hostname() != ""
}

// stop unbinds the endpoint key and waits for its forwarder, which closes
// the endpoint's connections.
func (r *runner) stop(key string) {
	r.mu.Lock()
	run := r.running[key]
	if run != nil {
		run.stop = true
		delete(r.running, key)
	}
	r.mu.Unlock()
	if run == nil {
		return
	}
	run.l.Close()
	<-run.done
}

// stopAll stops every endpoint.
func (r *runner) stopAll() {
	r.mu.Lock()
	keys := append([]string(nil), r.order...)
	r.mu.Unlock()
	for _, k := range keys {
		r.stop(k)
	}
	// The latest tickets, renewed while the endpoints ran.
	r.state.update(func(d *stateData) { d.Session = r.c.Ticket() })
}

// reload reads the -config file again: it binds the endpoints added,
// unbinds those removed, and leaves the others, and their connections,
// as they are. A file that does not read leaves everything as it is.
func (r *runner) reload(ctx context.Context, cl *cmdline, was globals) {
	g, specs, err := cl.load(os.LookupEnv)
	if err != nil {
		r.log.Error("SIGHUP: the file was not read again; the endpoints stay as they were", "err", err)
		return
	}
	if changed := g.changed(was); changed != "" {
		r.log.Warn("SIGHUP: changes to the session's settings take a restart; the endpoints' are taken now", "changed", changed)
	}
	keep := map[string]bool{}
	for _, s := range specs {
		keep[s.key()] = true
	}
	r.mu.Lock()
	var removed []string
	for k := range r.running {
		if !keep[k] {
			removed = append(removed, k)
		}
	}
	r.mu.Unlock()
	for _, k := range removed {
		r.mu.Lock()
		run := r.running[k]
		r.mu.Unlock()
		r.log.Info("SIGHUP: endpoint removed", "url", run.l.URL())
		r.stop(k)
		r.state.update(func(d *stateData) { delete(d.Endpoints, run.spec.stateKey()) })
	}
	added := 0
	for _, s := range specs {
		r.mu.Lock()
		_, ok := r.running[s.key()]
		r.mu.Unlock()
		if ok {
			continue
		}
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := r.start(bctx, s)
		cancel()
		if err != nil {
			r.log.Error("SIGHUP: endpoint not bound", "endpoint", s.where, "err", err)
			continue
		}
		added++
	}
	r.log.Info("SIGHUP: the file was read again", "file", cl.config, "added", added, "removed", len(removed))
}

// changed names the settings of the session that differ between g and
// was; "" when none do.
func (g globals) changed(was globals) string {
	var names []string
	if strings.Join(g.edges, ",") != strings.Join(was.edges, ",") {
		names = append(names, "edge")
	}
	for name, pair := range map[string][2]string{"token": {g.token, was.token}, "proxy": {g.proxy, was.proxy}, "proxy_ca": {g.proxyCA, was.proxyCA}, "edge_ca": {g.edgeCA, was.edgeCA}, "metrics": {g.metrics, was.metrics}, "inspect": {g.inspect, was.inspect}, "state": {g.state, was.state}} {
		if pair[0] != pair[1] {
			names = append(names, name)
		}
	}
	if g.plaintext != was.plaintext {
		names = append(names, "plaintext")
	}
	return strings.Join(names, ", ")
}
