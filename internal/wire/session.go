package wire

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"golang.ngrok.com/muxado/v2"
	"golang.ngrok.com/muxado/v2/frame"
)

// Session is a muxado session whose streams can be reset: closed at once,
// even while a write of theirs waits for the peer's window.
//
// muxado v2.0.2 has no reset a user can send: Stream.Close half-closes
// first, and that waits for the stream's write lock, which a Write holds
// while it waits for window; a peer that stopped reading (an app that
// answered without reading an upload) so holds Close forever. A Session
// resets a stream by writing, through its framer, a RST for the stream and
// then an empty DATA frame for it. The RST ends the stream at the peer; the
// DATA frame, arriving for a stream the peer no longer has, makes the peer
// answer with a RST of its own (every muxado v2 peer does), which ends the
// stream here, failing the write that waited. Both frames are muxado's own,
// so the peer needs nothing of this package.
type Session struct {
	muxado.Session
	fr *framer

	// The goroutines Close waits for: resets under way, and AfterReset
	// funcs running. A count under a lock rather than a WaitGroup: they
	// start while Close may be waiting (the session ending runs the
	// AfterReset funcs), which a WaitGroup forbids once its count is zero.
	gmu  sync.Mutex
	live int
	idle sync.Cond // on gmu: live reached zero

	wmu     sync.Mutex
	watched map[uint32]*Stream // streams with AfterReset funcs
	over    bool               // the session ended: every func ran
}

// NewSession starts a muxado session on conn, as the client (the agent) or
// the server (the edge), with streams of window bytes, and room for
// backlog streams the peer opened that wait to be accepted (zero:
// muxado's 128; a stream past it is reset).
func NewSession(conn net.Conn, window uint32, client bool, backlog uint32) *Session {
	s := &Session{}
	s.idle.L = &s.gmu
	cfg := &muxado.Config{
		MaxWindowSize: window,
		AcceptBacklog: backlog,
		NewFramer: func(r io.Reader, w io.Writer) frame.Framer {
			s.fr = newFramer(r, w, windowHold)
			s.fr.onReset = s.peerReset
			s.fr.onEnd = s.ended
			return s.fr
		},
	}
	if client {
		s.Session = muxado.Client(conn, cfg)
	} else {
		s.Session = muxado.Server(conn, cfg)
	}
	return s
}

// OpenStream opens a stream; see muxado's. Like every muxado stream, the
// peer sees it only once its first non-empty write is sent.
func (s *Session) OpenStream() (*Stream, error) {
	st, err := s.Session.OpenStream()
	if err != nil {
		return nil, err
	}
	return &Stream{Stream: st, sess: s}, nil
}

// AcceptStream returns the next stream the peer opened.
func (s *Session) AcceptStream() (*Stream, error) {
	st, err := s.Session.AcceptStream()
	if err != nil {
		return nil, err
	}
	return &Stream{Stream: st, sess: s}, nil
}

// Close closes the session, which fails every stream, and waits for the
// resets under way.
func (s *Session) Close() error {
	err := s.Session.Close()
	s.gmu.Lock()
	for s.live > 0 {
		s.idle.Wait()
	}
	s.gmu.Unlock()
	return err
}

// goTracked runs f in a goroutine that Close waits for.
func (s *Session) goTracked(f func()) {
	s.gmu.Lock()
	s.live++
	s.gmu.Unlock()
	go func() {
		defer s.untrack()
		f()
	}()
}

func (s *Session) untrack() {
	s.gmu.Lock()
	defer s.gmu.Unlock()
	if s.live--; s.live == 0 {
		s.idle.Broadcast()
	}
}

// resetFrames is what a reset writes: a RST for the stream, and an empty
// DATA frame (no flags) for it, which the peer answers with a RST.
func resetFrames(id uint32) []byte {
	b := make([]byte, rstSize+headerSize)
	putHeader(b, 4, frame.TypeRst, 0, frame.StreamId(id))
	binary.BigEndian.PutUint32(b[headerSize:], uint32(muxado.StreamCancelled))
	putHeader(b[rstSize:], 0, frame.TypeData, 0, frame.StreamId(id))
	return b
}

// reset ends st without waiting for its writers: its reads fail at once;
// the peer is told, and its answer fails a write that waits for window.
// The stream is then closed, in a goroutine Close waits for: a reset
// whose peer never answers ends with the session.
func (s *Session) reset(st muxado.Stream) {
	st.SetReadDeadline(time.Unix(1, 0))
	s.goTracked(func() {
		s.fr.inject(resetFrames(st.Id()))
		st.Close()
	})
}

// peerReset runs the AfterReset funcs of stream id: the peer reset it
// (or muxado did, for a frame that broke its rules).
func (s *Session) peerReset(id uint32) {
	s.wmu.Lock()
	st := s.watched[id]
	var fs []*resetWatch
	if st != nil {
		fs = st.watches
		st.watches = nil
		delete(s.watched, id)
	}
	fire(fs)
	s.wmu.Unlock()
	s.run(fs)
}

