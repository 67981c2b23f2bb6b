package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"
	"golang.ngrok.com/muxado/v2/frame"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// The contract with muxado: one test for each behaviour of muxado v2.0.2
// that the package doc lists under "What it takes from muxado", named
// there, and naming its item here. Each runs a stock muxado session (its
// own framer, wrapped to watch what muxado asks of it) against a peer that
// writes and reads frames one by one with the stock framer (rawPeer), over
// loopback TCP, or over net.Pipe where a transport must stall. The tests
// wait for events: the frames the session writes, above all the answer to
// a probe (rawPeer.probe), which tells that it handled every frame sent
// before. contractBound only ends a test that would fail anyway.

// contractBound bounds each wait of these tests.
const contractBound = 10 * time.Second

// mxFrame is a frame as it went over the wire, its body read.
type mxFrame struct {
	Type  frame.Type
	ID    uint32
	Flags frame.Flags
	Body  string // a DATA frame's payload, a GOAWAY's debug text
	Code  uint32 // a RST's or a GOAWAY's error code
	Inc   uint32 // a WNDINC's increment
	Last  uint32 // a GOAWAY's last stream ID
}

func (m mxFrame) String() string {
	body := fmt.Sprintf("%q", m.Body)
	if len(m.Body) > 16 {
		body = fmt.Sprintf("(%d bytes)", len(m.Body))
	}
	switch m.Type {
	case frame.TypeData:
		return fmt.Sprintf("DATA %d flags=%#x %s", m.ID, m.Flags, body)
	case frame.TypeRst:
		return fmt.Sprintf("RST %d code=%d", m.ID, m.Code)
	case frame.TypeWndInc:
		return fmt.Sprintf("WNDINC %d +%d", m.ID, m.Inc)
	case frame.TypeGoAway:
		return fmt.Sprintf("GOAWAY last=%d code=%d %s", m.Last, m.Code, body)
	}
	return fmt.Sprintf("type %d on %d, %s", m.Type, m.ID, body)
}

// Frames to expect.
func mxData(id uint32, flags frame.Flags, body string) mxFrame {
	return mxFrame{Type: frame.TypeData, ID: id, Flags: flags, Body: body}
}

func mxRst(id uint32, code muxado.ErrorCode) mxFrame {
	return mxFrame{Type: frame.TypeRst, ID: id, Code: uint32(code)}
}

func mxWndInc(id, inc uint32) mxFrame { return mxFrame{Type: frame.TypeWndInc, ID: id, Inc: inc} }

const (
	synFlag = frame.Flags(frame.FlagDataSyn)
	finFlag = frame.Flags(frame.FlagDataFin)
)

// snapshot describes f, a frame a stock framer read, and reads its body.
func snapshot(f frame.Frame) (mxFrame, error) {
	m := mxFrame{Type: f.Type(), ID: uint32(f.StreamId()), Flags: f.Flags()}
	var body io.Reader
	switch f := f.(type) {
	case *frame.Data:
		body = f.Reader()
	case *frame.Rst:
		m.Code = uint32(f.ErrorCode())
	case *frame.WndInc:
		m.Inc = f.WindowIncrement()
	case *frame.GoAway:
		m.Last, m.Code = uint32(f.LastStreamId()), uint32(f.ErrorCode())
		body = f.Debug()
	case *frame.Unknown:
		body = f.PayloadReader()
	}
	if body != nil {
		b, err := io.ReadAll(body)
		if err != nil {
			return m, err
		}
		m.Body = string(b)
	}
	return m, nil
}

// encoded describes f, a frame to write, as the stock framer encodes it.
func encoded(f frame.Frame) (mxFrame, error) {
	var b bytes.Buffer
	if err := frame.NewFramer(nil, &b).WriteFrame(f); err != nil {
		return mxFrame{}, err
	}
	g, err := frame.NewFramer(&b, nil).ReadFrame()
	if err != nil {
		return mxFrame{}, err
	}
	return snapshot(g)
}

// rawPeer is the far end of a session under test: it writes and reads
// frames one by one, with the stock framer.
type rawPeer struct {
	t      *testing.T
	conn   net.Conn
	fr     frame.Framer
	probes uint32 // probes sent
}

// send writes frames to the session.
func (p *rawPeer) send(frames ...frame.Frame) {
	p.t.Helper()
	for _, f := range frames {
		if err := p.fr.WriteFrame(f); err != nil {
			p.t.Fatalf("writing %v to the session: %v", f.Type(), err)
		}
	}
}

// read returns the next frame the session wrote.
func (p *rawPeer) read() mxFrame {
	p.t.Helper()
	m, err := p.readErr()
	if err != nil {
		p.t.Fatalf("reading the session's next frame: %v", err)
	}
	return m
}

func (p *rawPeer) readErr() (mxFrame, error) {
	p.conn.SetReadDeadline(time.Now().Add(contractBound))
	f, err := p.fr.ReadFrame()
	if err != nil {
		return mxFrame{}, err
	}
	return snapshot(f)
}

// probe sends an empty DATA frame without flags for a stream the session
// never had, which muxado answers with a RST of code StreamClosed (item
// 10), and returns the frames the session wrote before that answer. As
// muxado handles the frames it reads one after the other and queues its
// answers in order, they are all that the session wrote for the frames
// sent before the probe, or while it handled them.
func (p *rawPeer) probe() []mxFrame {
	p.t.Helper()
	id := 0x7ff00001 + 2*p.probes
	p.probes++
	p.send(packData(p.t, frame.StreamId(id), nil, false, false))
	var before []mxFrame
	for {
		m := p.read()
		if m.ID == id {
			if m != mxRst(id, muxado.StreamClosed) {
				p.t.Fatalf("the session answered a probe with %v, want %v", m, mxRst(id, muxado.StreamClosed))
			}
			return before
		}
		before = append(before, m)
	}
}

// readData reads the DATA frames of stream id until they carried n bytes,
// and fails if a frame goes past n, or a frame of another kind comes.
func (p *rawPeer) readData(id uint32, n int) {
	p.t.Helper()
	for got := 0; got < n; {
		m := p.read()
		if m.Type != frame.TypeData || m.ID != id {
			p.t.Fatalf("after %d of %d bytes of stream %d, the session wrote %v", got, n, id, m)
		}
		got += len(m.Body)
		if got > n {
			p.t.Fatalf("stream %d sent %d bytes, want %d", id, got, n)
		}
	}
}

// watchedConn is a session's transport that notes when it is closed.
type watchedConn struct {
	net.Conn
	closes atomic.Int32
	once   sync.Once
	closed chan struct{}
}

func (c *watchedConn) Close() error {
	c.closes.Add(1)
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func (c *watchedConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// waitClosed waits until muxado closed the transport.
func (c *watchedConn) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-c.closed:
	case <-time.After(contractBound):
		t.Fatal("muxado never closed its transport")
	}
}

