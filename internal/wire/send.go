package wire

import (
	"container/heap"
	"sync"
	"sync/atomic"

	"golang.ngrok.com/muxado/v2/frame"
)

// Sending fairly. muxado sends a session's frames in the order their
// writers asked, each frame as large as the stream's window allows (256
// KiB by default), through one queue that every stream's writer waits in:
// behind a thousand streams moving bulk data, a small response waits for
// them all (seconds, on a loaded session). So a Stream's writes go to
// the framer through a scheduler of the session's: at most sendSlots
// frames are on their way at once (one being written, the others waiting
// for the framer's lock, which passes in turn), each of at most
// MaxFrameData bytes, and the writers waiting for a slot are served in
// the order of weighted fair queueing: a frame's virtual finish is its
// virtual start (where its stream's previous frame finished, or the
// session's virtual time if the stream was quiet since) plus its size,
// and the smallest finish goes first. The virtual time advances with each frame sent by its size
// shared among the streams waiting (as if each had the link in turn, a
// byte at a time), so that streams moving bulk data share the link byte
// for byte, and a request or response on a quiet stream goes ahead of
// them, behind sendSlots frames at most, however many they are.
//
// A writer never holds a slot while it waits for the peer's window: the
// Stream counts its window itself (its window size, less what it sent,
// plus the increments the peer granted, which the framer sees arrive) and
// asks for a slot only when the window has room for its frame.

const (
	// MaxFrameData is the most data one frame of a stream's write
	// carries: about 64 KiB, 130 µs at 500 MB/s. Each frame costs a
	// syscall and a hand-off to muxado's writer at one end, and a read
	// and a wake-up at the other: in 64 KiB frames, a bulk transfer
	// through the tunnel makes about 84 syscalls per MB at the edge,
	// where it made 133 in 32 KiB frames (datapath's bulk row; a plain
	// relay makes 124). It leaves room for the frame's header and the
	// window updates written with it, so that over TLS a frame fills four
	// whole records (16 KiB of plaintext each) rather than spilling a few
	// bytes into a fifth, which BatchWrites writes in one syscall.
	MaxFrameData = 4*tlsRecord - headerSize - maxHeld*wndIncSize

	// tlsRecord is the most plaintext a TLS record carries.
	tlsRecord = 16 << 10

	// sendSlots is how many frames of data may be on their way to the
	// framer at once: enough that it always has the next one (one being
	// written, one waiting). A frame on a quiet stream waits behind these
	// at most: 128 KiB, as four frames of 32 KiB did before frames grew.
	sendSlots = 2
)

// scheduler hands out the slots of a session's send queue.
type scheduler struct {
	mu      sync.Mutex
	used    int         // slots held
	now     uint64      // virtual time
	waiting waiterQueue // by virtual finish
	seq     uint64      // arrivals, to break ties in order
}

// waiter is a writer waiting for a slot.
type waiter struct {
	start, finish, seq uint64
	size               int
	ready              chan struct{}
}

// acquire waits for a slot for a frame of size bytes of st's, and returns
// when it may write it.
func (s *scheduler) acquire(st *Stream, size int) {
	s.mu.Lock()
	start := max(st.finish, s.now)
	st.finish = start + uint64(size)
	if s.used < sendSlots && len(s.waiting) == 0 {
		s.used++
		s.advance(start, size)
		s.mu.Unlock()
		return
	}
	s.seq++
	w := &waiter{start: start, size: size, finish: st.finish, seq: s.seq, ready: make(chan struct{})}
	heap.Push(&s.waiting, w)
	s.mu.Unlock()
	<-w.ready
}

// release gives a slot back, to the waiting frame of the smallest virtual
// finish.
func (s *scheduler) release() {
	s.mu.Lock()
	if len(s.waiting) == 0 {
		s.used--
		s.mu.Unlock()
		return
	}
	w := heap.Pop(&s.waiting).(*waiter)
	s.advance(w.start, w.size)
	s.mu.Unlock()
	close(w.ready) // the slot passes on: used stays as it is
}

// advance moves the virtual time on for a frame of size bytes that
// started at start, shared among the streams that wait. The caller holds
// mu.
func (s *scheduler) advance(start uint64, size int) {
	s.now = max(s.now, start) + uint64(size)/uint64(len(s.waiting)+1)
}

// waiterQueue is a min-heap of waiters by virtual finish, then arrival.
type waiterQueue []*waiter

func (q waiterQueue) Len() int { return len(q) }
func (q waiterQueue) Less(i, j int) bool {
	if q[i].finish != q[j].finish {
		return q[i].finish < q[j].finish
	}
	return q[i].seq < q[j].seq
}
func (q waiterQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *waiterQueue) Push(x any)   { *q = append(*q, x.(*waiter)) }
func (q *waiterQueue) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return w
}

// send writes b to the peer through the session's scheduler: in frames of
// at most MaxFrameData bytes, each within the stream's window. The
// caller holds st.wmu.
func (st *Stream) send(b []byte) (int, error) {
	n := 0
	defer st.pending.Store(0)
	for len(b) > 0 {
		st.pending.Store(int64(len(b)))
		avail := st.sess.window + st.granted.Load() - st.sent.Load()
		if avail <= 0 {
			if err := st.waitWindow(); err != nil {
				return n, err
			}
			continue
		}
		chunk := int(min(int64(len(b)), MaxFrameData, avail))
		st.sess.sched.acquire(st, chunk)
		st.queued.Store(true)
		st.sess.queued.Add(1)
		m, err := st.write(b[:chunk])
		st.sess.unqueue(st)
		st.sess.sched.release()
		st.sent.Add(int64(m))
		n += m
		if err != nil {
			return n, err
		}
		b = b[m:]
	}
	return n, nil
}

