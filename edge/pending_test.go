package edge_test

// Pending sessions by source (issue #32, item 2): the agent connections
// of one source that never say hello push out that source's own, never
// those of an agent elsewhere that needs a moment to say its hello.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// The loopback addresses the floods and the agents beside them come
// from: all of 127.0.0.0/8 is loopback, each address a source of its own.
const (
	floodSource = "127.0.0.2"
	agentSource = "127.0.0.3"
)

// dialerFrom returns a Dialer whose connections come from the loopback
// address src, or skips the test on a system where only 127.0.0.1 is
// loopback.
func dialerFrom(t testing.TB, src string) *net.Dialer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	ln := listen(t)
	defer ln.Close()
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Skipf("no connection from %s: %v", src, err)
	}
	c.Close()
	return d
}

// slowConn delays each write: an agent behind it takes that much longer
// for each step of its session's start, as one far from the edge does.
type slowConn struct {
	net.Conn
	delay time.Duration
}

func (c slowConn) Write(b []byte) (int, error) {
	time.Sleep(c.delay) // the way to the edge, not a wait for anything
	return c.Conn.Write(b)
}

// slowAgent is an agent of the edge at addr (over TLS with tlsCfg when
// it is not nil) whose connections come from d and are delay away. It
// records each attempt of its that failed.
type slowAgent struct {
	*agent.Client
	mu     sync.Mutex
	failed []error
	// lost is closed after the agent's giveUp-th failed attempt: the
	// test knows enough by then.
	lost     chan struct{}
	lostOnce sync.Once
}

