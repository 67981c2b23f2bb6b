package wire

import (
	"cmp"
	"container/list"
	"slices"
	"sync"
	"time"
)

// Streams whose sends wait: for the peer's window (the peer's reader
// stopped reading), or behind the other streams' data on a congested
// link. Their writers hold data: an app's response, and behind it the
// bytes the app wrote that sit in the socket buffers of this host.
// Session.LimitStalled bounds how many may wait long.

// Defaults of the bounds on what a session holds for stalled peers.
const (
	// DefaultMaxStalled is how many streams of a session may wait for the
	// peer's window longer than StallAfter.
	DefaultMaxStalled = 128
	// StallAfter is how long a stream's sends may wait for the peer's
	// window before they count as stalled.
	StallAfter = time.Second
	// DefaultMaxUnread is how many bytes a session's streams may hold
	// unread together (see Session.LimitUnread).
	DefaultMaxUnread = 32 << 20
)

// stalledSends tracks the streams of a session whose writes are under way,
// by when the oldest of them started.
type stalledSends struct {
	mu    sync.Mutex
	max   int           // streams that may wait longer than after; zero: no bound
	after time.Duration // how long a stream may wait before it counts
	cut   func(*Stream) // told of each stream cut; nil: nobody
	list  list.List     // of *Stream, by when their window ran out
	timer *time.Timer   // armed while the list is not empty; nil once a check found it empty
	over  bool          // the session ended
}

// LimitStalled bounds the streams whose writes have waited longer than
// after (for the peer's window, or behind other streams on a congested
// link): a writer whose peer reads nothing holds its data, and on a host
// where the data comes from a local app, the socket buffers of the app's
// connection (a megabyte or more each). Past max such streams, those that
// hold the most are cut (reset, their AfterReset funcs run; see check),
// and cut is told (from a goroutine of the session's; it must not block).
// Zero max: no bound. Called again, the new bounds apply at once to the
// streams waiting.
func (s *Session) LimitStalled(max int, after time.Duration, cut func(*Stream)) {
	ss := &s.stalled
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.max, ss.after, ss.cut = max, after, cut
	if ss.timer != nil && ss.list.Len() > 0 {
		ss.timer.Reset(0) // the streams waiting now, by the new bounds
	}
}

// add notes that a write of st started.
func (ss *stalledSends) add(st *Stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.max <= 0 || ss.over || st.waiting != nil {
		return
	}
	st.waitingSince = time.Now()
	st.waiting = ss.list.PushBack(st)
	if ss.timer == nil {
		ss.timer = time.AfterFunc(ss.after, ss.check)
	} else if ss.list.Len() == 1 {
		ss.timer.Reset(ss.after)
	}
}

// remove notes that the writes of st ended, or st is gone.
func (ss *stalledSends) remove(st *Stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if st.waiting != nil {
		if !ss.over { // stop emptied the list: its elements are no longer in it
			ss.list.Remove(st.waiting)
		}
		st.waiting = nil
	}
}

// check cuts streams that waited longer than after while more than max
// of them wait, and arms the timer for the next one to pass after. The
// victims are those that hold the most (oldest first among equals): a
// stream whose peer reads nothing has its whole window in flight, and
// more behind it in the Write under way; one that waits its turn on a
// congested link with a short answer holds little, and is done once its
// turn comes. What a stream sent over its life does not count: a long
// download whose client paused holds what a stalled one of the same
// moment holds, not more.
func (ss *stalledSends) check() {
	ss.mu.Lock()
	if ss.over {
		ss.mu.Unlock()
		return
	}
	now := time.Now()
	var stale []*list.Element
	for e := ss.list.Front(); e != nil && now.Sub(e.Value.(*Stream).waitingSince) >= ss.after; e = e.Next() {
		stale = append(stale, e)
	}
	var victims []*Stream
	if len(stale) > ss.max {
		slices.SortStableFunc(stale, func(a, b *list.Element) int {
			return cmp.Compare(b.Value.(*Stream).holds(), a.Value.(*Stream).holds())
		})
		for _, e := range stale[:len(stale)-ss.max] {
			st := e.Value.(*Stream)
			ss.list.Remove(e)
			st.waiting = nil
			victims = append(victims, st)
		}
	}
	if e := ss.list.Front(); e != nil && !ss.over {
		next := ss.after - now.Sub(e.Value.(*Stream).waitingSince)
		if next <= 0 {
			next = ss.after // the stale ones within max: look again later
		}
		ss.timer.Reset(next)
	} else if e == nil {
		// No write under way: an idle session holds no timer. The next
		// write makes one.
		ss.timer = nil
	}
	cut := ss.cut
	ss.mu.Unlock()
	for _, st := range victims {
		st.cut()
		if cut != nil {
			cut(st)
		}
	}
}

// stop ends the tracking with the session.
func (ss *stalledSends) stop() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.over = true
	if ss.timer != nil {
		ss.timer.Stop()
	}
	ss.list.Init()
}

// holds is what a stream holds: what it sent that the peer has not read
// yet (its window in flight), and what the Write under way has yet to
// send.
func (st *Stream) holds() int64 {
	return st.sent.Load() - st.granted.Load() + st.pending.Load()
}
