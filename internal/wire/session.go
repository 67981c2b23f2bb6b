package wire

import (
	"cmp"
	"container/list"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
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
	tr muxConn        // what muxado reads, writes and closes: conn, which tells the session when muxado closes it
	wg sync.WaitGroup // resets under way, and AfterReset funcs running

	wmu     sync.Mutex
	watched map[uint32]*Stream // streams with AfterReset funcs
	over    bool               // the session ended: every func ran

	// Unread bytes: what the peer sent that the session's streams have not
	// read yet, each stream's and all of them together, bounded by
	// maxUnread (see LimitUnread).
	streams   sync.Map // uint32 to *Stream: the open streams
	pmu       sync.Mutex
	pending   []pendingRecv // what the peer sent on the streams it opened that are not accepted yet; nil when none (see AcceptStream)
	unread    atomic.Int64
	maxUnread atomic.Int64 // zero: no bound
	onCut     atomic.Pointer[func(*Stream)]
	shedding  atomic.Bool // a cut is being chosen

	stalled stalledSends // streams whose writes are under way

	serving serving // Serve's state

	window int64        // each stream's window, both ways
	sched  scheduler    // the slots of the send path (see send.go)
	queued atomic.Int64 // DATA frames on their way that the framer has not seen yet (see send.go)
}

// NewSession starts a muxado session on conn, as the client (the agent) or
// the server (the edge), with streams of window bytes, and room for
// backlog streams the peer opened that wait to be accepted (zero:
// muxado's 128). Past it, muxado resets a stream; once Serve runs, the
// session stops reading instead, until there is room (see Serve).
func NewSession(conn net.Conn, window uint32, client bool, backlog uint32) *Session {
	s := &Session{window: int64(window), tr: muxConn{Conn: conn}}
	s.tr.s = s
	s.serving.backlog = int(backlog)
	if backlog == 0 {
		s.serving.backlog = defaultBacklog
	}
	cfg := &muxado.Config{
		MaxWindowSize: window,
		AcceptBacklog: backlog,
		// The framer reads and writes conn itself, not the transport
		// muxado hands it: it looks beneath for a socket or a TLS conn.
		NewFramer: func(io.Reader, io.Writer) frame.Framer {
			s.fr = newFramer(conn, conn, sessionHold(window))
			s.fr.s = s
			return s.fr
		},
	}
	if client {
		s.Session = muxado.Client(&s.tr, cfg)
	} else {
		s.Session = muxado.Server(&s.tr, cfg)
	}
	return s
}

// muxConn is the conn of a Session as muxado holds it. muxado closes
// its transport whenever its session dies, and only then: a read or write
// error, a frame that breaks its rules (handleFrame's errors, which reach
// no framer), a panic, or Close. So closing it is the one sign of the
// session's end that every cause gives, and it ends the Session: its
// streams, its AfterReset funcs, and Serve's done.
type muxConn struct {
	net.Conn
	s *Session
}

func (t *muxConn) Close() error {
	err := t.Conn.Close()
	t.s.ended()
	return err
}

// OpenStream opens a stream; see muxado's. Like every muxado stream, the
// peer sees it only once its first non-empty write is sent.
func (s *Session) OpenStream() (*Stream, error) {
	st, err := s.Session.OpenStream()
	if err != nil {
		return nil, err
	}
	return s.track(st, newRecv()), nil
}

// Open is OpenStream, for a net.Conn. (A Session's streams are its own:
// the payloads of their frames go to them, not to muxado's streams.)
func (s *Session) Open() (net.Conn, error) { return s.OpenStream() }

// Accept is AcceptStream, for a net.Conn.
func (s *Session) Accept() (net.Conn, error) { return s.AcceptStream() }

// AcceptStream returns the next stream the peer opened.
func (s *Session) AcceptStream() (*Stream, error) {
	ms, err := s.Session.AcceptStream()
	if err != nil {
		return nil, err
	}
	id := ms.Id()
	rx := s.pendingRecv(id, false)
	if rx == nil {
		rx = newRecv() // (a stream muxado queued is pending, unless a peer reused its ID)
	}
	st := s.track(ms, rx)
	s.pendingRecv(id, true) // after track: the framer finds rx under one ID or the other
	st.synced.Store(true)   // the peer sent the SYN
	return st, nil
}

func (s *Session) track(ms muxado.Stream, rx *recv) *Stream {
	st := &Stream{Stream: ms, sess: s, rx: rx, windowed: make(chan struct{}, 1), ended: make(chan struct{})}
	s.streams.Store(ms.Id(), st)
	return st
}