// ended runs every AfterReset func: the session is over.
func (s *Session) ended() {
	s.wmu.Lock()
	s.over = true
	var fs []*resetWatch
	for _, st := range s.watched {
		fs = append(fs, st.watches...)
		st.watches = nil
	}
	s.watched = nil
	fire(fs)
	s.wmu.Unlock()
	s.run(fs)
}

// fire marks watches as fired, under Session.wmu: their stop funcs no
// longer stop them.
func fire(ws []*resetWatch) {
	for _, w := range ws {
		w.fired = true
	}
}

// run starts the funcs of watches, fired, each in a goroutine of its own
// (the reader must not wait for them), which Close waits for.
func (s *Session) run(ws []*resetWatch) {
	for _, w := range ws {
		s.goTracked(w.f)
	}
}

// resetWatch is a func registered with AfterReset.
type resetWatch struct {
	f     func()
	fired bool // guarded by Session.wmu
}

// Stream is a stream of a Session: a muxado stream whose Close never waits
// behind a write stalled for window (it resets the stream instead), and
// which can be reset.
type Stream struct {
	muxado.Stream
	sess *Session

	mu      sync.Mutex
	writers int  // Write and CloseWrite calls under way
	closed  bool // Close or Reset was called

	watches []*resetWatch // guarded by sess.wmu
}

// AfterReset arranges for f to run, in a goroutine of its own, when the
// peer resets the stream (it cut the connection short) or the session
// ends, which a goroutine blocked elsewhere (writing to an app that reads
// nothing, say) would otherwise not see. f does not run once the stream
// was closed or reset here. stop unregisters f, and reports whether it
// stopped f from running, as context.AfterFunc's stop does.
func (st *Stream) AfterReset(f func()) (stop func() bool) {
	s := st.sess
	w := &resetWatch{f: f}
	s.wmu.Lock()
	if s.over {
		s.wmu.Unlock()
		s.run([]*resetWatch{w})
		return func() bool { return false }
	}
	if len(st.watches) == 0 {
		if s.watched == nil {
			s.watched = map[uint32]*Stream{}
		}
		s.watched[st.Id()] = st
	}
	st.watches = append(st.watches, w)
	s.wmu.Unlock()
	return func() bool {
		s.wmu.Lock()
		defer s.wmu.Unlock()
		if w.fired {
			return false
		}
		st.unwatchLocked(w)
		return true
	}
}

// unwatchLocked removes w (every watch, for nil) from st.
func (st *Stream) unwatchLocked(w *resetWatch) {
	kept := st.watches[:0]
	for _, o := range st.watches {
		if w != nil && o != w {
			kept = append(kept, o)
		}
	}
	st.watches = kept
	if len(kept) == 0 && st.sess.watched[st.Id()] == st {
		delete(st.sess.watched, st.Id())
	}
}

// unwatch forgets the AfterReset funcs of a stream closed here.
func (st *Stream) unwatch() {
	st.sess.wmu.Lock()
	defer st.sess.wmu.Unlock()
	if len(st.watches) > 0 {
		st.unwatchLocked(nil)
	}
}

var _ net.Conn = (*Stream)(nil)

// errStreamClosed is a Write after Close or Reset.
var errStreamClosed = &net.OpError{Op: "write", Net: "muxado", Err: net.ErrClosed}

// enter counts a writer in, unless the stream was closed.
func (st *Stream) enter() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.writers++
	return true
}

func (st *Stream) leave() {
	st.mu.Lock()
	st.writers--
	st.mu.Unlock()
}

// Write writes b; see muxado. It fails at once after Close or Reset.
func (st *Stream) Write(b []byte) (int, error) {
	if !st.enter() {
		return 0, errStreamClosed
	}
	defer st.leave()
	return st.Stream.Write(b)
}

// CloseWrite half-closes the stream: the peer reads EOF once it read what
// was written.
func (st *Stream) CloseWrite() error {
	if !st.enter() {
		return errStreamClosed
	}
	defer st.leave()
	return st.Stream.CloseWrite()
}

// SetWriteDeadline sets the deadline of later writes. muxado applies it
// only while a write hands its frame to the session, never while it waits
// for window; it is left as it is while a write is under way (muxado would
// wait for that write to end).
func (st *Stream) SetWriteDeadline(t time.Time) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed || st.writers > 0 {
		return nil
	}
	return st.Stream.SetWriteDeadline(t)
}

// SetDeadline sets the read and write deadlines (see SetWriteDeadline).
func (st *Stream) SetDeadline(t time.Time) error {
	st.Stream.SetReadDeadline(t)
	return st.SetWriteDeadline(t)
}

// Close closes the stream: at once when no write is under way (the peer
// reads EOF, and a later write of the peer's is answered with a reset),
// else it resets it. It never waits for the peer. Calling it again does
// nothing.
func (st *Stream) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	busy := st.writers > 0
	st.mu.Unlock()
	st.unwatch()
	if busy {
		st.sess.reset(st.Stream)
		return nil
	}
	return st.Stream.Close()
}

// Reset ends the stream at once, both ways, telling the peer that it was
// cut short rather than ended: the peer's reads and writes fail. Calling
// it after Close or again does nothing.
func (st *Stream) Reset() {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	st.closed = true
	st.mu.Unlock()
	st.unwatch()
	st.sess.reset(st.Stream)
}
