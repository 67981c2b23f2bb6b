package wire

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// Receiving. muxado's reader goroutine copies a DATA frame's payload into
// the stream's buffer, and the stream's Read copies it out and hands a
// window update for the bytes it read to muxado's writer goroutine: a
// wake-up of that goroutine (and of a thread, in a process that is not
// busy) for every Read, and a frame allocated. A Session's framer reads
// the payload itself, into the stream's recv, and gives muxado the frame
// without its payload (with its flags: muxado still sees a stream open
// and end); the Stream's Read takes the bytes from its recv and adds the
// window update to those the framer holds, from the reader's goroutine.
//
// muxado keeps the rest: a stream's state, its errors (a reset, the
// session's end, a Close), and the bytes of frames for streams it no
// longer has (it answers them with a RST). A Read that finds its recv
// stopped and drained asks muxado's stream, which returns its error.

// recv is what the peer sent on one stream that its reader has not read.
type recv struct {
	mu     sync.Mutex
	cond   sync.Cond  // signalled when bytes arrive, the stream ends, or the deadline changes or passes
	chunks []*[]byte  // unread bytes: (*chunks[0])[off:], then the whole of each other chunk
	first  [2]*[]byte // chunks' array while it holds two or fewer
	off    int
	n      int  // unread bytes in all
	fin    bool // the peer's FIN arrived: EOF once the bytes are read
	// stopped is set when the stream or its session ended (a reset
	// either way, a Close, the session's end): once the bytes are read
	// (or at once, if dropped), Read returns muxado's error.
	stopped bool
	dropped bool // closed or reset here: the bytes are gone, and more go to muxado
	waiting bool // a Read waits on cond

	deadline time.Time
	timer    *time.Timer
}

func newRecv() *recv {
	r := &recv{}
	r.cond.L = &r.mu
	return r
}

// errWindowPassed is a peer's DATA frame that its stream's window has no
// room for: the peer broke muxado's flow control, and the session ends
// (HTTP/2 allows a connection error for it).
var errWindowPassed = errors.New("wire: the peer sent a stream more than its window")

// fill reads a frame's payload of n bytes from body into r, and marks
// the end of the stream when fin is set; r holds at most window bytes
// unread. ready is how many of the payload's bytes were read from the
// connection already: those go into the room left in r's last chunk,
// under r's lock. The others go into chunks of their own, read without
// the lock, which a Read must not wait for. It takes nothing once the
// stream ended (the frame, which the peer sent after a reset, or before
// learning of a Close here, is muxado's to drop). The session's reader
// calls it; an error ends the session.
func (r *recv) fill(body io.Reader, n int, fin bool, window int64, ready int) (taken bool, err error) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return false, nil
	}
	if int64(r.n)+int64(n) > window {
		r.mu.Unlock()
		return false, errWindowPassed
	}
	if n <= ready {
		defer r.mu.Unlock()
		for n > 0 {
			var tail *[]byte
			if k := len(r.chunks); k > 0 {
				tail = r.chunks[k-1]
			}
			if tail == nil || len(*tail) == cap(*tail) {
				tail = getChunk(n)
				r.push(tail)
			}
			had := len(*tail)
			m := min(n, cap(*tail)-had)
			if _, err := io.ReadFull(body, (*tail)[had:had+m]); err != nil {
				return false, err
			}
			*tail = (*tail)[:had+m]
			r.n += m
			n -= m
		}
		r.fin = r.fin || fin
		r.wake()
		return true, nil
	}
	r.mu.Unlock()
	for n > 0 {
		c := getChunk(n)
		*c = (*c)[:min(n, cap(*c))]
		if _, err := io.ReadFull(body, *c); err != nil {
			putChunk(c)
			return false, err
		}
		n -= len(*c)
		r.mu.Lock()
		if r.dropped {
			putChunk(c)
		} else {
			r.push(c)
			r.n += len(*c)
			r.fin = r.fin || (fin && n == 0)
			r.wake()
		}
		r.mu.Unlock()
	}
	return true, nil
}