// watchedFramer wraps the stock framer of a session under test, noting
// what muxado asks of it, and, as told, takes DATA payloads as this
// package's framer does, or fails.
type watchedFramer struct {
	inner frame.Framer
	opts  mxOptions

	entered chan mxFrame // each frame WriteFrame is given, as it starts writing it

	mu             sync.Mutex
	readers        map[uint64]bool // the goroutines that called ReadFrame
	writers        map[uint64]bool // the goroutines that called WriteFrame
	reading        int
	writing        int
	readOverlap    bool              // two ReadFrame calls at once
	writeOverlap   bool              // two WriteFrame calls at once
	lastPayload    *io.LimitedReader // of the last DATA or GOAWAY frame read
	unreadPayload  []string          // frames read before the last one's payload was
	readFailed     bool              // ReadFrame returned an error
	readAfterError bool              // and was called again
	types          map[string]bool   // of the frames WriteFrame was given
	badData        []string          // DATA frames whose Length is not their payload's
	written        []mxFrame         // what WriteFrame was given
	taken          map[uint32][]byte // payloads taken (opts.take), by stream
}

func newWatchedFramer(inner frame.Framer, o mxOptions) *watchedFramer {
	return &watchedFramer{
		inner: inner, opts: o,
		entered: make(chan mxFrame, 1024),
		readers: map[uint64]bool{}, writers: map[uint64]bool{}, types: map[string]bool{},
		taken: map[uint32][]byte{},
	}
}

func (w *watchedFramer) ReadFrame() (frame.Frame, error) {
	w.mu.Lock()
	w.readers[goid()] = true
	if w.reading++; w.reading > 1 {
		w.readOverlap = true
	}
	if w.readFailed {
		w.readAfterError = true
	}
	if w.lastPayload != nil && w.lastPayload.N > 0 {
		w.unreadPayload = append(w.unreadPayload, fmt.Sprintf("%d bytes left", w.lastPayload.N))
	}
	w.lastPayload = nil
	w.mu.Unlock()

	f, err := w.inner.ReadFrame()
	if err == nil {
		err = w.handle(f)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	w.reading--
	if err != nil {
		w.readFailed = true
		return nil, err
	}
	switch f := f.(type) {
	case *frame.Data:
		w.lastPayload, _ = f.Reader().(*io.LimitedReader)
	case *frame.GoAway:
		w.lastPayload, _ = f.Debug().(*io.LimitedReader)
	}
	return f, nil
}

// handle applies the options to a frame read.
func (w *watchedFramer) handle(f frame.Frame) error {
	if w.opts.panicRead != nil && w.opts.panicRead(f) {
		w.mu.Lock()
		w.reading--
		w.mu.Unlock()
		panic("watchedFramer: a panic in ReadFrame")
	}
	if w.opts.failRead != nil {
		if err := w.opts.failRead(f); err != nil {
			return err
		}
	}
	d, ok := f.(*frame.Data)
	if !w.opts.take || !ok || d.Length() == 0 {
		return nil
	}
	// As framer.takeData: read the payload, and give muxado the frame
	// without it, with its flags.
	b, err := io.ReadAll(d.Reader())
	if err != nil {
		return err
	}
	id := uint32(d.StreamId())
	w.mu.Lock()
	w.taken[id] = append(w.taken[id], b...)
	w.mu.Unlock()
	return d.Pack(d.StreamId(), nil, d.Fin(), d.Syn())
}

func (w *watchedFramer) WriteFrame(f frame.Frame) error {
	w.mu.Lock()
	w.writers[goid()] = true
	if w.writing++; w.writing > 1 {
		w.writeOverlap = true
	}
	w.types[fmt.Sprintf("%T", f)] = true
	if d, ok := f.(*frame.Data); ok && int(d.Length()) != len(d.Bytes()) {
		w.badData = append(w.badData, fmt.Sprintf("length %d, payload %d bytes", d.Length(), len(d.Bytes())))
	}
	w.mu.Unlock()
	if m, err := encoded(f); err == nil {
		w.mu.Lock()
		w.written = append(w.written, m)
		w.mu.Unlock()
		select {
		case w.entered <- m:
		default:
		}
	}
	if w.opts.panicWrite != nil && w.opts.panicWrite(f) {
		w.mu.Lock()
		w.writing--
		w.mu.Unlock()
		panic("watchedFramer: a panic in WriteFrame")
	}
	var err error
	if w.opts.failWrite != nil {
		err = w.opts.failWrite(f)
	}
	if err == nil {
		err = w.inner.WriteFrame(f)
	}
	w.mu.Lock()
	w.writing--
	w.mu.Unlock()
	return err
}

// writtenFrames returns what WriteFrame was given so far.
func (w *watchedFramer) writtenFrames() []mxFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.written)
}

// waitEntered waits until WriteFrame is given a frame like want.
func (w *watchedFramer) waitEntered(t *testing.T, want mxFrame) {
	t.Helper()
	for {
		select {
		case m := <-w.entered:
			if m == want {
				return
			}
		case <-time.After(contractBound):
			t.Fatalf("muxado never gave its framer %v", want)
		}
	}
}

// goid returns the ID of the calling goroutine.
func goid() uint64 {
	var b [64]byte
	f := strings.Fields(string(b[:runtime.Stack(b[:], false)])) // "goroutine 7 [running]: ..."
	id, _ := strconv.ParseUint(f[1], 10, 64)
	return id
}

// mxOptions say how to set up a session under test.
type mxOptions struct {
	server  bool
	window  uint32 // MaxWindowSize; zero: muxado's default
	backlog uint32 // AcceptBacklog; zero: muxado's default
	pipe    bool   // over net.Pipe rather than loopback TCP

	take       bool                    // take DATA payloads as this package's framer does
	failRead   func(frame.Frame) error // an error for ReadFrame to return with a frame read
	panicRead  func(frame.Frame) bool  // ReadFrame panics with a frame read
	failWrite  func(frame.Frame) error // an error for WriteFrame to return instead of writing
	panicWrite func(frame.Frame) bool  // WriteFrame panics
}

// mxEnd is a stock muxado session under test, with its transport and its
// framer watched.
type mxEnd struct {
	muxado.Session
	tr *watchedConn
	fr *watchedFramer
}

// stockEnd starts a stock muxado session as o says, and returns it with the
// peer at the other end of its transport. Both are closed when the test
// ends.
func stockEnd(t *testing.T, o mxOptions) (*mxEnd, *rawPeer) {
	t.Helper()
	var a, b net.Conn
	if o.pipe {
		a, b = net.Pipe()
	} else {
		a, b = tcpPair(t)
	}
	e := &mxEnd{tr: &watchedConn{Conn: a, closed: make(chan struct{})}}
	cfg := &muxado.Config{
		MaxWindowSize: o.window,
		AcceptBacklog: o.backlog,
		NewFramer: func(r io.Reader, w io.Writer) frame.Framer {
			e.fr = newWatchedFramer(frame.NewFramer(r, w), o)
			return e.fr
		},
	}
	if o.server {
		e.Session = muxado.Server(e.tr, cfg)
	} else {
		e.Session = muxado.Client(e.tr, cfg)
	}
	t.Cleanup(func() {
		b.Close()
		e.Close()
	})
	return e, &rawPeer{t: t, conn: b, fr: frame.NewFramer(b, b)}
}

