package wire

import (
	"sync"
	"time"
)

// watchBuckets is how many parts a Watcher checks its sessions in, one
// part every Interval/watchBuckets: each session is checked once an
// interval, and each tick touches a part of them.
const watchBuckets = 10

// Watcher keeps many sessions of PingFrameVersion or later alive from one
// goroutine, for the side that has many (an edge): it checks each session
// once an interval, and pings one only when it heard nothing from its
// peer for an interval, so that a peer that pings on its own timer (an
// agent's Pinger with Frames) is answered, never pinged, and an idle
// session costs this side the peer's PING and its own PONG, with no timer
// of its own. A session that sent nothing for Interval+Timeout (or a
// check more, at worst) is dead: its dead func is called, once, and the
// session is no longer watched. The zero value is not usable: give
// Interval and Timeout, and Close it once done.
type Watcher struct {
	Interval time.Duration // zero: DefaultHeartbeatInterval
	Timeout  time.Duration // zero: DefaultHeartbeatTimeout

	mu      sync.Mutex
	buckets [watchBuckets]map[*watched]struct{}
	n       int  // sessions watched
	next    int  // the bucket the next session goes into
	running bool // the goroutine runs: while a session is watched
	stop    chan struct{}
	wg      sync.WaitGroup // the goroutine
	closed  bool
}

// watched is one session a Watcher watches.
type watched struct {
	s       *Session
	dead    func()
	heard   uint64    // what Heard said when it last grew
	heardAt time.Time // and when
	bucket  int
}

// Watch watches s until remove is called, s ends, or dead is called. On
// a closed Watcher it does nothing. The Watcher's goroutine runs while it
// watches a session.
func (w *Watcher) Watch(s *Session, dead func()) (remove func()) {
	e := &watched{s: s, dead: dead, heard: s.Heard(), heardAt: time.Now()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return func() {}
	}
	if w.stop == nil {
		w.stop = make(chan struct{})
		for i := range w.buckets {
			w.buckets[i] = map[*watched]struct{}{}
		}
	}
	e.bucket = w.next
	w.next = (w.next + 1) % watchBuckets
	w.buckets[e.bucket][e] = struct{}{}
	w.n++
	if !w.running {
		w.running = true
		w.wg.Add(1)
		go w.run()
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.forgetLocked(e)
	}
}

// forgetLocked stops watching e, and reports whether it was watched.
func (w *Watcher) forgetLocked(e *watched) bool {
	if _, ok := w.buckets[e.bucket][e]; !ok {
		return false
	}
	delete(w.buckets[e.bucket], e)
	w.n--
	return true
}

// Close stops watching every session, and waits for the goroutine.
func (w *Watcher) Close() {
	w.mu.Lock()
	if !w.closed && w.stop != nil {
		close(w.stop)
	}
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}

func (w *Watcher) run() {
	defer w.wg.Done()
	interval := orDefault(w.Interval, DefaultHeartbeatInterval)
	timeout := orDefault(w.Timeout, DefaultHeartbeatTimeout)
	t := time.NewTicker(interval / watchBuckets)
	defer t.Stop()
	var batch, gone, dead []*watched
	for b := 0; ; b = (b + 1) % watchBuckets {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		// The bucket's sessions are checked without w.mu: a session's
		// locks are not taken under it (its close removes it from the
		// Watcher), and e's fields are this goroutine's alone.
		w.mu.Lock()
		batch = batch[:0]
		for e := range w.buckets[b] {
			batch = append(batch, e)
		}
		w.mu.Unlock()
		now := time.Now()
		gone, dead = gone[:0], dead[:0]
		for _, e := range batch {
			switch h := e.s.Heard(); {
			case e.s.Over():
				gone = append(gone, e)
			case h != e.heard:
				e.heard, e.heardAt = h, now
			case now.Sub(e.heardAt) >= interval+timeout:
				dead = append(dead, e)
			case now.Sub(e.heardAt) >= interval:
				// Ping writes the frame when the framer is free, and a
				// silent peer's connection may take no more: never here.
				go e.s.Ping()
			}
		}
		w.mu.Lock()
		for _, e := range gone {
			w.forgetLocked(e)
		}
		n := 0
		for _, e := range dead {
			if w.forgetLocked(e) { // not removed meanwhile
				dead[n] = e
				n++
			}
		}
		dead = dead[:n]
		idle := w.n == 0
		if idle {
			w.running = false
		}
		w.mu.Unlock()
		for _, e := range dead {
			go e.dead()
		}
		if idle {
			return
		}
	}
}
