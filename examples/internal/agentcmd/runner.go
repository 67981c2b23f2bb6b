package agentcmd

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
	"sync/atomic"
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

// running is an endpoint being served: its listener's conns go, through
// a pump, to the forwarder of its current settings; a reload that changes
// them hands the next conns to a new forwarder while the old one finishes
// what it serves.
type running struct {
	spec endpointSpec
	l    *agent.Listener
	stop bool          // the runner stopped it: its end is no loss
	done chan struct{} // closed when its last forwarder returned
	cur  *handoff      // what the current forwarder accepts from; guarded by runner.mu
	lost error         // why the listener failed for good; guarded by runner.mu
}

// start binds the endpoint s within ctx, prints its URL and serves it.
func (r *runner) start(ctx context.Context, s endpointSpec) error {
	l, err := r.bind(ctx, s)
	if err != nil {
		return err
	}
	// Kept before it is printed: whoever reads the URL may kill the
	// agent at once, and its next run must have it.
	r.keep(s, l, time.Now())
	fmt.Fprintln(r.stdout, l.URL())
	go r.probe(s, l.URL())
	run := &running{spec: s, l: l, done: make(chan struct{}), cur: newHandoff(l)}
	r.mu.Lock()
	if r.running == nil {
		r.running = map[string]*running{}
	}
	r.running[s.key()] = run
	r.order = append(r.order, s.key())
	r.mu.Unlock()
	r.serve(run, run.cur, s)
	go r.pump(run)
	return nil
}

// probeTimeout bounds the connection probe makes to an endpoint's app.
const probeTimeout = 3 * time.Second

// probe connects once to the app of s, served at url, and warns when
// nothing answers there: the endpoint is up all the same, and its
// connections are answered (502 app_unreachable for HTTP) until the app
// listens.
func (r *runner) probe(s endpointSpec, url string) {
	c, err := net.DialTimeout(s.target.network, s.target.addr, probeTimeout)
	if err != nil {
		r.log.Warn("nothing answers at the app's address yet: the endpoint is up, and its requests fail until the app listens there", "url", url, "to", s.target.String(), "err", err)
		return
	}
	c.Close()
}

// keep writes the endpoint s, bound at l, to the state file, granted at
// since.
func (r *runner) keep(s endpointSpec, l *agent.Listener, since time.Time) {
	if err := r.state.update(func(d *stateData) {
		if d.Endpoints == nil {
			d.Endpoints = map[string]stateEndpoint{}
		}
		d.Endpoints[s.stateKey()] = stateEndpoint{URL: l.URL(), Ticket: l.Ticket(), Since: since.UTC().Truncate(time.Second)}
		d.Session = r.c.Ticket()
	}); err != nil {
		r.log.Warn("state file not written", "file", r.state.path, "err", err)
	}
}

// forwarder returns what forwards the conns of s, bound at l, to its app.
func (r *runner) forwarder(s endpointSpec, l *agent.Listener) interface{ Serve(net.Listener) error } {
	log := r.log
	if r.many {
		// Each line names its endpoint.
		log = log.With("url", l.URL())
	}
	if !s.httpMode() {
		r.log.Info("forwarding", "url", l.URL(), "to", s.target.String())
		return forward.Bytes{To: s.target.addr, Network: s.target.network, TLSConfig: s.toTLS, ProxyProtocol: s.ProxyProto, Logger: log}
	}
	r.log.Info("forwarding requests", "url", l.URL(), "to", s.target.String(), "app_protocol", l.AppProtocol())
	if host := s.target.hostHeader(s.HostHeader); host != "" {
		return hostForwarder{to: s.target, tls: s.toTLS, host: host, logger: log}
	}
	// The app protocol is l's.
	h := forward.HTTP{To: s.target.addr, Network: s.target.network, TLSConfig: s.toTLS, Logger: log}
	if r.insp != nil {
		h.Recorder = r.insp // not a nil *Inspector in the interface
	}
	return h
}

