package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.ngrok.com/muxado/v2/frame"
)

// Framer tuning.
const (
	// readBufferSize is the framer's read buffer. It holds many small
	// frames (an HTTP request or response and the window updates around
	// it); the bodies of large frames are read past it. A framer holds one
	// only while it has bytes in it (see connReader).
	readBufferSize = 4 << 10

	// windowHold is how much window a stream's reader may have consumed
	// before the framer sends the update at once rather than with the next
	// frame. It must be well below the window: held updates keep at most
	// windowHold of a stream's window from its sender, so the sender
	// always has window-windowHold to send into once the reader has read.
	// It is at most half of MinWindow: what NewFramer holds, not knowing
	// the window. A Session's framer holds a quarter of its window (see
	// sessionHold).
	windowHold = DefaultWindow / 8

	// maxHeld bounds the streams with held window updates.
	maxHeld = 16

	// copyLimit is the largest payload the framer copies to write it with
	// its header in one Write; larger ones go as net.Buffers (writev) to a
	// kernel socket. To any other writer (a TLS conn, whose every Write
	// makes records of its own), every payload is copied: one Write a
	// frame.
	copyLimit = 16 << 10

	// maxOut is the most bytes of frames the framer holds back to write
	// them with the frames on their way (see hooks.hold).
	maxOut = 32 << 10
)

// Sizes of the muxado frame layout: an 8-byte header (24-bit length, 4-bit
// type, 4-bit flags, 32-bit stream ID), then the body; WNDINC and RST have
// a 4-byte body.
const (
	headerSize    = 8
	wndIncSize    = headerSize + 4
	rstSize       = headerSize + 4
	maxLength     = 1<<24 - 1
	wndIncMaxIncr = 1<<31 - 1
)

// NewFramer returns a muxado framer that cuts the syscalls per frame: it
// reads through a buffer (held only while bytes wait in it: see
// connReader), writes each frame's header and payload in one Write, and
// holds back small window updates to send them with the next
// frame written (or alone once a stream's held update reaches windowHold).
// (A Session's framer also writes the frames of several streams in one
// Write: see hold.)
// Each frame is encoded exactly as the stock framer does; only window
// updates are sent later, and those of one stream merged into one, so
// either end may use the stock framer.
//
// Once a write failed, or a GOAWAY was written, WriteFrame fails without
// looking at the frame it is given. muxado sends GOAWAY only as the session
// dies (tunnelkit never calls the session's own GoAway method), and then may
// still hand the framer frames whose writers gave up and are packing them
// anew; reading those would be a data race (the stock
// framer gets away with it because its first touch is a Write on the closed
// transport, which fails before reading anything).
//
// As muxado uses it, ReadFrame and WriteFrame each run in one goroutine;
// writes are serialised with a mutex so that a Session can inject frames
// of its own between them.
func NewFramer(r io.Reader, w io.Writer) frame.Framer {
	return newFramer(r, w, windowHold)
}

// sessionHold is the windowHold of a session whose streams have window
// bytes of window each: a quarter of it, so that a stream's sender always
// has three quarters of its window to send into, and its reader's updates
// cost a frame every quarter window (a write at one end and a read at the
// other; 16 per MiB of a download at the default window).
func sessionHold(window uint32) uint32 { return window / 4 }

func newFramer(r io.Reader, w io.Writer, hold uint32) *framer {
	_, writev := w.(syscall.Conn)
	f := &framer{mu: make(turns, 1), w: w, windowHold: hold, writev: writev, batch: batchOf(w)}
	f.cr = newConnReader(r)
	f.stock = frame.NewFramer(f.cr, w)
	f.held = f.heldArr[:0]
	return f
}

// hooks are what a framer tells its Session of the frames it reads and
// writes. They are the Session's methods, behind one interface value: a
// func field each would cost an allocation each per session.
type hooks interface {
	// peerReset is called from the reader with the stream ID of each RST
	// frame read; ended once reading fails (the session is over). Both
	// must not block.
	peerReset(id uint32)
	ended()
	received(id uint32, n int)               // with each DATA frame's length, before its payload is read
	granted(id, inc uint32)                  // with each WNDINC frame read, before muxado counts it
	opened()                                 // with each DATA frame that opens a stream, before muxado sees it
	refused(id uint32, code frame.ErrorCode) // with the stream ID and code of each RST frame muxado writes
	goneAway()                               // with each GOAWAY frame read

	// take is offered each DATA frame's payload, after opened and
	// received: when it takes it (reading all n bytes of body), muxado
	// gets the frame without its payload, with its flags (see recv.go).
	// ready is how many of the payload's bytes the framer read already.
	take(id uint32, syn, fin bool, n int, body io.Reader, ready int) (bool, error)

	// hold is asked under the framer's mu, for each frame to write,
	// whether more frames are on their way to the framer: then the frame
	// waits to be written with them, in one Write. data says whether it
	// is a DATA frame of stream id. Whoever makes hold answer false from
	// then on (the last frame on its way was written, or will not be)
	// must call flush.
	hold(id uint32, data bool) bool
}