// take takes the payload of a DATA frame of stream id into the stream's
// recv (see recv.go): a new one, pending until the stream is accepted,
// when the frame opens the stream. A stream this session no longer has
// (closed or reset here, or by the peer) gets none: muxado drops the
// payload, and answers it with a RST.
func (s *Session) take(id uint32, syn, fin bool, n int, body io.Reader, ready int) (bool, error) {
	var rx *recv
	if syn {
		rx = newRecv()
		s.pmu.Lock()
		s.pending = append(s.pending, pendingRecv{id, rx})
		s.pmu.Unlock()
	} else if rx = s.recvOf(id); rx == nil {
		return false, nil
	}
	return rx.fill(body, n, fin, s.window, ready)
}

// recvOf returns the recv of stream id: a stream's, or a pending one's.
// AcceptStream moves a recv from pending to streams (stored there, then
// deleted from pending): a recv missed in both was moved between the two
// lookups, and the second look at streams finds it.
func (s *Session) recvOf(id uint32) *recv {
	if v, ok := s.streams.Load(id); ok {
		return v.(*Stream).rx
	}
	if hook := testHookRecvMissed.Load(); hook != nil {
		(*hook)()
	}
	if rx := s.pendingRecv(id, false); rx != nil {
		return rx
	}
	if v, ok := s.streams.Load(id); ok {
		return v.(*Stream).rx
	}
	return nil
}

// pendingRecv is the recv of a stream the peer opened that is not
// accepted yet.
type pendingRecv struct {
	id uint32
	rx *recv
}

// pendingRecv returns the recv of pending stream id, or nil, and with
// drop, forgets it. They are few (those accepted, or refused, next), and
// a session that has none holds no memory for them.
func (s *Session) pendingRecv(id uint32, drop bool) *recv {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	for i, p := range s.pending {
		if p.id != id {
			continue
		}
		if drop {
			s.pending = slices.Delete(s.pending, i, i+1)
			if len(s.pending) == 0 {
				s.pending = nil
			}
		}
		return p.rx
	}
	return nil
}

// testHookRecvMissed, when set, runs when recvOf did not find a stream
// among the streams, before it looks among the pending ones.
var testHookRecvMissed atomic.Pointer[func()]

// refused forgets what the peer sent on stream id, which muxado refused
// (it writes a RST for it: the accept queue was full, or the session is
// going away).
func (s *Session) refused(id uint32, code frame.ErrorCode) {
	s.pendingRecv(id, true)
	// The codes of a stream muxado turns away at its SYN, before queueing
	// it (and of nothing else): it counted among those opened.
	if code == frame.ErrorCode(muxado.StreamRefused) || code == frame.ErrorCode(muxado.AcceptQueueFull) {
		s.unopened()
	}
}

// goneAway ends the session: the peer sent GOAWAY. muxado would only stop
// opening streams to the peer and go on with the session, which then
// carries nothing this end opens (no public connection reaches an agent)
// while it holds everything bound to it. Every muxado peer closes its
// transport right after its GOAWAY anyway. Closing the conn ends muxado's
// reader, which closes the session (see muxConn).
func (s *Session) goneAway() { s.tr.Conn.Close() }

// defaultBacklog is muxado's accept queue when Config.AcceptBacklog is
// zero.
const defaultBacklog = 128

// Heard returns a count that grows with every frame the peer sends: a
// peer whose frames keep arriving is alive, even when the echo of a ping
// waits behind its data (see Heartbeat.Heard).
func (s *Session) Heard() uint64 { return s.fr.frames.Load() }

// Ping sends the peer a PING frame, which a peer of version
// PingFrameVersion or later answers with a PONG frame at once (see
// Heard); a peer of an earlier version drops it unanswered. It never
// waits: when a write holds the framer (it may be stalled on the
// connection), the frame goes right after that write.
func (s *Session) Ping() { s.fr.owe(&s.fr.ping) }

// LimitUnread bounds the bytes the session's streams may hold unread
// together: bytes the peer sent that no reader took yet, at most a window
// per stream. When a stream's data would pass max, the stream that has held
// unread bytes the longest (whose reader stalled first) is cut (reset), its
// bytes dropped, and
// cut is called with it (from the session's reader: it must not block).
// So many streams whose readers stalled (clients that stopped reading
// their downloads) hold max bytes at most, not a window each. Zero or
// negative: no bound.
//
// A stream holds its unread bytes in chunks (see recv.go): up to about
// twice what it counts here in memory, and none once it was read.
func (s *Session) LimitUnread(max int64, cut func(*Stream)) {
	if cut != nil {
		s.onCut.Store(&cut)
	}
	s.maxUnread.Store(max)
}