// serve runs the forwarder of s on h, one of run's. The last forwarder's
// end is the endpoint's: unless the runner stopped it, the endpoint was
// lost, and the agent ends.
func (r *runner) serve(run *running, h *handoff, s endpointSpec) {
	fwd := r.forwarder(s, run.l)
	go func() {
		err := fwd.Serve(h)
		if h.handedOver() {
			return // what it served has ended; another serves the endpoint
		}
		defer close(run.done)
		r.mu.Lock()
		stopped := run.stop
		r.mu.Unlock()
		if stopped {
			return
		}
		if err == nil {
			// The listener failed for good: Accept says why.
			_, err = run.l.Accept()
		}
		r.failed(fmt.Errorf("%s: the endpoint %s was lost: %w", s.where, run.l.URL(), err))
	}()
}

// pump passes the conns of run's listener to its current forwarder, until
// the listener fails: then that forwarder's Accept fails as the
// listener's did.
func (r *runner) pump(run *running) {
	for {
		c, err := run.l.Accept()
		r.mu.Lock()
		h := run.cur
		if err != nil {
			run.lost = err // no forwarder takes over from h now (handOver)
		}
		r.mu.Unlock()
		if err != nil {
			h.end(err)
			return
		}
		for !h.give(c) {
			// Handed over as it came: to the forwarder that took over.
			r.mu.Lock()
			next := run.cur
			r.mu.Unlock()
			if next == h {
				c.Close() // the endpoint is ending
				break
			}
			h = next
		}
	}
}

// handOver makes a new forwarder, of s, serve run's next conns, while the
// current one finishes what it serves (hard: closes it instead, for an
// edge that could not send the next conns on new streams).
//
// Once the listener failed for good, it does nothing: the current
// forwarder ends with the listener's error, and reports the endpoint lost.
func (r *runner) handOver(run *running, s endpointSpec, hard bool) {
	h := newHandoff(run.l)
	r.mu.Lock()
	if run.lost != nil {
		r.mu.Unlock()
		return
	}
	old := run.cur
	run.cur, run.spec = h, s
	// Before the old forwarder can end: it must not report the endpoint
	// lost, nor close run.done, which is the new one's to close.
	old.replaced.Store(true)
	r.mu.Unlock()
	r.serve(run, h, s)
	if hard {
		old.end(fmt.Errorf("reload: %w", net.ErrClosed))
		return
	}
	old.end(fmt.Errorf("reload: %w", forward.ErrHandedOver))
}

// handoff is the listener of one forwarder of an endpoint: the conns of
// the endpoint's listener, as its pump passes them on, until its end. It
// answers for the endpoint's listener otherwise (Addr, AppProtocol,
// VerboseErrors), but for Close, which ends it alone.
type handoff struct {
	*agent.Listener
	conns chan net.Conn
	over  chan struct{}
	err   error // why Accept fails, once over is closed
	once  sync.Once
	// replaced is set when another forwarder takes over, before the end.
	replaced atomic.Bool
}

func newHandoff(l *agent.Listener) *handoff {
	return &handoff{Listener: l, conns: make(chan net.Conn), over: make(chan struct{})}
}

// Accept returns the next conn the pump passes on.
func (h *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.over:
		return nil, h.err
	}
}

// Close ends h; the endpoint's listener stays.
func (h *handoff) Close() error {
	h.end(fmt.Errorf("forwarder: %w", net.ErrClosed))
	return nil
}

// give hands c to h's Accept; false once h has ended.
func (h *handoff) give(c net.Conn) bool {
	select {
	case h.conns <- c:
		return true
	case <-h.over:
		return false
	}
}

// end makes Accept fail with err.
func (h *handoff) end(err error) {
	h.once.Do(func() {
		h.err = err
		close(h.over)
	})
}

// handedOver reports whether another forwarder took over from h's.
func (h *handoff) handedOver() bool { return h.replaced.Load() }