type framer struct {
	mu turns // held by writes: muxado's writer goroutine, a Stream's (writeData), and inject; let go with unlock

	// s, if set, is told of the frames read and written (see hooks); a
	// framer of its own (NewFramer) has none.
	s hooks

	frames atomic.Uint64 // frames read: the peer is alive while it grows

	// stock reads every frame (through the buffer) and writes the frames
	// this framer does not encode itself (GOAWAY).
	stock      frame.Framer
	cr         *connReader // what stock reads
	w          io.Writer
	writev     bool       // w is a kernel socket: large payloads go as net.Buffers
	batch      *batchConn // beneath w, a TLS conn: a frame's records go in one Write (batch.go)
	windowHold uint32

	hmu     sync.Mutex // guards held; taken under mu, or alone by grant
	held    []heldInc  // window updates not sent yet, one per stream (rarely more: see addHeld)
	heldArr [maxHeld]heldInc
	urgent  atomic.Bool // held has an update that must go now, or a PING or PONG is owed: whoever lets go of mu writes it (see grant)
	ping    atomic.Bool // a PING frame is owed (Session.Ping)
	pong    atomic.Bool // a PONG frame is owed: the peer sent a PING
	out     *[]byte     // frames encoded and held back (see hold), from writeBuffers; nil: none

	err error // the first write error, or errGoneAway: every later write fails with it
}

var errGoneAway = errors.New("wire: session going away")

type heldInc struct {
	id  frame.StreamId
	inc uint32
}

func (f *framer) ReadFrame() (frame.Frame, error) {
	fr, err := f.stock.ReadFrame()
	f.frames.Add(1)
	switch {
	case f.s == nil:
	case err != nil:
		f.s.ended()
	case fr.Type() == frame.TypeData:
		d, ok := fr.(*frame.Data)
		if !ok {
			break
		}
		if d.Syn() {
			f.s.opened()
		}
		if n := fr.Length(); n > 0 {
			f.s.received(uint32(fr.StreamId()), int(n))
		}
		if err := f.takeData(d); err != nil {
			f.s.ended()
			return nil, err
		}
	case fr.Type() == frame.TypeRst:
		f.s.peerReset(uint32(fr.StreamId()))
	case fr.Type() == frame.TypeWndInc:
		if wi, ok := fr.(*frame.WndInc); ok {
			f.s.granted(uint32(fr.StreamId()), wi.WindowIncrement())
		}
	case fr.Type() == frame.TypeGoAway:
		f.s.goneAway()
	case fr.Type() == typePing && fr.Flags()&flagPong == 0:
		f.owe(&f.pong)
	}
	return fr, err
}

// typePing is the type of PING and PONG frames (PingFrameVersion): the
// last of the 16 a frame header has room for, which muxado v2 leaves
// undefined, and reads as a frame of an unknown type, which it drops. A
// PONG is a PING frame with flagPong. Both are a header alone: no stream
// (ID 0), no payload.
const (
	typePing frame.Type  = 0xF
	flagPong frame.Flags = 0x1
)

// owe marks a PING or PONG frame as owed, and writes it now if the framer
// is free, else leaves it to whoever holds it, as grant does: neither the
// reader nor a Pinger's timer ever waits for the framer (a write stalled
// on the connection holds it).
func (f *framer) owe(due *atomic.Bool) {
	due.Store(true)
	f.urgent.Store(true)
	f.flushUrgent()
}

// takeData offers d's payload to the Session's take; when taken, d is packed anew
// without it, with its flags (the stock framer packs d anew with each
// frame it reads). An error ends the session.
func (f *framer) takeData(d *frame.Data) error {
	syn, fin := d.Syn(), d.Fin()
	taken, err := f.s.take(uint32(d.StreamId()), syn, fin, int(d.Length()), d.Reader(), f.cr.w-f.cr.r)
	if err != nil || !taken {
		return err
	}
	return d.Pack(d.StreamId(), nil, fin, syn)
}