// received counts n bytes of a DATA frame for stream id, which its recv
// takes for the stream's reader, and cuts a stalled stream when the
// session's unread bytes pass their bound.
func (s *Session) received(id uint32, n int) {
	v, ok := s.streams.Load(id)
	if !ok {
		return // a stream closed here: muxado drops the bytes
	}
	st := v.(*Stream)
	if st.unread.Add(int64(n)) == int64(n) {
		st.heldSince.Store(time.Now().UnixNano()) // it held nothing unread
	}
	total := s.unread.Add(int64(n))
	if max := s.maxUnread.Load(); max > 0 && total > max && s.shedding.CompareAndSwap(false, true) {
		s.shed(max)
		s.shedding.Store(false)
	}
}

// shed cuts the streams that have held unread bytes the longest (their
// readers stalled first) until the unread bytes are within max. It runs in
// the session's reader, which reads nothing meanwhile: one pass over the
// streams, however many it cuts.
func (s *Session) shed(max int64) {
	var held []*Stream
	s.streams.Range(func(_, v any) bool {
		if st := v.(*Stream); st.unread.Load() > 0 {
			held = append(held, st)
		}
		return true
	})
	slices.SortFunc(held, func(a, b *Stream) int { return cmp.Compare(a.heldSince.Load(), b.heldSince.Load()) })
	for _, victim := range held {
		if s.unread.Load() <= max {
			return
		}
		victim.cut()
		if f := s.onCut.Load(); f != nil {
			(*f)(victim)
		}
	}
}

// granted counts a window increment the peer sent for stream id.
func (s *Session) granted(id uint32, inc uint32) {
	if v, ok := s.streams.Load(id); ok {
		v.(*Stream).grant(inc)
	}
}

// forget stops counting a stream closed or reset here: its unread bytes
// go with it.
func (s *Session) forget(st *Stream) {
	if _, ok := s.streams.LoadAndDelete(st.Id()); ok {
		s.unread.Add(-st.unread.Swap(0))
	}
	st.rx.stop(true)
	st.end()
	s.stalled.remove(st)
}

// Close closes the session, which fails every stream, runs the AfterReset
// funcs still registered, and waits for them and for the resets under way.
func (s *Session) Close() error {
	err := s.Session.Close()
	s.ended()
	s.wg.Wait()
	return err
}

// Over tells whether the session ended.
func (s *Session) Over() bool {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.over
}

// goLocked runs f in a goroutine Close waits for, unless the session is
// over: then in one it does not wait for (Close may be waiting already:
// the WaitGroup takes no Add then). The caller holds wmu.
func (s *Session) goLocked(f func()) {
	if s.over {
		go f()
		return
	}
	s.wg.Go(f)
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
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.over {
		st.Close() // the session is closed: so is the stream, at once
		return
	}
	s.wg.Go(func() {
		s.fr.inject(resetFrames(st.Id()))
		st.Close()
	})
}

// peerReset runs the AfterReset funcs of stream id: the peer reset it
// (or muxado did, for a frame that broke its rules).
func (s *Session) peerReset(id uint32) {
	if v, ok := s.streams.Load(id); ok {
		v.(*Stream).end()
	}
	s.wmu.Lock()
	st := s.watched[id]
	var fs []*resetWatch
	if st != nil {
		fs = st.watches
		st.watches = nil
		delete(s.watched, id)
	}
	s.runLocked(fs)
	s.wmu.Unlock()
}

// ended runs every AfterReset func: the session is over. Only the first
// call does anything.
func (s *Session) ended() {
	s.serveEnded()
	s.stalled.stop()
	s.streams.Range(func(_, v any) bool {
		v.(*Stream).end()
		return true
	})
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.over {
		return
	}
	var fs []*resetWatch
	for _, st := range s.watched {
		fs = append(fs, st.watches...)
		st.watches = nil
	}
	s.watched = nil
	s.runLocked(fs)
	s.over = true
}