// accept returns the next stream the session accepts.
func (e *mxEnd) accept(t *testing.T) muxado.Stream {
	t.Helper()
	select {
	case r := <-e.goAccept():
		if r.err != nil {
			t.Fatalf("AcceptStream: %v", r.err)
		}
		return r.st
	case <-time.After(contractBound):
		t.Fatal("the session accepted no stream")
	}
	return nil
}

type accepted struct {
	st  muxado.Stream
	err error
}

// goAccept calls AcceptStream in a goroutine of its own.
func (e *mxEnd) goAccept() <-chan accepted {
	ch := make(chan accepted, 1)
	go func() {
		st, err := e.AcceptStream()
		ch <- accepted{st, err}
	}()
	return ch
}

// localErr waits until the session died, and returns why.
func (e *mxEnd) localErr(t *testing.T) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		err, _, _ := e.Wait()
		ch <- err
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(contractBound):
		t.Fatal("the session never died")
	}
	return nil
}

// within returns what ch gives, failing t if it gives nothing within the
// bound.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(contractBound):
		t.Fatalf("waited %v for %s", contractBound, what)
	}
	var zero T
	return zero
}

// goErr runs f in a goroutine of its own, and returns its error's channel.
func goErr(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

func codeOf(err error) muxado.ErrorCode {
	code, _ := muxado.GetError(err)
	return code
}

func equalFrames(got, want []mxFrame) bool { return slices.Equal(got, want) }

var errContract = errors.New("contract test: the framer fails")

// TestMuxadoCallsNewFramerOnce guards item 1 of the package doc, "The
// hook": Client and Server call NewFramer once, before they return, with
// their transport as reader and writer.
func TestMuxadoCallsNewFramerOnce(t *testing.T) {
	for _, server := range []bool{false, true} {
		t.Run(map[bool]string{false: "Client", true: "Server"}[server], func(t *testing.T) {
			a, b := tcpPair(t)
			defer b.Close()
			tr := &watchedConn{Conn: a, closed: make(chan struct{})}
			var mu sync.Mutex
			var calls int
			var gotR io.Reader
			var gotW io.Writer
			cfg := &muxado.Config{NewFramer: func(r io.Reader, w io.Writer) frame.Framer {
				mu.Lock()
				defer mu.Unlock()
				calls++
				gotR, gotW = r, w
				return frame.NewFramer(r, w)
			}}
			var s muxado.Session
			if server {
				s = muxado.Server(tr, cfg)
			} else {
				s = muxado.Client(tr, cfg)
			}
			defer s.Close()
			mu.Lock()
			n, r, w := calls, gotR, gotW
			mu.Unlock()
			if n != 1 {
				t.Fatalf("NewFramer called %d times before the session was returned, want 1", n)
			}
			if r != io.Reader(tr) || w != io.Writer(tr) {
				t.Fatalf("NewFramer given %T and %T, want the transport (%T) as both", r, w, tr)
			}
			// A session's life makes no more calls.
			p := &rawPeer{t: t, conn: b, fr: frame.NewFramer(b, b)}
			p.probe()
			s.Close()
			tr.waitClosed(t)
			mu.Lock()
			defer mu.Unlock()
			if calls != 1 {
				t.Fatalf("NewFramer called %d times in a session's life, want 1", calls)
			}
		})
	}
}

// watchedTraffic runs streams both ways between a stock session under test
// (the server) and a stock client, then has the client close, and returns
// the server's framer once the server's reader and writer ended.
func watchedTraffic(t *testing.T) *watchedFramer {
	e, p := stockEnd(t, mxOptions{server: true})
	client := muxado.Client(p.conn, &muxado.Config{})
	const streams, size = 3, 100 << 10
	var wg sync.WaitGroup
	errs := make(chan error, 4*streams)
	for i := range streams {
		wg.Go(func() { errs <- openAndExchange(client, size, uint64(i)) })
		wg.Go(func() { errs <- openAndExchange(e, size, uint64(100+i)) })
		wg.Go(func() { errs <- acceptAndExchange(e, size) })
		wg.Go(func() { errs <- acceptAndExchange(client, size) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	within(t, done, "the streams' exchanges")
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	client.Close()
	e.localErr(t) // (of an EOF or a reset: the peer closed with bytes in flight)
	e.fr.mu.Lock()
	ids := slices.Concat(mapKeys(e.fr.readers), mapKeys(e.fr.writers))
	e.fr.mu.Unlock()
	testwait.Within(t, contractBound, "the session's reader and writer to end", func() bool {
		return !goroutinesAlive(ids)
	})
	return e.fr
}

func mapKeys(m map[uint64]bool) []uint64 {
	var ks []uint64
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// goroutinesAlive tells whether any of the goroutines ids runs.
func goroutinesAlive(ids []uint64) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, id := range ids {
		if bytes.Contains(buf, fmt.Appendf(nil, "goroutine %d [", id)) {
			return true
		}
	}
	return false
}

// TestMuxadoReadsInOneGoroutine guards item 2, "One reader": ReadFrame is
// called by one goroutine, one call at a time, each frame's payload read
// before the next call, never again after an error. (That the session
// dies of the error: TestMuxadoClosesItsTransportWhenItDies.)
func TestMuxadoReadsInOneGoroutine(t *testing.T) {
	fr := watchedTraffic(t)
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if len(fr.readers) != 1 {
		t.Errorf("ReadFrame called from %d goroutines, want 1", len(fr.readers))
	}
	if fr.readOverlap {
		t.Error("two ReadFrame calls ran at once")
	}
	if len(fr.unreadPayload) > 0 {
		t.Errorf("ReadFrame called again before a frame's payload was read: %v", fr.unreadPayload)
	}
	if !fr.readFailed {
		t.Error("ReadFrame never failed, though the peer closed")
	}
	if fr.readAfterError {
		t.Error("ReadFrame called again after it returned an error")
	}
}

// TestMuxadoWritesInOneGoroutine guards item 3, "One writer": WriteFrame is
// called by one goroutine, one call at a time. (That an error from it kills
// the session: TestMuxadoClosesItsTransportWhenItDies.)
func TestMuxadoWritesInOneGoroutine(t *testing.T) {
	fr := watchedTraffic(t)
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if len(fr.writers) != 1 {
		t.Errorf("WriteFrame called from %d goroutines, want 1", len(fr.writers))
	}
	if fr.writeOverlap {
		t.Error("two WriteFrame calls ran at once")
	}
	if len(fr.written) == 0 {
		t.Error("WriteFrame never called")
	}
}

// TestMuxadoWritesStockFrameTypes guards item 4, "Four frame types": over a
// session's life, WriteFrame is given *frame.Data (Length its payload's),
// *frame.WndInc, *frame.Rst and *frame.GoAway, and nothing else.
func TestMuxadoWritesStockFrameTypes(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("hi"), false, true))
	st := e.accept(t)
	if _, err := io.ReadFull(st, make([]byte, 2)); err != nil { // a WNDINC
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("yo")); err != nil { // a DATA frame
		t.Fatal(err)
	}
	st.CloseWrite()
	p.probe() // a RST
	e.Close() // a GOAWAY
	e.tr.waitClosed(t)

	want := []string{"*frame.Data", "*frame.GoAway", "*frame.Rst", "*frame.WndInc"}
	e.fr.mu.Lock()
	defer e.fr.mu.Unlock()
	got := mapKeysString(e.fr.types)
	if !slices.Equal(got, want) {
		t.Errorf("WriteFrame given frames of types %v, want %v", got, want)
	}
	if len(e.fr.badData) > 0 {
		t.Errorf("DATA frames whose Length is not their payload's: %v", e.fr.badData)
	}
}

func mapKeysString(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestMuxadoFrameLayout guards item 5, "The frame layout": the stock framer
// writes each frame type as these bytes, and reads them back so.
func TestMuxadoFrameLayout(t *testing.T) {
	if frame.TypeRst != 0 || frame.TypeData != 1 || frame.TypeWndInc != 2 || frame.TypeGoAway != 3 {
		t.Errorf("frame types RST %d, DATA %d, WNDINC %d, GOAWAY %d; want 0, 1, 2, 3",
			frame.TypeRst, frame.TypeData, frame.TypeWndInc, frame.TypeGoAway)
	}
	if frame.FlagDataFin != 1 || frame.FlagDataSyn != 2 {
		t.Errorf("DATA flags FIN %d, SYN %d; want 1, 2", frame.FlagDataFin, frame.FlagDataSyn)
	}
	cases := []struct {
		f    frame.Frame
		wire string // hex, spaces ignored: length, type and flags, stream ID, body
		want mxFrame
	}{
		{packData(t, 5, []byte("ab"), true, true), "000002 13 00000005 6162",
			mxData(5, synFlag|finFlag, "ab")},
		{packData(t, 0x7fffffff, nil, false, false), "000000 10 7fffffff",
			mxData(0x7fffffff, 0, "")},
		{packData(t, 0x010203, payload(300), false, true), "00012c 12 00010203" + hex.EncodeToString(payload(300)),
			mxData(0x010203, synFlag, string(payload(300)))},
		{packRst(t, 7, frame.ErrorCode(muxado.StreamCancelled)), "000004 00 00000007 00000006",
			mxRst(7, muxado.StreamCancelled)},
		{packWndInc(t, 9, 0x7fffffff), "000004 20 00000009 7fffffff",
			mxWndInc(9, 0x7fffffff)},
		{packWndInc(t, 0x12345678, 1), "000004 20 12345678 00000001",
			mxWndInc(0x12345678, 1)},
		{packGoAway(t, 3, frame.ErrorCode(muxado.NoError), []byte("no error")), "000010 30 00000000 00000003 00000000 6e6f206572726f72",
			mxFrame{Type: frame.TypeGoAway, Last: 3, Code: 0, Body: "no error"}},
		{packGoAway(t, 0x7fffffff, 0xabcdef01, nil), "000008 30 00000000 7fffffff abcdef01",
			mxFrame{Type: frame.TypeGoAway, Last: 0x7fffffff, Code: 0xabcdef01}},
	}
	for _, c := range cases {
		want, err := hex.DecodeString(strings.ReplaceAll(c.wire, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		if got := stockBytes(t, c.f); !bytes.Equal(got, want) {
			t.Errorf("%v written as\n% x\nwant\n% x", c.want, head(got), head(want))
		}
		f, err := frame.NewFramer(bytes.NewReader(want), nil).ReadFrame()
		if err != nil {
			t.Errorf("reading %v: %v", c.want, err)
			continue
		}
		if got, err := snapshot(f); err != nil || got != c.want {
			t.Errorf("read % x as %v (%v), want %v", head(want), got, err, c.want)
		}
	}
	// The bounds of the fields: a stream ID of 31 bits, a WNDINC of 1 to
	// 2^31-1 (framer.go's wndIncMaxIncr).
	if err := new(frame.Data).Pack(1<<31, nil, false, false); err == nil {
		t.Error("a DATA frame packed for stream 2^31")
	}
	for _, inc := range []uint32{0, wndIncMaxIncr + 1} {
		if err := new(frame.WndInc).Pack(1, inc); err == nil {
			t.Errorf("a WNDINC of %d packed", inc)
		}
	}
}

// TestMuxadoTakesAFrameWithoutItsPayload guards item 6, "A frame without
// its payload": the stock framer reads a DATA frame's header alone, and a
// DATA frame packed anew without its payload still opens and ends its
// stream, and muxado reads nothing more for it.
func TestMuxadoTakesAFrameWithoutItsPayload(t *testing.T) {
	raw := stockBytes(t, packData(t, 1, []byte("hello"), false, true), packWndInc(t, 1, 7))
	cr := &countReader{r: bytes.NewReader(raw)}
	f, err := frame.NewFramer(cr, nil).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	if cr.n != headerSize {
		t.Fatalf("ReadFrame of a DATA frame read %d bytes, want its header's %d", cr.n, headerSize)
	}
	d := f.(*frame.Data)
	if body, err := io.ReadAll(d.Reader()); string(body) != "hello" || err != nil || cr.n != headerSize+5 {
		t.Fatalf("the payload read from Reader: %q, %v, %d bytes read in all; want %q and %d", body, err, cr.n, "hello", headerSize+5)
	}

	e, p := stockEnd(t, mxOptions{server: true, take: true})
	p.send(
		packData(t, 1, []byte("hello"), false, true),
		packData(t, 1, []byte(" "), false, false),
		packData(t, 1, []byte("world"), true, false),
	)
	if got := p.probe(); len(got) != 0 {
		t.Fatalf("muxado answered frames without payload with %v", got)
	}
	st := e.accept(t)
	if st.Id() != 1 {
		t.Fatalf("accepted stream %d, want 1", st.Id())
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	if n, err := st.Read(make([]byte, 10)); n != 0 || err != io.EOF {
		t.Fatalf("read %d bytes, %v, from a stream whose payloads were taken and whose FIN came; want 0, EOF", n, err)
	}
	e.fr.mu.Lock()
	defer e.fr.mu.Unlock()
	if got := string(e.fr.taken[1]); got != "hello world" {
		t.Fatalf("took %q, want %q", got, "hello world")
	}
}

// TestMuxadoSYNRidesOnTheFirstDataFrame guards item 7, "The SYN rides on
// the first DATA frame".
func TestMuxadoSYNRidesOnTheFirstDataFrame(t *testing.T) {
	t.Run("opened here", func(t *testing.T) {
		e, p := stockEnd(t, mxOptions{})
		a, err := e.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if got := p.probe(); len(got) != 0 {
			t.Fatalf("OpenStream wrote %v", got)
		}
		if n, err := a.Write(nil); n != 0 || err != nil {
			t.Fatalf("an empty first Write: %d, %v", n, err)
		}
		if got := p.probe(); len(got) != 0 {
			t.Fatalf("an empty first Write wrote %v", got)
		}
		if _, err := a.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if got, want := p.read(), mxData(a.Id(), 0, "x"); got != want {
			t.Fatalf("the frame after an empty first Write: %v, want %v (no SYN)", got, want)
		}

		b, err := e.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Write([]byte("y")); err != nil {
			t.Fatal(err)
		}
		if got, want := p.read(), mxData(b.Id(), synFlag, "y"); got != want {
			t.Fatalf("a stream's first frame: %v, want %v", got, want)
		}
		if _, err := b.Write([]byte("z")); err != nil {
			t.Fatal(err)
		}
		if got, want := p.read(), mxData(b.Id(), 0, "z"); got != want {
			t.Fatalf("a stream's second frame: %v, want %v", got, want)
		}

		c, err := e.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if got, want := p.read(), mxData(c.Id(), synFlag|finFlag, ""); got != want {
			t.Fatalf("CloseWrite on a fresh stream wrote %v, want %v", got, want)
		}
		if a.Id()%2 != 1 || b.Id() != a.Id()+2 || c.Id() != b.Id()+2 {
			t.Fatalf("a client's streams have IDs %d, %d, %d; want odd ones, 2 apart", a.Id(), b.Id(), c.Id())
		}

		// A stream the peer opened: no SYN from this end.
		p.send(packData(t, 2, []byte("q"), false, true))
		in := e.accept(t)
		if in.Id() != 2 {
			t.Fatalf("accepted stream %d, want 2", in.Id())
		}
		if _, err := in.Write([]byte("r")); err != nil {
			t.Fatal(err)
		}
		if got, want := p.read(), mxData(2, 0, "r"); got != want {
			t.Fatalf("an accepted stream's first frame: %v, want %v", got, want)
		}
	})
	t.Run("accepted there", func(t *testing.T) {
		e, p := stockEnd(t, mxOptions{server: true})
		acc := e.goAccept()
		p.send(packData(t, 1, []byte("no SYN"), false, false))
		if got := p.probe(); !equalFrames(got, []mxFrame{mxRst(1, muxado.StreamClosed)}) {
			t.Fatalf("a DATA frame without SYN for a new stream: answered %v, want %v", got, mxRst(1, muxado.StreamClosed))
		}
		select {
		case r := <-acc:
			t.Fatalf("AcceptStream returned %v, %v without a SYN", r.st, r.err)
		default:
		}
		p.send(packData(t, 3, []byte("SYN"), false, true))
		r := within(t, acc, "the stream of a SYN")
		if r.err != nil || r.st.Id() != 3 {
			t.Fatalf("AcceptStream: %v, %v; want stream 3", r.st, r.err)
		}
	})
}

// TestMuxadoAcceptQueue guards item 8, "The accept queue": AcceptBacklog
// streams (128 when zero) wait in SYN order; the next is refused with
// AcceptQueueFull, and never accepted.
func TestMuxadoAcceptQueue(t *testing.T) {
	for _, c := range []struct {
		backlog uint32
		room    int
	}{{4, 4}, {0, defaultBacklog}} {
		t.Run(fmt.Sprint("AcceptBacklog ", c.backlog), func(t *testing.T) {
			e, p := stockEnd(t, mxOptions{server: true, backlog: c.backlog})
			for i := range c.room + 1 {
				p.send(packData(t, frame.StreamId(2*i+1), []byte("x"), false, true))
			}
			refused := uint32(2*c.room + 1)
			if got := p.probe(); !equalFrames(got, []mxFrame{mxRst(refused, muxado.AcceptQueueFull)}) {
				t.Fatalf("%d SYNs into a queue of %d: answered %v, want %v", c.room+1, c.room, got, mxRst(refused, muxado.AcceptQueueFull))
			}
			for i := range c.room {
				if st := e.accept(t); st.Id() != uint32(2*i+1) {
					t.Fatalf("accepted stream %d as number %d, want %d", st.Id(), i, 2*i+1)
				}
			}
			// The refused stream is not in the queue: the next one is next.
			acc := e.goAccept()
			next := refused + 2
			p.send(packData(t, frame.StreamId(next), []byte("x"), false, true))
			if r := within(t, acc, "the next stream"); r.err != nil || r.st.Id() != next {
				t.Fatalf("AcceptStream: %v, %v; want stream %d (the refused %d was queued?)", r.st, r.err, next, refused)
			}
		})
	}
}

// TestMuxadoRefusesStreamsWhileGoingAway guards item 9, "Refused while
// going away": a SYN read once the session sent GOAWAY is answered with
// StreamRefused, and not accepted. (That muxado sends GOAWAY only as it
// dies: TestMuxadoWritesGoAwayOnlyAsItDies.)
func TestMuxadoRefusesStreamsWhileGoingAway(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	ga, ok := e.Session.(interface {
		GoAway(muxado.ErrorCode, []byte, time.Time) error
	})
	if !ok {
		t.Fatalf("muxado's session (%T) has no GoAway method to start going away with", e.Session)
	}
	if err := ga.GoAway(muxado.NoError, []byte("bye"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got := p.read(); got.Type != frame.TypeGoAway {
		t.Fatalf("GoAway wrote %v", got)
	}
	acc := e.goAccept()
	// A SYN without payload: muxado refuses a SYN before it reads the
	// frame's payload, which it then takes for the next frame. (A
	// Session's framer takes the payload first: see item 6.)
	p.send(packData(t, 1, nil, false, true))
	if got := p.probe(); !equalFrames(got, []mxFrame{mxRst(1, muxado.StreamRefused)}) {
		t.Fatalf("a SYN after GOAWAY: answered %v, want %v", got, mxRst(1, muxado.StreamRefused))
	}
	select {
	case r := <-acc:
		t.Fatalf("AcceptStream returned %v, %v: a refused stream", r.st, r.err)
	default:
	}
}

// TestMuxadoAnswersDataForAnUnknownStream guards item 10, "Frames for a
// stream muxado does not have": DATA is answered with RST StreamClosed,
// even an empty frame without flags; an empty FIN and a RST are not
// answered, and the session lives on.
func TestMuxadoAnswersDataForAnUnknownStream(t *testing.T) {
	for _, server := range []bool{false, true} {
		t.Run(map[bool]string{false: "client", true: "server"}[server], func(t *testing.T) {
			e, p := stockEnd(t, mxOptions{server: server})
			p.send(
				packData(t, 41, []byte("abc"), false, false),            // answered
				packData(t, 43, nil, false, false),                      // answered: Session.reset's second frame
				packData(t, 45, nil, true, false),                       // ignored
				packRst(t, 47, frame.ErrorCode(muxado.StreamCancelled)), // ignored
				packData(t, 49, []byte("x"), true, false),               // answered
				packData(t, 50, payload(3000), false, false),            // answered (either parity)
			)
			want := []mxFrame{
				mxRst(41, muxado.StreamClosed),
				mxRst(43, muxado.StreamClosed),
				mxRst(49, muxado.StreamClosed),
				mxRst(50, muxado.StreamClosed),
			}
			if got := p.probe(); !equalFrames(got, want) {
				t.Fatalf("frames for streams the session does not have: answered\n%v\nwant\n%v", got, want)
			}
			if e.tr.isClosed() {
				t.Fatal("the session died of frames for streams it does not have")
			}
			// A RST for a stream that is gone (the peer's answer to a reset)
			// is not answered either.
			p.send(packRst(t, 43, frame.ErrorCode(muxado.StreamClosed)))
			if got := p.probe(); len(got) != 0 {
				t.Fatalf("a RST for a stream the session does not have: answered %v", got)
			}
		})
	}
}

// TestMuxadoRSTEndsAStreamAtOnce guards item 11, "A RST ends a stream at
// once": the peer's RST fails a Write stalled on window and later Reads
// with the RST's code, and the stream is forgotten at once: the empty DATA
// frame that follows (Session.reset's pair of frames) is answered.
func TestMuxadoRSTEndsAStreamAtOnce(t *testing.T) {
	const window = MinWindow
	e, p := stockEnd(t, mxOptions{server: true, window: window})
	p.send(packData(t, 1, []byte("hi"), false, true))
	st := e.accept(t)
	wrote := goErr(func() error {
		_, err := st.Write(payload(window + 1000))
		return err
	})
	p.readData(1, window) // then the Write waits for window
	if _, err := p.conn.Write(resetFrames(1)); err != nil {
		t.Fatal(err)
	}
	if got, want := p.read(), mxRst(1, muxado.StreamClosed); got != want {
		t.Fatalf("after a RST, an empty DATA frame for the stream was answered with %v, want %v", got, want)
	}
	if err := within(t, wrote, "the Write stalled on window"); codeOf(err) != muxado.StreamCancelled {
		t.Fatalf("the stalled Write returned %v, want an error of the RST's code %d", err, muxado.StreamCancelled)
	}
	if _, err := st.Write([]byte("x")); codeOf(err) != muxado.StreamCancelled {
		t.Fatalf("a Write after the RST returned %v, want an error of the RST's code", err)
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	got, err := io.ReadAll(st)
	if string(got) != "hi" || codeOf(err) != muxado.StreamCancelled {
		t.Fatalf("Reads after the RST: %q, %v; want %q, then an error of the RST's code", got, err, "hi")
	}
	if e.tr.isClosed() {
		t.Fatal("the session died of a RST")
	}
}

// TestMuxadoSendWindow guards item 12, "The send window": a stream sends
// MaxWindowSize bytes before any WNDINC, and as many more as each WNDINC
// grants, as far as the window goes, then waits.
func TestMuxadoSendWindow(t *testing.T) {
	const window, grant = MinWindow, 1000
	e, p := stockEnd(t, mxOptions{server: true, window: window})
	p.send(packData(t, 1, []byte("go"), false, true))
	st := e.accept(t)
	type result struct {
		n   int
		err error
	}
	wrote := make(chan result, 1)
	go func() {
		n, err := st.Write(payload(window + grant + 5000))
		wrote <- result{n, err}
	}()
	p.readData(1, window)
	select {
	case r := <-wrote:
		t.Fatalf("a Write of more than the window returned %d, %v before any grant", r.n, r.err)
	default:
	}
	p.send(packWndInc(t, 1, grant))
	p.readData(1, grant)
	// The stream now waits for more window: ending the session ends the
	// Write, which sent the window and the grant, no more.
	e.Close()
	r := within(t, wrote, "the Write")
	if r.n != window+grant || r.err == nil {
		t.Fatalf("the Write returned %d, %v; want %d and an error", r.n, r.err, window+grant)
	}
}

// TestMuxadoReceiveWindow guards item 13, "The receive window": a stream
// holds MaxWindowSize bytes unread, a byte more is answered with a RST
// FlowControlError, and each Read grants its bytes back at once.
func TestMuxadoReceiveWindow(t *testing.T) {
	const window = MinWindow
	e, p := stockEnd(t, mxOptions{server: true, window: window})
	p.send(
		packData(t, 1, payload(window/2), false, true),
		packData(t, 1, payload(window/2), false, false),
	)
	if got := p.probe(); len(got) != 0 {
		t.Fatalf("a stream holding its window unread: answered %v", got)
	}
	p.send(packData(t, 1, []byte("x"), false, false))
	if got := p.probe(); !equalFrames(got, []mxFrame{mxRst(1, muxado.FlowControlError)}) {
		t.Fatalf("a byte past the window: answered %v, want %v", got, mxRst(1, muxado.FlowControlError))
	}

	p.send(packData(t, 3, payload(100), false, true))
	e.accept(t) // 1
	st := e.accept(t)
	if st.Id() != 3 {
		t.Fatalf("accepted stream %d, want 3", st.Id())
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	b := make([]byte, 100)
	for _, n := range []int{30, 70} {
		if got, err := st.Read(b[:n]); got != n || err != nil {
			t.Fatalf("Read of %d: %d, %v", n, got, err)
		}
	}
	if got, want := p.probe(), []mxFrame{mxWndInc(3, 30), mxWndInc(3, 70)}; !equalFrames(got, want) {
		t.Fatalf("Reads of 30 and 70 bytes granted %v, want %v", got, want)
	}
}

// TestMuxadoCloseWriteSendsFIN guards item 14, "CloseWrite sends an empty
// DATA frame with FIN, through WriteFrame; later Writes fail".
func TestMuxadoCloseWriteSendsFIN(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("q"), false, true))
	st := e.accept(t)
	if _, err := st.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	want := []mxFrame{mxData(1, 0, "data"), mxData(1, finFlag, "")}
	if got := []mxFrame{p.read(), p.read()}; !equalFrames(got, want) {
		t.Fatalf("Write, then CloseWrite, wrote %v, want %v", got, want)
	}
	if written := e.fr.writtenFrames(); !slices.Contains(written, mxData(1, finFlag, "")) {
		t.Fatalf("the FIN did not go through WriteFrame, which was given %v", written)
	}
	if _, err := st.Write([]byte("z")); err == nil {
		t.Fatal("a Write after CloseWrite succeeded")
	}
	if got := p.probe(); len(got) != 0 {
		t.Fatalf("a Write after CloseWrite wrote %v", got)
	}
}

// TestMuxadoCloseHalfClosesAndForgets guards item 15, "Close half-closes,
// then forgets": Close sends a FIN without waiting for the peer, fails
// Reads and Writes, and a DATA frame from the peer is then answered with
// RST StreamClosed; the stream is gone (a SYN may open its ID again).
func TestMuxadoCloseHalfClosesAndForgets(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("a"), false, true))
	p.probe() // the byte is buffered (muxado queues a stream before it buffers its bytes)
	st := e.accept(t)
	within(t, goErr(st.Close), "Close")
	if got, want := p.read(), mxData(1, finFlag, ""); got != want {
		t.Fatalf("Close wrote %v, want %v", got, want)
	}
	if _, err := st.Write([]byte("z")); err == nil {
		t.Fatal("a Write after Close succeeded")
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	var err error
	for range 2 { // the byte buffered, then the error
		if _, err = st.Read(make([]byte, 10)); err != nil {
			break
		}
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Reads after Close: %v, want an error at once", err)
	}
	p.send(packData(t, 1, []byte("late"), false, false))
	want := []mxFrame{mxWndInc(1, 1), mxRst(1, muxado.StreamClosed)} // the byte read, then the answer
	if got := p.probe(); !equalFrames(got, want) {
		t.Fatalf("DATA on a stream closed here: answered %v, want %v", got, want)
	}
	// Forgotten: a SYN of the same ID opens a new stream, where one for a
	// stream muxado still has ends the session (item 19).
	p.send(packData(t, 1, []byte("again"), false, true))
	if st2 := e.accept(t); st2.Id() != 1 || st2 == st {
		t.Fatalf("accepted %v, want a new stream 1", st2)
	}
	if e.tr.isClosed() {
		t.Fatal("the session died: muxado kept the closed stream")
	}
}

// TestMuxadoForgetsAStreamEndedBothWays guards item 16, "A stream ended
// both ways is forgotten", whichever way ended first, with the peer's FIN
// in a frame whose payload was taken.
func TestMuxadoForgetsAStreamEndedBothWays(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true, take: true})
	// Stream 1: the peer's FIN first, then this end's.
	p.send(packData(t, 1, []byte("a"), false, true), packData(t, 1, []byte("b"), true, false))
	p.probe()
	first := e.accept(t)
	if err := first.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Stream 3: this end's FIN first, then the peer's.
	p.send(packData(t, 3, []byte("c"), false, true))
	second := e.accept(t)
	if err := second.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	p.send(packData(t, 3, []byte("d"), true, false))
	want := []mxFrame{mxData(1, finFlag, ""), mxData(3, finFlag, "")}
	if got := p.probe(); !equalFrames(got, want) {
		t.Fatalf("wrote %v, want %v", got, want)
	}
	// Forgotten: a SYN of the same ID opens a new stream, where one for a
	// stream muxado still has ends the session (item 19).
	p.send(packData(t, 1, []byte("again"), false, true), packData(t, 3, []byte("again"), false, true))
	for _, old := range []muxado.Stream{first, second} {
		if st := e.accept(t); st.Id() != old.Id() || st == old {
			t.Fatalf("accepted %v, want a new stream %d", st, old.Id())
		}
	}
	if e.tr.isClosed() {
		t.Fatal("the session died: muxado kept a stream ended both ways")
	}
}

// TestMuxadoReadDeadlineInThePast guards item 17, "A read deadline that
// passed fails a Read at once with os.ErrDeadlineExceeded, even with bytes
// buffered".
func TestMuxadoReadDeadlineInThePast(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("hello"), false, true))
	p.probe() // the bytes are buffered
	st := e.accept(t)
	st.SetReadDeadline(time.Unix(1, 0)) // as Session.reset does
	if n, err := st.Read(make([]byte, 10)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline: %d, %v; want 0, %v", n, err, os.ErrDeadlineExceeded)
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	b := make([]byte, 10)
	if n, err := st.Read(b); string(b[:n]) != "hello" || err != nil {
		t.Fatalf("Read once the deadline moved: %q, %v", b[:n], err)
	}
}

// TestMuxadoWriteDeadlineBoundsTheWaitForTheWriter guards item 18, "A write
// deadline bounds the wait for muxado's writer": with the framer stuck on
// a stalled transport, a Write whose deadline passed fails with
// WriteTimeout.
func TestMuxadoWriteDeadlineBoundsTheWaitForTheWriter(t *testing.T) {
	e, p := stockEnd(t, mxOptions{pipe: true}) // nobody reads the pipe yet
	a, err := e.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	stuck := goErr(func() error { _, err := a.Write([]byte("stuck")); return err })
	e.fr.waitEntered(t, mxData(a.Id(), synFlag, "stuck")) // the writer is stuck writing it

	b, err := e.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	b.SetWriteDeadline(time.Now()) // passed at once: no timer is waited for
	timedOut := goErr(func() error { _, err := b.Write([]byte("late")); return err })
	if err := within(t, timedOut, "a Write past its deadline"); codeOf(err) != muxado.WriteTimeout {
		t.Fatalf("a Write past its deadline, its frame waiting for the writer: %v, want code WriteTimeout", err)
	}
	go io.Copy(io.Discard, p.conn) // the transport flows again
	if err := within(t, stuck, "the stuck Write"); err != nil {
		t.Fatalf("the Write without a deadline: %v", err)
	}
}

// TestMuxadoClosesItsTransportWhenItDies guards item 19: muxado closes its
// transport whenever its session dies, of each cause, and not for frames
// it handles and lives on; Wait returns the cause. (Item 3's "an error
// from WriteFrame kills the session" is the WriteFrame case.)
func TestMuxadoClosesItsTransportWhenItDies(t *testing.T) {
	isData := func(id uint32) func(frame.Frame) bool {
		return func(f frame.Frame) bool { return f.Type() == frame.TypeData && uint32(f.StreamId()) == id }
	}
	failOn := func(match func(frame.Frame) bool) func(frame.Frame) error {
		return func(f frame.Frame) error {
			if match(f) {
				return errContract
			}
			return nil
		}
	}
	isRst := func(id uint32) func(frame.Frame) bool {
		return func(f frame.Frame) bool { return f.Type() == frame.TypeRst && uint32(f.StreamId()) == id }
	}
	cases := []struct {
		name string
		opts mxOptions
		kill func(e *mxEnd, p *rawPeer)
		code muxado.ErrorCode // the code of Wait's error; ErrorUnknown: errContract
	}{
		{"Close", mxOptions{}, func(e *mxEnd, p *rawPeer) { e.Close() }, muxado.SessionClosed},
		{"the peer closes", mxOptions{}, func(e *mxEnd, p *rawPeer) { p.conn.Close() }, muxado.PeerEOF},
		{"ReadFrame fails", mxOptions{failRead: failOn(isData(99))}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 99, []byte("x"), false, false))
		}, muxado.ErrorUnknown},
		{"ReadFrame panics", mxOptions{panicRead: isData(97)}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 97, []byte("x"), false, false))
		}, muxado.InternalError},
		{"a SYN of this end's parity", mxOptions{server: true}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 2, []byte("x"), false, true))
		}, muxado.ProtocolError},
		{"a second SYN for an open stream", mxOptions{server: true}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 1, []byte("x"), false, true), packData(t, 1, []byte("y"), false, true))
		}, muxado.ProtocolError},
		{"WriteFrame fails", mxOptions{failWrite: failOn(isRst(95))}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 95, []byte("x"), false, false)) // answered with a RST
		}, muxado.ErrorUnknown},
		{"WriteFrame panics", mxOptions{panicWrite: isRst(93)}, func(e *mxEnd, p *rawPeer) {
			p.send(packData(t, 93, []byte("x"), false, false))
		}, muxado.InternalError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, p := stockEnd(t, c.opts)
			p.probe() // alive
			if e.tr.isClosed() {
				t.Fatal("the transport was closed before the session died")
			}
			c.kill(e, p)
			e.tr.waitClosed(t)
			err := e.localErr(t)
			if c.code == muxado.ErrorUnknown {
				if !errors.Is(err, errContract) {
					t.Fatalf("the session died of %v, want the framer's error %v", err, errContract)
				}
			} else if codeOf(err) != c.code {
				t.Fatalf("the session died of %v (code %d), want code %d", err, codeOf(err), c.code)
			}
		})
	}
	t.Run("only then", func(t *testing.T) {
		e, p := stockEnd(t, mxOptions{server: true, window: MinWindow})
		p.send(
			packGoAway(t, 0, frame.ErrorCode(muxado.NoError), []byte("bye")),
			packRst(t, 11, frame.ErrorCode(muxado.StreamCancelled)), // a stream it does not have
			packData(t, 13, []byte("x"), false, false),              // likewise
			packWndInc(t, 15, 100),                                  // likewise
			packData(t, 1, payload(MinWindow), false, true),         // a stream
			packData(t, 1, []byte("x"), false, false),               // past its window
			packData(t, 3, []byte("x"), false, true),                // a stream
			packRst(t, 3, frame.ErrorCode(muxado.StreamCancelled)),  // reset by the peer
		)
		want := []mxFrame{mxRst(13, muxado.StreamClosed), mxRst(1, muxado.FlowControlError)}
		if got := p.probe(); !equalFrames(got, want) {
			t.Fatalf("answered %v, want %v", got, want)
		}
		if e.tr.isClosed() || e.tr.closes.Load() != 0 {
			t.Fatal("muxado closed its transport, its session alive")
		}
	})
}