func (f *framer) WriteFrame(fr frame.Frame) error {
	f.mu.Lock()
	defer f.unlock()
	if f.err != nil {
		return f.err
	}
	switch fr := fr.(type) {
	case *frame.Data:
		p := fr.Bytes()
		if int(fr.Length()) != len(p) || len(p) > maxLength {
			break
		}
		return f.data(fr.StreamId(), fr.Flags(), p)
	case *frame.WndInc:
		if f.addHeld(fr.StreamId(), fr.WindowIncrement()) {
			return f.write(nil, nil, f.holding())
		}
		return nil
	case *frame.Rst:
		if f.s != nil {
			f.s.refused(uint32(fr.StreamId()), fr.ErrorCode())
		}
		var b [rstSize]byte
		putHeader(b[:], 4, frame.TypeRst, 0, fr.StreamId())
		binary.BigEndian.PutUint32(b[headerSize:], uint32(fr.ErrorCode()))
		return f.write(b[:], nil, f.holding())
	}
	if err := f.write(nil, nil, false); err != nil {
		return err
	}
	err := f.stock.WriteFrame(fr)
	if _, ok := fr.(*frame.GoAway); ok && err == nil {
		f.err = errGoneAway
	} else if err != nil {
		f.err = err
	}
	return err
}

// writeData writes a DATA frame of stream id with flags and payload p, as
// WriteFrame writes one muxado's writer hands it. It fails without
// writing once shut is set: the stream's FIN may be on the wire, and
// nothing of the stream may follow it (see Stream.CloseWrite).
func (f *framer) writeData(id frame.StreamId, flags frame.Flags, p []byte, shut *atomic.Bool) error {
	f.mu.Lock()
	defer f.unlock()
	if f.err != nil {
		return f.err
	}
	if shut.Load() {
		return errStreamClosed
	}
	return f.data(id, flags, p)
}

// data writes a DATA frame of stream id with flags and payload p, or
// holds it back (see hold). The caller holds mu. The framer does not
// yield to let other writers catch up: under a loaded scheduler a yield
// is a whole round of it, and the requests of a session under attack then
// waited for seconds (TestStalledReadersHoldTheirBound).
func (f *framer) data(id frame.StreamId, flags frame.Flags, p []byte) error {
	var b [headerSize]byte
	putHeader(b[:], len(p), frame.TypeData, flags, id)
	return f.write(b[:], p, f.s != nil && f.s.hold(uint32(id), true))
}

// inject writes frames encoded by the caller between two of muxado's
// frames, with the held window updates. It is how a Session resets a
// stream (muxado offers no way to send a RST).
func (f *framer) inject(frames []byte) error {
	f.mu.Lock()
	defer f.unlock()
	if f.err != nil {
		return f.err
	}
	return f.write(frames, nil, false)
}

// flush writes the frames held back, if any (see hold).
func (f *framer) flush() error {
	f.mu.Lock()
	defer f.unlock()
	if f.err != nil || f.out == nil {
		return f.err
	}
	return f.write(nil, nil, false)
}

// holding asks hold about a frame that is not a stream's DATA. The caller
// holds mu.
func (f *framer) holding() bool {
	return f.s != nil && f.s.hold(0, false)
}

// addHeld adds inc to the window update held for stream id, and reports
// whether the held updates must be written now: this one reached
// windowHold, or maxHeld streams have one held. (A stream's update whose
// sum would overflow a WNDINC frame is held as a second one.)
func (f *framer) addHeld(id frame.StreamId, inc uint32) (now bool) {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	for i := range f.held {
		h := &f.held[i]
		if h.id != id {
			continue
		}
		if uint64(h.inc)+uint64(inc) > wndIncMaxIncr {
			break
		}
		h.inc += inc
		return h.inc >= f.windowHold
	}
	f.held = append(f.held, heldInc{id, inc})
	return inc >= f.windowHold || len(f.held) >= maxHeld
}