// bind binds s, asking for the URL the state file says it had, with its
// ticket. A name the agent held in an earlier run that the edge still
// keeps for that run's session is waited for: the edge frees it when its
// grace ends.
func (r *runner) bind(ctx context.Context, s endpointSpec) (*agent.Listener, error) {
	ep := s.endpoint()
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
// unbinds those removed, changes in place those whose URL stays and whose
// other settings changed, and leaves the others, and their connections,
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
	r.mu.Lock()
	runs := map[string]*running{}
	for k, run := range r.running {
		runs[k] = run
	}
	r.mu.Unlock()
	added, changed, removed := pairEndpoints(runs, specs)
	for _, run := range removed {
		r.log.Info("SIGHUP: endpoint removed", "url", run.l.URL())
		r.stop(run.spec.key())
		r.state.update(func(d *stateData) { delete(d.Endpoints, run.spec.stateKey()) })
	}
	updated := 0
	for _, c := range changed {
		uctx, cancel := context.WithTimeout(ctx, time.Minute)
		if r.update(uctx, c.run, c.spec) {
			updated++
		}
		cancel()
	}
	bound := 0
	for _, s := range added {
		bctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := r.start(bctx, s)
		cancel()
		if err != nil {
			r.log.Error("SIGHUP: endpoint not bound", "endpoint", s.where, "err", err)
			continue
		}
		bound++
	}
	r.log.Info("SIGHUP: the file was read again", "file", cl.config, "added", bound, "changed", updated, "removed", len(removed))
}

// change is an endpoint whose URL stays across a reload, and its new
// settings.
type change struct {
	run  *running
	spec endpointSpec
}

// pairEndpoints tells, of the endpoints running (by key) and those of a
// reloaded file, those to bind, those to change in place, and those to
// stop. An endpoint whose settings are all the same is left alone; one
// whose URL, as written, is the same as one running endpoint's, and as
// no other endpoint's of either side, is that endpoint, changed; the
// others are added, or removed: a changed URL releases the old name.
func pairEndpoints(runs map[string]*running, specs []endpointSpec) (added []endpointSpec, changed []change, removed []*running) {
	left := map[string]*running{}
	for k, run := range runs {
		left[k] = run
	}
	var rest []endpointSpec
	for _, s := range specs {
		if _, same := left[s.key()]; same {
			delete(left, s.key())
			continue
		}
		rest = append(rest, s)
	}
	byURL := map[string][]*running{}
	for _, run := range left {
		byURL[run.spec.URL] = append(byURL[run.spec.URL], run)
	}
	newByURL := map[string]int{}
	for _, s := range rest {
		newByURL[s.URL]++
	}
	for _, s := range rest {
		if olds := byURL[s.URL]; len(olds) == 1 && newByURL[s.URL] == 1 {
			changed = append(changed, change{olds[0], s})
			delete(left, olds[0].spec.key())
			continue
		}
		added = append(added, s)
	}
	for _, run := range left {
		removed = append(removed, run)
	}
	return added, changed, removed
}

// update changes the running endpoint run to the settings of s, in place:
// the edge's settings (a policy, the pool...) at the edge, in one step
// that keeps its name, its URL and its conns; the app's (to, the Host
// header...) by handing the next conns to a new forwarder while the old
// one finishes what it serves. It reports whether it did; when the edge
// refuses, the endpoint stays as it was.
func (r *runner) update(ctx context.Context, run *running, s endpointSpec) bool {
	old := run.spec
	url := run.l.URL()
	// At the edge even when only the app changes: its conns to the old
	// app, kept alive there for the next requests, go once idle, and the
	// next requests come on new ones, to the new forwarder.
	err := run.l.Update(ctx, s.endpoint())
	hard := false
	switch {
	case err == nil:
	case errors.Is(err, agent.ErrUnsupported) && !s.atEdge(old):
		// An older edge: the app's settings change here alone, and the
		// conns kept alive for the old app are closed.
		r.log.Warn("SIGHUP: this edge cannot change an endpoint in place; the connections to the old app are closed", "url", url, "err", err)
		hard = true
	default:
		r.log.Error("SIGHUP: endpoint not changed; it stays as it was", "url", url, "endpoint", s.where, "err", err)
		return false
	}
	r.mu.Lock()
	delete(r.running, old.key())
	r.running[s.key()] = run
	for i, k := range r.order {
		if k == old.key() {
			r.order[i] = s.key()
		}
	}
	r.mu.Unlock()
	r.handOver(run, s, hard)
	if s.stateKey() != old.stateKey() {
		since := time.Now()
		if kept, ok := r.state.endpoint(old.stateKey()); ok {
			since = kept.Since
		}
		r.state.update(func(d *stateData) { delete(d.Endpoints, old.stateKey()) })
		r.keep(s, run.l, since)
	} else {
		r.keep(s, run.l, time.Now()) // the new endpoint ticket
	}
	r.log.Info("SIGHUP: endpoint changed in place", "url", url, "endpoint", s.where)
	return true
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