func newSlowAgent(t testing.TB, d *net.Dialer, addr string, tlsCfg *tls.Config, delay time.Duration, giveUp int) *slowAgent {
	a := &slowAgent{lost: make(chan struct{})}
	a.Client = &agent.Client{
		Addrs:      []string{addr},
		TLSConfig:  tlsCfg,
		MinBackoff: 5 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return slowConn{c, delay}, nil
		},
		OnEvent: func(e agent.Event) {
			if e.Kind != agent.Reconnecting || e.Err == nil {
				return
			}
			a.mu.Lock()
			a.failed = append(a.failed, e.Err)
			n := len(a.failed)
			a.mu.Unlock()
			if n >= giveUp {
				a.lostOnce.Do(func() { close(a.lost) })
			}
		},
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// listen binds url, giving up after the agent's giveUp-th failed
// attempt or 2 minutes, and returns the listener, the time it took, and the failed attempts.
func (a *slowAgent) listen(url string) (*agent.Listener, time.Duration, []error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		select {
		case <-a.lost:
			cancel()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	l, err := a.Listen(ctx, url)
	took := time.Since(start)
	a.mu.Lock()
	defer a.mu.Unlock()
	return l, took, append([]error(nil), a.failed...), err
}

// silentFlood opens connections from one source at a steady pace, does
// its attack on each, then leaves it silent, and closes each as soon as
// the edge does.
type silentFlood struct {
	opened, closedByEdge atomic.Int64
	start                time.Time
	cancel               context.CancelFunc
	wg                   sync.WaitGroup

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	stopped bool
}

// startFlood starts a flood of addr from d at perSecond connections a
// second; the test's end stops it.
func startFlood(t testing.TB, d *net.Dialer, addr string, perSecond int, attack func(net.Conn) net.Conn) *silentFlood {
	ctx, cancel := context.WithCancel(context.Background())
	f := &silentFlood{cancel: cancel, conns: map[net.Conn]struct{}{}, start: time.Now()}
	pace := rate.NewLimiter(rate.Limit(perSecond), perSecond/100+1)
	f.wg.Go(func() {
		for pace.Wait(ctx) == nil {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				continue // the flood ends, or the system is short of ports for a moment
			}
			if !f.track(c) {
				c.Close()
				return
			}
			f.opened.Add(1)
			f.wg.Go(func() {
				if rc := attack(c); rc != nil {
					io.Copy(io.Discard, rc)
				}
				if f.untrack(c) {
					f.closedByEdge.Add(1)
				}
				c.Close()
			})
		}
	})
	t.Cleanup(f.stop)
	return f
}

func (f *silentFlood) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack forgets c, and reports whether the flood still held it (the
// edge closed it, not stop).
func (f *silentFlood) untrack(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.conns[c]
	delete(f.conns, c)
	return ok && !f.stopped
}

// stop ends the flood, closes its connections and waits for its
// goroutines. Calling it again does nothing more.
func (f *silentFlood) stop() {
	f.cancel()
	f.mu.Lock()
	f.stopped = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// rate is the pace the flood kept: connections opened a second.
func (f *silentFlood) rate() float64 {
	return float64(f.opened.Load()) / time.Since(f.start).Seconds()
}

// The attacks of a flood: what each connection does before it stays
// silent.
type floodAttack struct {
	name  string
	tls   bool // on the public TLS port; else the agent port
	start func(e *onePortEdge, hello []byte) func(net.Conn) net.Conn
}

var floodAttacks = []floodAttack{
	{"agent port, preamble only", false, func(*onePortEdge, []byte) func(net.Conn) net.Conn {
		return func(c net.Conn) net.Conn {
			if wire.WritePreamble(c, wire.DefaultWindow) != nil {
				return nil
			}
			return c
		}
	}},
	{"tls port, handshake unfinished", true, func(_ *onePortEdge, hello []byte) func(net.Conn) net.Conn {
		return func(c net.Conn) net.Conn {
			if _, err := c.Write(hello); err != nil {
				return nil
			}
			return c
		}
	}},
	{"tls port, preamble only", true, func(e *onePortEdge, _ []byte) func(net.Conn) net.Conn {
		cfg := &tls.Config{RootCAs: e.pki.Pool, ServerName: "example.test", NextProtos: []string{wire.ALPN}}
		return func(c net.Conn) net.Conn {
			tc := tls.Client(c, cfg)
			if tc.Handshake() != nil || wire.WritePreamble(tc, wire.DefaultWindow) != nil {
				return nil
			}
			return tc
		}
	}},
}

// addrFor returns the address of the edge's port that the attack
// floods, and the TLS configuration of an agent there (nil on the agent
// port).
func (e *onePortEdge) addrFor(a floodAttack, agents string) (string, *tls.Config) {
	if a.tls {
		return e.addr, &tls.Config{RootCAs: e.pki.Pool, ServerName: "example.test"}
	}
	return agents, nil
}

// TestPendingSessionsPerSource: one source floods the agent port, or the
// public TLS port, with agent connections that never say hello (the
// preamble, or a TLS handshake left unfinished, and nothing more), while
// an agent from another source, whose every write takes 300 ms, connects
// and binds. The flood is at its bound all along: past
// Limits.PendingSessionsPerSource, or past Limits.PendingSessions with no
// bound per source, the edge pushes out the flood's own connections, and
// none of the agent's sessions is closed before it bound.
func TestPendingSessionsPerSource(t *testing.T) {
	t.Parallel()
	flooder, near := dialerFrom(t, floodSource), dialerFrom(t, agentSource)
	hello := agentHello(t)
	for _, bound := range []struct {
		name   string
		limits edge.Limits
	}{
		{"bound per source", edge.Limits{PendingSessions: 32, PendingSessionsPerSource: 8}},
		{"bound of the edge", edge.Limits{PendingSessions: 32, PendingSessionsPerSource: -1}},
	} {
		for _, attack := range floodAttacks {
			t.Run(bound.name+"/"+attack.name, func(t *testing.T) {
				t.Parallel()
				agents := listen(t)
				e := startOnePortEdgeWith(t, agents, func(s *edge.Server) {
					s.Limits = bound.limits
					s.Timeouts = edge.Timeouts{Handshake: time.Minute} // nothing ends for want of time
				})
				addr, tlsCfg := e.addrFor(attack, agents.Addr().String())
				flood := startFlood(t, flooder, addr, 50, attack.start(e, hello))
				evicted := "refused/" + string(edge.ReasonPendingLimit)
				testwait.For(t, func() bool { return e.obs.get(evicted) > 0 }) // the flood is at its bound

				before := e.obs.get(evicted)
				a := newSlowAgent(t, near, addr, tlsCfg, 300*time.Millisecond, 3)
				l, took, failed, err := a.listen("http://slow")
				during := e.obs.get(evicted) - before
				flood.stop()
				t.Logf("%v to bind beside a flood of %.0f connections a second; %d of the flood's pushed out meanwhile, %d sessions of the agent's lost", took.Round(time.Millisecond), flood.rate(), during, len(failed))
				if len(failed) > 0 {
					t.Errorf("%d sessions of the agent's closed before it bound, want none: %v", len(failed), failed)
				}
				if err != nil {
					t.Fatalf("the agent beside the flood: %v", err)
				}
				if l.URL() == "" {
					t.Fatal("the agent's listener has no URL")
				}
				if during == 0 {
					t.Fatal("no connection of the flood was pushed out while the agent connected: the flood was not at its bound")
				}
			})
		}
	}
}

// BenchmarkBindBesideSilentFlood measures issue #32's item 2 with the
// edge's default bounds: one source opens perSecond agent connections a
// second that send the preamble (on the TLS port, after a handshake) and
// nothing more, while an agent from another source, whose every write
// takes delay, connects and binds, once the flood opened more than the
// edge's bound. It reports the seconds the agent took to bind (or to
// give up, after 10 failed attempts or 2 minutes), its attempts that
// failed (the edge closed their connection before the hello was
// answered: before the edge's preamble, or as the agent wrote its hello,
// or after), how many of them failed as "hello: session closed", whether
// it bound at all, and the pace the flood kept. Give it 1x, and -count
// for more runs:
//
//	go test ./edge -run '^$' -bench BindBesideSilentFlood -benchtime 1x
func BenchmarkBindBesideSilentFlood(b *testing.B) {
	flooder, near := dialerFrom(b, floodSource), dialerFrom(b, agentSource)
	for _, c := range []struct {
		attack    floodAttack
		perSecond int
		delay     time.Duration
	}{
		{floodAttacks[0], 0, 600 * time.Millisecond},
		{floodAttacks[0], 1200, 600 * time.Millisecond},
		{floodAttacks[0], 1800, 600 * time.Millisecond},
		{floodAttacks[0], 2500, 300 * time.Millisecond},
		{floodAttacks[2], 0, 600 * time.Millisecond},
		{floodAttacks[2], 1200, 600 * time.Millisecond},
	} {
		name := fmt.Sprintf("%s/%d-per-s/%v", strings.ReplaceAll(c.attack.name, " ", "-"), c.perSecond, c.delay)
		b.Run(name, func(b *testing.B) {
			var took, failed, closed, bound, pace float64
			for range b.N {
				agents := listen(b)
				e := startOnePortEdgeWith(b, agents, nil)
				addr, tlsCfg := e.addrFor(c.attack, agents.Addr().String())
				var flood *silentFlood
				if c.perSecond > 0 {
					flood = startFlood(b, flooder, addr, c.perSecond, c.attack.start(e, nil))
					testwait.Within(b, time.Minute, "the flood past the edge's bound", func() bool { return flood.opened.Load() > edge.DefaultPendingSessions })
				}
				a := newSlowAgent(b, near, addr, tlsCfg, c.delay, 10)
				_, d, errs, err := a.listen("http://slow")
				if flood != nil {
					pace += flood.rate()
					flood.stop()
				}
				took += d.Seconds()
				failed += float64(len(errs))
				for _, err := range errs {
					if strings.Contains(err.Error(), "session closed") {
						closed++
					}
				}
				if err == nil {
					bound++
				}
				b.Logf("%s: %v, %d failed attempts: %v; Listen: %v", name, d.Round(time.Millisecond), len(errs), errs, err)
			}
			n := float64(b.N)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(took/n, "bind-s")
			b.ReportMetric(failed/n, "failed-attempts")
			b.ReportMetric(closed/n, "session-closed")
			b.ReportMetric(bound/n, "bound")
			b.ReportMetric(pace/n, "flood-conns/s")
		})
	}
}