// TestMuxadoWritesGoAwayOnlyAsItDies guards item 20, "GOAWAY only as it
// dies": none over a session's life; Close's through WriteFrame, of code
// NoError, "no error", and the last stream the peer opened.
func TestMuxadoWritesGoAwayOnlyAsItDies(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true, backlog: 1})
	// A life: streams the peer opens, read and answered, one turned away
	// for a full queue, a reset, a frame for a stream it does not have.
	p.send(packData(t, 1, []byte("hi"), false, true))
	st := e.accept(t)
	io.ReadFull(st, make([]byte, 2))
	st.Write([]byte("yo"))
	st.Close()
	p.send(packData(t, 3, []byte("ho"), false, true), packData(t, 5, []byte("full"), false, true))
	p.send(packRst(t, 3, frame.ErrorCode(muxado.StreamCancelled)))
	got := p.probe()
	for _, m := range got {
		if m.Type == frame.TypeGoAway {
			t.Fatalf("GOAWAY written by a living session: %v", got)
		}
	}
	e.Close()
	want := mxFrame{Type: frame.TypeGoAway, Last: 5, Code: uint32(muxado.NoError), Body: "no error"}
	m, err := p.readErr()
	if err != nil || m != want {
		t.Fatalf("Close wrote %v (%v), want %v", m, err, want)
	}
	if _, err := p.readErr(); err == nil {
		t.Fatal("a frame after the GOAWAY")
	}
	if !slices.Contains(e.fr.writtenFrames(), want) {
		t.Fatalf("the GOAWAY did not go through WriteFrame, which was given %v", e.fr.writtenFrames())
	}
}

