package wire

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2/frame"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// frozenConn passes writes through until frozen, then swallows them: a
// link that stopped carrying one direction, with nothing closed.
type frozenConn struct {
	net.Conn
	frozen atomic.Bool
}

func (c *frozenConn) Write(p []byte) (int, error) {
	if c.frozen.Load() {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// pingPair returns two version 3 sessions over loopback TCP that answer
// each other's ping streams, and the conn under the second, which the test
// may freeze.
func pingPair(t *testing.T) (a, b *Session, bConn *frozenConn) {
	ca, cb := tcpPair(t)
	bConn = &frozenConn{Conn: cb}
	a = NewSession(ca, 256<<10, true, 0)
	b = NewSession(bConn, 256<<10, false, 0)
	t.Cleanup(func() { a.Close(); b.Close() })
	for _, s := range []*Session{a, b} {
		go func() {
			for {
				st, err := s.AcceptStream()
				if err != nil {
					return
				}
				go func() {
					defer st.Close()
					var typ [1]byte
					if _, err := io.ReadFull(st, typ[:]); err != nil || StreamType(typ[0]) != StreamPing {
						t.Errorf("stream of type %v (%v), want a ping", typ[0], err)
						return
					}
					if err := ReadPing(st); err != nil {
						t.Errorf("ping: %v", err)
					}
				}()
			}
		}()
	}
	return a, b, bConn
}

// TestPingerKeepsALiveSessionAndFindsADeadOne pings both ways: while the
// link carries both directions, neither side's Dead runs; once one side's
// writes are lost, the other side's Dead runs, once, first (the side that
// still hears its peer's pings lives until those stop, with the Pinger
// that called Dead).
func TestPingerKeepsALiveSessionAndFindsADeadOne(t *testing.T) {
	// A timeout that a loaded machine (the race detector, other packages'
	// tests) never stalls a goroutine for: a live session must not be
	// found dead.
	const interval, timeout = 20 * time.Millisecond, time.Second
	a, b, bConn := pingPair(t)
	var aDead, bDead atomic.Int32
	deadA := make(chan struct{})
	pa := &Pinger{Interval: interval, Timeout: timeout, Dead: func() {
		if aDead.Add(1) == 1 {
			close(deadA)
		}
	}}
	pb := &Pinger{Interval: interval, Timeout: timeout, Dead: func() { bDead.Add(1) }}
	stopA := pa.Start(a)
	defer stopA()
	stopB := pb.Start(b)
	defer stopB()

	// Alive: many intervals and timeouts pass without a death.
	heard := a.Heard()
	time.Sleep(2 * (interval + timeout))
	if aDead.Load() != 0 || bDead.Load() != 0 {
		t.Fatalf("a live session was declared dead: a %d, b %d", aDead.Load(), bDead.Load())
	}
	if a.Heard() == heard {
		t.Fatal("a heard nothing from b's pings")
	}

	bConn.frozen.Store(true)
	select {
	case <-deadA:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not find b dead")
	}
	if n := bDead.Load(); n != 0 {
		t.Errorf("b, whose pings were lost but who still heard a's, was found dead first")
	}
	time.Sleep(2 * (interval + timeout))
	if n := aDead.Load(); n != 1 {
		t.Errorf("a's Dead ran %d times, want once", n)
	}
}

// TestPingerStopsWithTheSession closes a session whose Pinger was never
// stopped: the Pinger stops on its own at its next tick, and never calls
// Dead (not for the ping it can no longer open, nor for the silence
// after). Its timeout is a minute, so that only the end of the session,
// not a test stalled on a busy machine, could make it call Dead.
func TestPingerStopsWithTheSession(t *testing.T) {
	const interval, timeout = 10 * time.Millisecond, time.Minute
	a, b, _ := pingPair(t)
	var mu sync.Mutex
	dead := 0
	p := &Pinger{Interval: interval, Timeout: timeout, Dead: func() { mu.Lock(); dead++; mu.Unlock() }}
	heard := a.Heard()
	p.Start(a)
	// The Pinger ticks: b answered a ping.
	testwait.For(t, func() bool { return a.Heard() > heard })
	a.Close()
	b.Close()
	testwait.For(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.stopped
	})
	mu.Lock()
	defer mu.Unlock()
	if dead != 0 {
		t.Errorf("Dead ran %d times after the session's Close", dead)
	}
}

// TestPingFramesKeepAnIdleSessionAliveWithAFrameEachWay pings both ways
// with PING frames (PingFrameVersion): while the link carries both
// directions, neither side's Dead runs, no stream is opened, and each
// interval costs about one PING and one PONG, not one PING from each side
// (a side that heard its peer's PING since its last tick sends none). Once
// one side's writes are lost, the other side's Dead runs, once.
func TestPingFramesKeepAnIdleSessionAliveWithAFrameEachWay(t *testing.T) {
	const interval, timeout = 50 * time.Millisecond, time.Second
	ca, cb := tcpPair(t)
	aConn := &writeCountingConn{Conn: ca}
	bConn := &frozenConn{Conn: cb}
	a := NewSession(aConn, 256<<10, true, 0)
	b := NewSession(bConn, 256<<10, false, 0)
	t.Cleanup(func() { a.Close(); b.Close() })
	for _, s := range []*Session{a, b} {
		go func() {
			if st, err := s.AcceptStream(); err == nil {
				t.Errorf("a stream was opened: %v", st.Id())
			}
		}()
	}
	var aDead, bDead atomic.Int32
	deadA := make(chan struct{})
	pa := &Pinger{Interval: interval, Timeout: timeout, Frames: true, Dead: func() {
		if aDead.Add(1) == 1 {
			close(deadA)
		}
	}}
	pb := &Pinger{Interval: interval, Timeout: timeout, Frames: true, Dead: func() { bDead.Add(1) }}
	defer pa.Start(a)()
	defer pb.Start(b)()

	heardA, heardB := a.Heard(), b.Heard()
	start := time.Now()
	time.Sleep(2 * (interval + timeout))
	elapsed := time.Since(start)
	if aDead.Load() != 0 || bDead.Load() != 0 {
		t.Fatalf("a live session was declared dead: a %d, b %d", aDead.Load(), bDead.Load())
	}
	heard := a.Heard() - heardA + b.Heard() - heardB
	ticks := uint64(elapsed / interval)
	// Both sides tick once an interval; with a PING from one side and a
	// PONG from the other, the frames both heard are about 2 a tick, and
	// would be 4 if both pinged; none before the first tick.
	if heard < 2 || heard > 3*ticks {
		t.Errorf("%d frames heard over %d intervals: want about 2 an interval", heard, ticks)
	}
	if w := aConn.writes.Load(); w > 2*ticks {
		t.Errorf("a wrote %d times over %d intervals", w, ticks)
	}

	bConn.frozen.Store(true)
	select {
	case <-deadA:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not find b dead")
	}
	time.Sleep(2 * (interval + timeout))
	if n := aDead.Load(); n != 1 {
		t.Errorf("a's Dead ran %d times, want once", n)
	}
}

// TestPingFrameGoesAfterAStalledWrite pings over a session whose framer
// is held by a write the peer does not read: Ping returns at once, and the
// PING goes once the write does.
func TestPingFrameGoesAfterAStalledWrite(t *testing.T) {
	ca, cb := net.Pipe() // a write waits for its read
	a := NewSession(ca, 256<<10, true, 0)
	t.Cleanup(func() { a.Close(); cb.Close() })
	a.fr.mu.Lock() // as a write stalled on the connection holds it
	done := make(chan struct{})
	go func() { a.Ping(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Ping waited for the framer")
	}
	go a.fr.unlock()
	var h [headerSize]byte
	cb.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(cb, h[:]); err != nil {
		t.Fatal(err)
	}
	if typ := frame.Type(h[3] >> 4); typ != typePing || h[3]&0xf != 0 {
		t.Errorf("wrote frame header % x, want a PING", h)
	}
}

// writeCountingConn counts its writes.
type writeCountingConn struct {
	net.Conn
	writes atomic.Uint64
}

func (c *writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestWatcherAnswersAPeerThatPingsAndPingsOneThatDoesNot watches the
// edge's end of a session from a Watcher: while the agent's end pings on
// its own timer, the Watcher sends nothing but the PONGs that answer it
// (no PING of its own), and nobody is found dead; while it does not, the
// Watcher pings it, and its PONGs keep it alive; once its writes are lost,
// the Watcher calls dead, once.
func TestWatcherAnswersAPeerThatPingsAndPingsOneThatDoesNot(t *testing.T) {
	const interval, timeout = 50 * time.Millisecond, time.Second
	ca, cb := tcpPair(t)
	aConn := &writeCountingConn{Conn: ca}
	bConn := &frozenConn{Conn: cb}
	a := NewSession(aConn, 256<<10, false, 0)
	b := NewSession(bConn, 256<<10, true, 0)
	t.Cleanup(func() { a.Close(); b.Close() })
	w := &Watcher{Interval: interval, Timeout: timeout}
	defer w.Close()
	var dead atomic.Int32
	deadA := make(chan struct{})
	w.Watch(a, func() {
		if dead.Add(1) == 1 {
			close(deadA)
		}
	})

	// b pings: a answers, and sends nothing else.
	pb := &Pinger{Interval: interval, Timeout: timeout, Frames: true, Dead: func() { t.Error("b found a dead") }}
	stopB := pb.Start(b)
	heardA, heardB, writes := a.Heard(), b.Heard(), aConn.writes.Load()
	start := time.Now()
	time.Sleep(2 * (interval + timeout))
	ticks := uint64(time.Since(start) / interval)
	stopB()
	if dead.Load() != 0 {
		t.Fatal("a session whose peer pings was found dead")
	}
	if a.Heard() == heardA || b.Heard() == heardB {
		t.Fatalf("heard: a %d frames, b %d", a.Heard()-heardA, b.Heard()-heardB)
	}
	// About one PONG a tick; a PING of a's own each tick would double it.
	if n := aConn.writes.Load() - writes; n > ticks+ticks/2 {
		t.Errorf("a wrote %d times over %d of b's pings: more than its PONGs", n, ticks)
	}

	// b is silent: a pings it, b's framer answers, and all stays alive.
	heardA = a.Heard()
	time.Sleep(2 * (interval + timeout))
	if dead.Load() != 0 {
		t.Fatal("a session whose peer answers PINGs was found dead")
	}
	if a.Heard() == heardA {
		t.Fatal("a heard nothing from b while b was silent: a did not ping it")
	}

	bConn.frozen.Store(true)
	select {
	case <-deadA:
	case <-time.After(10 * time.Second):
		t.Fatal("the Watcher did not find b dead")
	}
	time.Sleep(2 * (interval + timeout))
	if n := dead.Load(); n != 1 {
		t.Errorf("dead ran %d times, want once", n)
	}
}

// TestWatcherClosed: Close with no session watched starts nothing, and a
// Watch after Close watches nothing.
func TestWatcherClosed(t *testing.T) {
	w := &Watcher{Interval: time.Millisecond, Timeout: time.Millisecond}
	w.Close()
	w.Close()
	ca, _ := tcpPair(t)
	a := NewSession(ca, 256<<10, false, 0)
	defer a.Close()
	w.Watch(a, func() { t.Error("dead called by a closed Watcher") })()
	time.Sleep(50 * time.Millisecond)
}