// write writes b, which the stream's window has room for, as one DATA
// frame. The frame goes to the framer from the writer's own goroutine,
// not through muxado's writer goroutine: a hand-off there and back again
// costs two wake-ups of a goroutine per frame, which in a process that is
// not busy are wake-ups of a thread (a futex call each way). With them, a
// 64-byte round trip through the tunnel cost the edge and the agent
// 117-122 µs of CPU each; without them, 97-108 (datapath's rtt row).
//
// muxado's own write is kept where its semantics matter: while a write
// deadline is set (muxado applies it while the frame waits for its
// writer; a frame written here waits for the framer's lock and the
// socket, which no deadline bounds), and once the stream ended (muxado's
// write then fails with the error of how it ended). muxado's window of
// the stream does not shrink for frames written here, and grows with the
// peer's grants for them: it only ever lets through what send's own count
// of the window allows.
//
// The first frame of a stream opened here carries the SYN. muxado sends
// it with the stream's first write, which marks the SYN sent even when it
// writes nothing: an empty write marks it, and the frame written here
// carries the flag. It is claimed so before the look at whether the stream
// ended: a Close with a write under way resets the stream, ending it
// before muxado's Close, which sends the SYN with its FIN when nothing
// claimed it. Claimed here first, the SYN is this frame's and muxado's FIN
// carries none; claimed there first, the stream is seen ended here, and
// its SYN is not sent twice (a second SYN ends the peer's session). The
// caller holds st.wmu.
func (st *Stream) write(b []byte) (int, error) {
	defer st.synced.Store(true)
	var flags frame.Flags
	if !st.deadline && !st.synced.Load() {
		if hook := testHookClaimSyn.Load(); hook != nil {
			(*hook)(st)
		}
		st.Stream.Write(nil)
		flags.Set(frame.FlagDataSyn)
	}
	if st.deadline || st.over() {
		return st.Stream.Write(b)
	}
	if hook := testHookFirstFrame.Load(); hook != nil && flags != 0 {
		(*hook)(st)
	}
	if err := st.sess.fr.writeData(frame.StreamId(st.Id()), flags, b, &st.shut); err != nil {
		return 0, err
	}
	return len(b), nil
}

// testHookFirstFrame, when set, runs between muxado marking a stream's
// SYN sent and the frame that carries it. (Atomic: the sessions of other
// tests may still be writing while a test sets it.)
var testHookFirstFrame atomic.Pointer[func(*Stream)]

// testHookClaimSyn, when set, runs just before a stream's first frame
// written here claims the stream's SYN from muxado (its empty Write).
var testHookClaimSyn atomic.Pointer[func(*Stream)]

// Writing frames together. The framer gets one frame at a time, and a
// frame written alone costs a syscall. So while other DATA frames are on
// their way to the framer (their writers wait for its lock, or for
// muxado's writer: they queued while the framer wrote), the framer holds
// a small frame back and writes it with them, in one Write. A frame is
// held only while another is on its way, which the framer gets next (or
// its writer fails, and then lets the framer know): it never waits for a
// frame that may not come. (Frames queue only while a Write takes time: a
// busy socket. Yielding before the last frame to let ready writers join
// it wrote 1.2 times per small HTTP request where this writes 1.9, but a
// yield is a whole round of a loaded scheduler, and a session's requests
// under attack then waited for seconds.)
//
// The count: send counts a frame in (Session.queued, and the stream's
// queued flag) before it writes it; the framer counts it out as it writes
// (or holds) it, and so does its writer once the write returned, if the
// framer did not (the write failed, or muxado split the frame). Each
// is counted out once: whoever counts the last one out while frames are
// held writes them (hooks.hold, Session.unqueue).

// hold tells the framer whether to hold a frame back: whether other DATA
// frames are on their way. A DATA frame of a stream's write is counted out
// here. The framer calls it under its lock.
func (s *Session) hold(id uint32, data bool) bool {
	if data {
		if v, ok := s.streams.Load(id); ok && v.(*Stream).queued.CompareAndSwap(true, false) {
			return s.queued.Add(-1) > 0
		}
	}
	return s.queued.Load() > 0
}

// unqueue counts st's frame out once its write returned, if the framer
// did not, and has the frames held back written when it was the last one
// on its way. That is rare (the write failed, or muxado split its frame),
// and the connection may be stalled (a write deadline passed): the frames
// are written by a goroutine of their own, so that the writer returns
// now.
func (s *Session) unqueue(st *Stream) {
	if st.queued.CompareAndSwap(true, false) && s.queued.Add(-1) == 0 {
		go s.fr.flush()
	}
}

// waitWindow waits until the peer grants window, or the stream or its
// session ends (then the write fails as muxado's would).
func (st *Stream) waitWindow() error {
	select {
	case <-st.windowed:
		return nil
	case <-st.ended:
		return errStreamClosed
	}
}

// grant counts a window increment of the peer's for st.
func (st *Stream) grant(inc uint32) {
	st.granted.Add(int64(inc))
	select {
	case st.windowed <- struct{}{}:
	default:
	}
}

// end wakes a writer waiting for window, and a reader waiting for bytes:
// the stream, or its session, is over.
func (st *Stream) end() {
	st.endOnce.Do(func() {
		st.rx.stop(false)
		close(st.ended)
	})
}

// over tells whether the stream or its session ended.
func (st *Stream) over() bool {
	select {
	case <-st.ended:
		return true
	default:
		return false
	}
}
