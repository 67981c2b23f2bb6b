package wire

import (
	"encoding/binary"
	"io"
	"sync"
	"time"
)

// Heartbeat defaults.
const (
	// 30 s, as yamux's keepalive and frp's: well under the 60 s or more
	// that most NATs and proxies keep an idle connection, and a third of
	// the cost of 10 s at scale (100,000 idle sessions: docs/cluster.md,
	// Scaling out).
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultHeartbeatTimeout  = 15 * time.Second
)

// Heartbeat pings the peer over a heartbeat stream and calls Dead once when
// no echo arrived within Interval+Timeout of the last one. It does not rely
// on write deadlines: a watchdog timer decides, so a peer that stops reading
// (a frozen network) is detected even while a ping write is stuck. The
// caller closes the session in Dead, which ends the stream and the
// heartbeat's goroutines.
type Heartbeat struct {
	Interval time.Duration       // zero: DefaultHeartbeatInterval
	Timeout  time.Duration       // zero: DefaultHeartbeatTimeout
	RTT      func(time.Duration) // called with each round trip; nil: ignored
	Dead     func()              // called once when the peer is dead

	// Heard, if set, returns a count that grows whenever anything arrives
	// from the peer (Session.Heard): a peer heard from within
	// Interval+Timeout is alive even when its echoes are late, as they
	// are when they wait behind bulk data on a slow link. Nil: only
	// echoes count.
	Heard func() uint64
}

// Run pings over st, a stream whose type byte was sent, until st fails,
// and returns why, once both of its loops have ended. The watch ends with
// it: a caller that relies on it to tell a dead peer must end the session
// when Run returns (a peer that resets the stream would otherwise never be
// found dead).
func (h *Heartbeat) Run(st io.ReadWriter) error {
	interval := orDefault(h.Interval, DefaultHeartbeatInterval)
	timeout := orDefault(h.Timeout, DefaultHeartbeatTimeout)
	var once sync.Once
	var watchdog *time.Timer
	var mu sync.Mutex // guards watchdog's Resets and heard
	var heard uint64  // what Heard said when the watchdog was last armed by it
	if h.Heard != nil {
		heard = h.Heard()
	}
	dead := func() {
		if h.Heard != nil {
			mu.Lock()
			now := h.Heard()
			alive := now != heard
			if alive {
				heard = now
				watchdog.Reset(interval + timeout)
			}
			mu.Unlock()
			if alive {
				return
			}
		}
		once.Do(func() {
			if h.Dead != nil {
				h.Dead()
			}
		})
	}
	mu.Lock()
	watchdog = time.AfterFunc(interval+timeout, dead)
	mu.Unlock()
	defer watchdog.Stop()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { pingLoop(st, interval, stop) })
	var b [8]byte
	var err error
	for {
		if _, err = io.ReadFull(st, b[:]); err != nil {
			break
		}
		mu.Lock()
		watchdog.Reset(interval + timeout)
		mu.Unlock()
		sent := time.Unix(0, int64(binary.BigEndian.Uint64(b[:])))
		if h.RTT != nil {
			h.RTT(time.Since(sent))
		}
	}
	close(stop)
	wg.Wait()
	return err
}

// pingLoop writes a ping with the send time every interval.
func pingLoop(w io.Writer, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var b [8]byte
	for {
		binary.BigEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
		if _, err := w.Write(b[:]); err != nil {
			return
		}
		select {
		case <-t.C:
		case <-stop:
			return
		}
	}
}

// Echo answers the pings of a peer's heartbeat stream until it fails.
func Echo(st io.ReadWriter) {
	var b [8]byte
	for {
		if _, err := io.ReadFull(st, b[:]); err != nil {
			return
		}
		if _, err := st.Write(b[:]); err != nil {
			return
		}
	}
}

// orDefault is d, or def when d is zero or negative.
func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