// grant holds a window update of inc for stream id, from a Stream's Read
// (see recv.go), without waiting for the framer: a Read must not wait
// behind a frame being written, nor a write stalled on the connection.
// When the held updates must go now, it writes them if the framer is
// free, else leaves them to whoever holds it, which writes them as it lets
// go (unlock).
func (f *framer) grant(id frame.StreamId, inc uint32) {
	if f.addHeld(id, inc) {
		f.urgent.Store(true)
		f.flushUrgent()
	}
}

// flushUrgent writes the held window updates while they are urgent and
// the framer is free. Whoever sets urgent then calls it; whoever holds
// the framer calls it once it let go: between the two, one finds the
// framer free, and writes them.
func (f *framer) flushUrgent() {
	for f.urgent.Load() {
		select {
		case f.mu <- struct{}{}:
		default:
			return // its holder writes them as it lets go
		}
		if f.err != nil {
			f.urgent.Store(false) // nothing more is written
		} else if f.urgent.Load() {
			f.write(nil, nil, f.holding())
		}
		<-f.mu
	}
}

// unlock lets go of the framer, and writes the window updates that became
// urgent meanwhile.
func (f *framer) unlock() {
	f.mu.Unlock()
	if f.urgent.Load() {
		f.flushUrgent()
	}
}

var writeBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, maxHeld*wndIncSize+rstSize+copyLimit)
	return &b
}}

// write writes the frames held back, the held window updates, then head
// and payload: in one Write when the payload is small, as net.Buffers
// when it is large. With later, a small frame is held back instead (see
// hold), unless maxOut bytes are held already.
func (f *framer) write(head, payload []byte, later bool) error {
	f.hmu.Lock()
	if len(f.held) == 0 && len(head) == 0 && f.out == nil && !f.ping.Load() && !f.pong.Load() {
		f.urgent.Store(false)
		f.hmu.Unlock()
		return nil
	}
	bp := f.out
	if bp == nil {
		bp = writeBuffers.Get().(*[]byte)
	}
	b := *bp
	for _, h := range f.held {
		var u [wndIncSize]byte
		putHeader(u[:], 4, frame.TypeWndInc, 0, h.id)
		binary.BigEndian.PutUint32(u[headerSize:], h.inc)
		b = append(b, u[:]...)
	}
	f.held = f.held[:0]
	f.urgent.Store(false)
	f.hmu.Unlock()
	for _, owed := range [...]struct {
		due   *atomic.Bool
		flags frame.Flags
	}{{&f.ping, 0}, {&f.pong, flagPong}} {
		if owed.due.Swap(false) {
			var h [headerSize]byte
			putHeader(h[:], 0, typePing, owed.flags, 0)
			b = append(b, h[:]...)
		}
	}
	b = append(b, head...)
	var err error
	if len(payload) <= copyLimit || !f.writev {
		b = append(b, payload...)
		if later && len(b) < maxOut {
			*bp = b
			f.out = bp
			return nil
		}
		if f.batch != nil && len(b) > tlsRecord {
			f.batch.open()
			_, err = f.w.Write(b)
			if ferr := f.batch.flush(); err == nil {
				err = ferr
			}
		} else {
			_, err = f.w.Write(b)
		}
	} else {
		bufs := net.Buffers{b, payload}
		_, err = bufs.WriteTo(f.w)
	}
	*bp = b[:0]
	f.out = nil
	writeBuffers.Put(bp)
	if err != nil {
		f.err = err
	}
	return err
}

// turns is a lock that passes to those waiting for it in the order they
// came (a full channel hands its slot to the first sender waiting). A
// sync.Mutex lets whoever asks at the moment it is unlocked take it: the
// goroutine that unlocked it, still running, ahead of the waiter it woke,
// for up to a millisecond before the mutex turns fair. The framer's lock
// is held for a whole frame's write, and a stream moving bulk data asks
// for it again at once; with turns, a quiet stream's frame that waited
// for one of its frames goes before the next, as it did in muxado's
// writer queue (a channel too). (On this 2-core machine, datapath's
// interactive row did not tell the two apart: the bytes in flight in the
// session's socket buffers set its figure.)
type turns chan struct{}

func (t turns) Lock()   { t <- struct{}{} }
func (t turns) Unlock() { <-t }

func putHeader(b []byte, length int, t frame.Type, flags frame.Flags, id frame.StreamId) {
	b[0] = byte(length >> 16)
	b[1] = byte(length >> 8)
	b[2] = byte(length)
	b[3] = byte(t)<<4 | byte(flags)&0x0f
	binary.BigEndian.PutUint32(b[4:8], uint32(id))
}