// push adds c to r's chunks. The caller holds mu.
func (r *recv) push(c *[]byte) {
	if r.chunks == nil {
		r.chunks = r.first[:0]
	}
	r.chunks = append(r.chunks, c)
}

// wake wakes a Read waiting. The caller holds mu.
func (r *recv) wake() {
	if r.waiting {
		r.cond.Broadcast()
	}
}

// stop marks the end of the stream or its session, and drops the bytes
// unread when drop is set (the stream was closed or reset here: nothing
// may read them, and more go to muxado).
func (r *recv) stop(drop bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if drop && !r.dropped {
		r.dropped = true
		r.release()
	}
	r.wake()
}

// release gives the chunks back. The caller holds mu.
func (r *recv) release() {
	for i, c := range r.chunks {
		putChunk(c)
		r.chunks[i] = nil
	}
	r.chunks, r.off, r.n = nil, 0, 0
}

// read copies unread bytes into b. It waits for some when there are
// none, unless the stream ended (more) or the deadline passed. With more
// set, the caller asks muxado's stream for its error: r has no bytes
// left for b and never will have.
func (r *recv) read(b []byte) (n int, more bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
			return 0, false, os.ErrDeadlineExceeded
		}
		switch {
		case r.dropped:
			return 0, true, nil
		case r.n > 0:
			return r.take(b), false, nil
		case r.fin:
			return 0, false, io.EOF
		case r.stopped:
			return 0, true, nil
		}
		r.waiting = true
		r.cond.Wait()
		r.waiting = false
	}
}

// take copies unread bytes into b, giving back each chunk it drains. The
// caller holds mu, and r.n > 0.
func (r *recv) take(b []byte) int {
	n := 0
	for n < len(b) && len(r.chunks) > 0 {
		c := r.chunks[0]
		m := copy(b[n:], (*c)[r.off:])
		n += m
		r.off += m
		if r.off < len(*c) {
			break
		}
		putChunk(c)
		r.chunks[0] = nil
		r.chunks = r.chunks[1:]
		r.off = 0
	}
	r.n -= n
	if r.n == 0 {
		// Nothing waits: hold no memory until the next frame.
		r.release()
	}
	return n
}

// setDeadline sets the deadline of Reads, and wakes one waiting so that
// it looks at it.
func (r *recv) setDeadline(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deadline = t
	if d := time.Until(t); !t.IsZero() && d > 0 {
		if r.timer == nil {
			r.timer = time.AfterFunc(d, r.expire)
		} else {
			r.timer.Reset(d)
		}
	} else if r.timer != nil {
		r.timer.Stop()
	}
	r.wake()
}

// expire wakes a Read waiting past the deadline.
func (r *recv) expire() {
	r.mu.Lock()
	r.wake()
	r.mu.Unlock()
}

// Chunks: the pieces of memory a recv holds its bytes in, of a few sizes,
// each from a pool of its own. A frame goes into the room left in the
// last chunk, then into a new chunk of the smallest size that holds what
// remains (or the largest): a stream holds at most about twice its unread
// bytes, and none while it has none.
var chunkSizes = [...]int{512, 4 << 10, 32 << 10, MaxFrameData}

var chunkPools [len(chunkSizes)]sync.Pool

// getChunk returns an empty chunk for n bytes, or for as many of them as
// the largest chunk holds. A chunk is a pointer, which goes back to its
// pool as it came (a slice would need a pointer of its own on each Put).
func getChunk(n int) *[]byte {
	for i, size := range chunkSizes {
		if n <= size || i == len(chunkSizes)-1 {
			if p, ok := chunkPools[i].Get().(*[]byte); ok {
				*p = (*p)[:0]
				return p
			}
			c := make([]byte, 0, size)
			return &c
		}
	}
	panic("unreachable")
}

// putChunk gives c back to its pool.
func putChunk(c *[]byte) {
	for i, size := range chunkSizes {
		if cap(*c) == size {
			*c = (*c)[:0]
			chunkPools[i].Put(c)
			return
		}
	}
}