// TestMuxadoOpenStreamFailsAfterGoAwayOrDeath guards item 21.
func TestMuxadoOpenStreamFailsAfterGoAwayOrDeath(t *testing.T) {
	t.Run("GOAWAY", func(t *testing.T) {
		e, p := stockEnd(t, mxOptions{})
		p.send(packGoAway(t, 0, frame.ErrorCode(muxado.NoError), []byte("bye")))
		p.probe()
		if _, err := e.OpenStream(); codeOf(err) != muxado.RemoteGoneAway {
			t.Fatalf("OpenStream after the peer's GOAWAY: %v, want code RemoteGoneAway", err)
		}
		if e.tr.isClosed() {
			t.Fatal("the session died of the peer's GOAWAY")
		}
	})
	t.Run("death", func(t *testing.T) {
		e, p := stockEnd(t, mxOptions{})
		before, err := e.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		p.conn.Close()
		// Once a stream opened before fails, the session has let go of
		// its streams.
		within(t, goErr(func() error { _, err := before.Read(make([]byte, 1)); return err }), "a stream to fail")
		if st, err := e.OpenStream(); err == nil {
			t.Fatalf("OpenStream after the session died: stream %d", st.Id())
		}
	})
}

// TestMuxadoStreamsFailWhenTheSessionDies guards item 22.
func TestMuxadoStreamsFailWhenTheSessionDies(t *testing.T) {
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("a"), false, true), packData(t, 3, []byte("b"), false, true))
	p.probe()
	st := e.accept(t) // 3 waits in the queue
	e.Close()
	if _, err := st.Write([]byte("x")); err == nil {
		t.Fatal("a Write after the session died succeeded")
	}
	st.SetReadDeadline(time.Now().Add(contractBound))
	var err error
	for range 2 { // the byte buffered, then the error
		if _, err = st.Read(make([]byte, 10)); err != nil {
			break
		}
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Reads after the session died: %v, want an error at once", err)
	}
	within(t, goErr(st.Close), "a stream's Close after the session died")
	for i := 0; ; i++ {
		r := within(t, e.goAccept(), "AcceptStream")
		if r.err != nil {
			break
		}
		if i > 0 || r.st.Id() != 3 {
			t.Fatalf("AcceptStream after the session died returned stream %d (call %d)", r.st.Id(), i)
		}
	}
}

