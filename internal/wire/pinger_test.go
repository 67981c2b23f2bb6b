package wire

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