// runLocked starts the funcs of watches, each in a goroutine of its own
// (the reader must not wait for them). The caller holds wmu.
func (s *Session) runLocked(ws []*resetWatch) {
	for _, w := range ws {
		w.fired = true
		s.goLocked(w.f)
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
	rx   *recv // what the peer sent (see recv.go)

	mu       sync.Mutex
	writers  int  // Write and CloseWrite calls under way
	closed   bool // Close or Reset was called
	deadline bool // a write deadline is set; read by the writes under way, which it cannot change under

	watches []*resetWatch // guarded by sess.wmu

	unread    atomic.Int64 // bytes the peer sent that Read has not returned
	heldSince atomic.Int64 // since when unread has not been back to zero, in Unix nanoseconds

	waiting      *list.Element // in sess.stalled while a write is under way; guarded by its mu
	waitingSince time.Time     // likewise

	// Sending (see send.go).
	wmu      sync.Mutex    // held by a Write: one at a time
	sent     atomic.Int64  // bytes written; written under wmu, read by the stalled check
	pending  atomic.Int64  // bytes of the Write under way not yet written; likewise
	finish   uint64        // the virtual finish of its last frame; guarded by sess.sched.mu
	granted  atomic.Int64  // window increments the peer sent
	queued   atomic.Bool   // its frame is counted in sess.queued (see send.go)
	synced   atomic.Bool   // its SYN was written (or the peer's received); set under wmu
	shut     atomic.Bool   // CloseWrite was called: no frame may follow its FIN
	windowed chan struct{} // a token when the peer granted window
	ended    chan struct{} // closed when the stream or its session ended
	endOnce  sync.Once
}

// Read reads what the peer sent. Once the stream ended other than by the
// peer's FIN (a reset, the session's end, a Close), and the bytes that
// came before are read, it returns muxado's error.
func (st *Stream) Read(b []byte) (int, error) {
	n, more, err := st.rx.read(b)
	if more {
		return st.Stream.Read(b)
	}
	if n > 0 {
		st.sess.fr.grant(frame.StreamId(st.Id()), uint32(n))
		// Uncount what was counted: the bytes of a stream's first frame,
		// which arrive before the stream is known here, never were.
		for {
			u := st.unread.Load()
			d := min(int64(n), u)
			if d <= 0 || st.unread.CompareAndSwap(u, u-d) {
				if d > 0 {
					st.sess.unread.Add(-d)
				}
				break
			}
		}
	}
	return n, err
}

// AfterReset arranges for f to run, in a goroutine of its own, when the
// peer resets the stream (it cut the connection short), when the session
// cuts it for one of its bounds (LimitUnread, LimitStalled), or when the
// session ends, which a goroutine blocked elsewhere (writing to an app
// that reads nothing, say) would otherwise not see. f does not run once
// the stream was closed or reset here. stop unregisters f, and reports whether it
// stopped f from running, as context.AfterFunc's stop does.
func (st *Stream) AfterReset(f func()) (stop func() bool) {
	s := st.sess
	w := &resetWatch{f: f}
	s.wmu.Lock()
	if s.over {
		w.fired = true
		s.goLocked(w.f)
		s.wmu.Unlock()
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
	if st.writers++; st.writers == 1 {
		st.sess.stalled.add(st) // takes the session's lock under st.mu: never the other way
	}
	return true
}

func (st *Stream) leave() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.writers--; st.writers == 0 {
		st.sess.stalled.remove(st)
	}
}

// Write writes b, in frames of at most MaxFrameData bytes, taking turns
// with the session's other streams (see send.go); see muxado. It fails at
// once after Close or Reset, and ends when the stream ends.
func (st *Stream) Write(b []byte) (int, error) {
	if !st.enter() {
		return 0, errStreamClosed
	}
	defer st.leave()
	st.wmu.Lock()
	defer st.wmu.Unlock()
	return st.send(b)
}

// CloseWrite half-closes the stream: the peer reads EOF once it read what
// was written. A write after it fails; one made at the same time, from
// another goroutine, is written before the FIN or fails.
func (st *Stream) CloseWrite() error {
	if !st.enter() {
		return errStreamClosed
	}
	defer st.leave()
	if !st.synced.Load() {
		// A first write under way sends the stream's SYN, which muxado
		// counts as sent already: the FIN must wait for it.
		st.wmu.Lock()
		defer st.wmu.Unlock()
	}
	st.shut.Store(true)
	return st.Stream.CloseWrite()
}

// SetWriteDeadline sets the deadline of later writes. While one is set,
// writes go through muxado's writer (see Stream.write), and muxado applies
// it only while a write hands its frame to the session, never while it
// waits for window; it is left as it is while a write is under way
// (muxado would wait for that write to end).
func (st *Stream) SetWriteDeadline(t time.Time) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed || st.writers > 0 {
		return nil
	}
	st.deadline = !t.IsZero()
	return st.Stream.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline of reads.
func (st *Stream) SetReadDeadline(t time.Time) error {
	st.rx.setDeadline(t)
	return st.Stream.SetReadDeadline(t) // for the error Read gets from muxado's stream once it ended
}

// SetDeadline sets the read and write deadlines (see SetWriteDeadline).
func (st *Stream) SetDeadline(t time.Time) error {
	st.SetReadDeadline(t)
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
	st.sess.forget(st)
	if busy {
		st.sess.reset(st.Stream)
		return nil
	}
	return st.Stream.Close()
}

// cut resets the stream for a bound of its session's, and runs its
// AfterReset funcs: whoever serves the stream is blocked elsewhere (its
// writer waits for the peer's window) and must let go of what it holds.
func (st *Stream) cut() {
	s := st.sess
	s.wmu.Lock()
	fs := st.watches
	st.watches = nil
	if s.watched[st.Id()] == st {
		delete(s.watched, st.Id())
	}
	s.runLocked(fs)
	s.wmu.Unlock()
	st.Reset()
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
	st.sess.forget(st)
	st.sess.reset(st.Stream)
}