// TestMuxadoCloseDoesNotWaitForAStalledTransport guards item 23: Close
// returns while the framer is stuck writing, and ends the stuck write.
func TestMuxadoCloseDoesNotWaitForAStalledTransport(t *testing.T) {
	e, _ := stockEnd(t, mxOptions{pipe: true}) // nobody reads the pipe
	a, err := e.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	stuck := goErr(func() error { _, err := a.Write([]byte("stuck")); return err })
	e.fr.waitEntered(t, mxData(a.Id(), synFlag, "stuck"))
	within(t, goErr(e.Close), "Close")
	if !e.tr.isClosed() {
		t.Fatal("Close returned, the transport open")
	}
	if err := within(t, stuck, "the stuck Write"); err == nil {
		t.Fatal("the stuck Write succeeded")
	}
}

// TestMuxadoGoroutinesEndWithTheSession guards item 24: a session's
// goroutines end once it died.
func TestMuxadoGoroutinesEndWithTheSession(t *testing.T) {
	for _, kill := range []string{"Close", "the peer closes"} {
		t.Run(kill, func(t *testing.T) {
			before := runtime.NumGoroutine()
			e, p := stockEnd(t, mxOptions{server: true})
			p.send(packData(t, 1, []byte("hi"), false, true))
			st := e.accept(t)
			io.ReadFull(st, make([]byte, 2))
			st.Write([]byte("yo"))
			p.probe()
			if kill == "Close" {
				e.Close()
			} else {
				p.conn.Close()
			}
			e.tr.waitClosed(t)
			p.conn.Close()
			testwait.Goroutines(t, before)
		})
	}
}

// TestMuxadoErrorCodes guards item 25, "The error codes on the wire".
func TestMuxadoErrorCodes(t *testing.T) {
	codes := []muxado.ErrorCode{
		muxado.NoError, muxado.ProtocolError, muxado.InternalError, muxado.FlowControlError,
		muxado.StreamClosed, muxado.StreamRefused, muxado.StreamCancelled, muxado.StreamReset,
		muxado.FrameSizeError, muxado.AcceptQueueFull,
	}
	for want, code := range codes {
		if int(code) != want {
			t.Errorf("muxado's error code number %d is %d", want, code)
		}
	}
	e, p := stockEnd(t, mxOptions{server: true})
	p.send(packData(t, 1, []byte("x"), false, true))
	st := e.accept(t)
	p.send(packRst(t, 1, 0xdead))
	p.probe()
	if _, err := st.Write([]byte("x")); codeOf(err) != 0xdead {
		t.Fatalf("GetError of a Write's error after a RST of code %#x: %v, code %#x", 0xdead, err, codeOf(err))
	}
}
