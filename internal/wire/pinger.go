package wire

import (
	"encoding/binary"
	"io"
	"sync"
	"time"
)

// Pinger keeps a session of version 3 or later alive and tells when its
// peer is dead, with no goroutine of its own at rest: a timer every
// Interval pings the peer, and when nothing at all came from the peer
// within Interval+Timeout (Session.Heard), calls Dead, once. A peer busy
// sending bulk data is alive, even when its pings wait behind the data.
//
// With Frames (sessions of PingFrameVersion or later), a tick that heard
// something from the peer since the last one sends nothing, and one that
// heard nothing sends a PING frame (Session.Ping), which the peer answers
// with a PONG: on an idle session, whichever side's timer fires first
// pings, and the other, having heard it, does not. Without Frames, each
// tick opens a ping stream to the peer (StreamPing); one that cannot be
// opened (the peer sent GOAWAY, or the session died) calls Dead too: such
// a session carries no more streams from this end.
type Pinger struct {
	Interval time.Duration // zero: DefaultHeartbeatInterval
	Timeout  time.Duration // zero: DefaultHeartbeatTimeout
	Dead     func()        // called once when the peer is dead
	Frames   bool          // ping with PING frames, not ping streams

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	heard   uint64    // what Heard said when it last grew
	heardAt time.Time // and when
}

// Start pings over s until stop is called, the session ends, or Dead. It
// returns at once.
func (p *Pinger) Start(s *Session) (stop func()) {
	interval := orDefault(p.Interval, DefaultHeartbeatInterval)
	timeout := orDefault(p.Timeout, DefaultHeartbeatTimeout)
	p.mu.Lock()
	p.heard, p.heardAt = s.Heard(), time.Now()
	p.timer = time.AfterFunc(interval, func() { p.tick(s, interval, timeout) })
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.stopped = true
		p.timer.Stop()
	}
}

// tick checks that the peer was heard from lately, and pings it.
func (p *Pinger) tick(s *Session, interval, timeout time.Duration) {
	p.mu.Lock()
	if p.stopped || s.Over() {
		p.stopped = true
		p.mu.Unlock()
		return
	}
	now := time.Now()
	heard := false
	if h := s.Heard(); h != p.heard {
		p.heard, p.heardAt, heard = h, now, true
	} else if now.Sub(p.heardAt) >= interval+timeout {
		p.stopped = true
		p.mu.Unlock()
		if p.Dead != nil {
			p.Dead()
		}
		return
	}
	if p.Frames {
		if !heard {
			s.Ping()
		}
		p.timer.Reset(interval)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	if !ping(s, now, timeout) {
		p.mu.Lock()
		stopped := p.stopped
		p.stopped = true
		p.mu.Unlock()
		if !stopped && p.Dead != nil {
			p.Dead()
		}
		return
	}
	p.mu.Lock()
	if !p.stopped {
		p.timer.Reset(interval)
	}
	p.mu.Unlock()
}

// ping opens a ping stream to the peer, bounded in time by timeout, and
// reports false when the session can open no stream.
func ping(s *Session, now time.Time, timeout time.Duration) bool {
	st, err := s.OpenStream()
	if err != nil {
		return false
	}
	var b [9]byte
	b[0] = byte(StreamPing)
	binary.BigEndian.PutUint64(b[1:], uint64(now.UnixNano()))
	st.SetWriteDeadline(now.Add(timeout))
	st.Write(b[:])
	st.Close()
	return true
}

// ReadPing reads the rest of a ping stream whose type byte was read.
func ReadPing(r io.Reader) error {
	var b [8]byte
	_, err := io.ReadFull(r, b[:])
	return err
}
