package edge

// Nothing a peer sends outlives its connection: whatever ends a session's
// transport (a read error, a frame muxado refuses, a reset heartbeat
// stream, a failed open), the session ends, its names go into the grace,
// and what it held (sessions, endpoints, streams, goroutines) returns to
// what it was, well before the heartbeat would have found the agent dead.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2/frame"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// A slow heartbeat: a session that ends within heldBound ended because its
// transport did, not because the heartbeat found its agent silent.
const (
	slowHeartbeat = 30 * time.Second
	heldBound     = 10 * time.Second
)

// rawAgent speaks muxado frames to an edge by hand, as a hostile agent
// would: any frame, in any order, at any stream ID.
type rawAgent struct {
	t    testing.TB
	conn net.Conn
	w    frame.Framer
	mu   sync.Mutex
	wmu  sync.Mutex
	last uint32 // the last stream ID it opened (odd)

	// What the edge sent, by stream: the payloads of streams this agent
	// opened, and the streams the edge opened.
	got      map[uint32]*bytes.Buffer
	answered map[uint32]chan struct{} // closed at a control stream's FIN or RST
	edgeOpen []uint32                 // the streams the edge opened, in order
	read     chan struct{}            // closed when reading ends
}

// dialRawAgent opens a transport to the edge at addr and exchanges the
// preamble.
func dialRawAgent(t testing.TB, addr string) *rawAgent {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := wire.WritePreamble(c, wire.DefaultWindow); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(heldBound))
	if _, err := wire.ReadPreamble(c); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	a := &rawAgent{t: t, conn: c, w: frame.NewFramer(nil, c), got: map[uint32]*bytes.Buffer{},
		answered: map[uint32]chan struct{}{}, read: make(chan struct{})}
	go a.readLoop()
	return a
}

// readLoop reads the edge's frames until the transport fails. It never
// grants window: the edge's streams to this agent hold at most a window.
func (a *rawAgent) readLoop() {
	defer close(a.read)
	r := frame.NewFramer(a.conn, io.Discard)
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return
		}
		id := uint32(f.StreamId())
		a.mu.Lock()
		switch f := f.(type) {
		case *frame.Data:
			if f.Syn() && id%2 == 0 {
				a.edgeOpen = append(a.edgeOpen, id)
			}
			b := a.got[id]
			if b == nil {
				b = &bytes.Buffer{}
				a.got[id] = b
			}
			io.Copy(b, f.Reader())
			if f.Fin() {
				a.answerLocked(id)
			}
		case *frame.Rst:
			a.answerLocked(id)
		}
		a.mu.Unlock()
	}
}

func (a *rawAgent) answerLocked(id uint32) {
	if ch := a.answered[id]; ch != nil {
		close(ch)
		delete(a.answered, id)
	}
}

// write writes f, ignoring errors: a hostile agent goes on regardless.
func (a *rawAgent) write(f frame.Frame) {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	a.conn.SetWriteDeadline(time.Now().Add(time.Second))
	a.w.WriteFrame(f)
}

func (a *rawAgent) data(id uint32, payload []byte, fin, syn bool) {
	d := new(frame.Data)
	if d.Pack(frame.StreamId(id), payload, fin, syn) == nil {
		a.write(d)
	}
}

// open opens a stream with payload as its first frame, half-closed, and
// returns a channel closed once the edge answered it (FIN or RST).
func (a *rawAgent) open(payload []byte) (uint32, <-chan struct{}) {
	a.mu.Lock()
	a.last += 2
	if a.last == 0 || a.last%2 == 0 {
		a.last = 1
	}
	id := a.last
	ch := make(chan struct{})
	a.answered[id] = ch
	a.mu.Unlock()
	a.data(id, payload, true, true)
	return id, ch
}

// request sends a control request on a stream of its own and waits, at
// most a second, for the answer.
func (a *rawAgent) request(req wire.Request) wire.Response {
	var buf bytes.Buffer
	wire.WriteMessage(&buf, []byte{byte(wire.StreamControl)}, req)
	id, answered := a.open(buf.Bytes())
	select {
	case <-answered:
	case <-a.read:
	case <-time.After(time.Second):
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var resp wire.Response
	if b := a.got[id]; b != nil {
		wire.ReadMessage(bytes.NewReader(b.Bytes()), &resp)
	}
	return resp
}

func (a *rawAgent) hello(version int) wire.Response {
	return a.request(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: version}})
}

func (a *rawAgent) bind(name string) wire.Response {
	return a.request(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: name}})
}

// lastEdgeStream returns the stream the edge opened last (its heartbeat
// stream, a ping, a proxy stream), or 0 when none.
func (a *rawAgent) lastEdgeStream() uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.edgeOpen) == 0 {
		return 0
	}
	return a.edgeOpen[len(a.edgeOpen)-1]
}

// waitEdgeStream waits, at most a second, for the edge to open a stream.
func (a *rawAgent) waitEdgeStream() uint32 {
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if id := a.lastEdgeStream(); id != 0 {
			return id
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0
}

func (a *rawAgent) rst(id uint32) {
	r := new(frame.Rst)
	if r.Pack(frame.StreamId(id), frame.ErrorCode(0x5)) == nil {
		a.write(r)
	}
}

// held is what an edge holds for its agent sessions.
type held struct {
	sessions, pending, identities, endpoints int
	kept                                     int // names kept in a grace, which count against the quotas too
	streams, observed                        int64
	goroutines                               int
}

func (h held) String() string {
	return fmt.Sprintf("%d sessions (%d observed), %d pending, %d identities, %d endpoints (and %d kept), %d streams, %d goroutines",
		h.sessions, h.observed, h.pending, h.identities, h.endpoints, h.kept, h.streams, h.goroutines)
}

// within reports whether h holds no more than base.
func (h held) within(base held) bool {
	return h.sessions <= base.sessions && h.observed <= base.observed && h.pending <= base.pending &&
		h.identities <= base.identities && h.endpoints <= base.endpoints &&
		h.streams <= base.streams && h.goroutines <= base.goroutines
}

// counting is an Observer that counts sessions and streams.
type counting struct {
	nopObserver
	sessions, streams atomic.Int64
}

func (c *counting) Session(d int) { c.sessions.Add(int64(d)) }
func (c *counting) Stream(d int)  { c.streams.Add(int64(d)) }

// endEdge is an edge with a slow heartbeat, for a hostile agent.
type endEdge struct {
	srv  *Server
	obs  *counting
	rt   *router.MemoryRouter
	addr string
	pub  http.Handler
}

func startEndEdge(t testing.TB, grace time.Duration) *endEdge {
	t.Helper()
	e := &endEdge{obs: &counting{}, rt: &router.MemoryRouter{}}
	e.srv = &Server{Domain: "example.test", Router: e.rt, Observer: e.obs,
		Timeouts: Timeouts{HeartbeatInterval: slowHeartbeat, HeartbeatTimeout: slowHeartbeat, Grace: grace}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); e.srv.ServeAgents(ln) }()
	t.Cleanup(func() { e.srv.Close(); <-done })
	e.pub = e.srv
	// One session, said hello and gone: the edge's own goroutines (its
	// listener's, the router's feed) run from then on.
	a := dialRawAgent(t, e.addr)
	if resp := a.hello(wire.Version); resp.HelloResp == nil {
		t.Fatalf("hello: %+v", resp.Error)
	}
	a.conn.Close()
	deadline := time.Now().Add(heldBound)
	for e.obs.sessions.Load() != 0 || e.held().sessions != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first session never ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return e
}

// held returns what the edge holds now.
func (e *endEdge) held() held {
	s := e.srv
	var h held
	s.mu.Lock()
	h.sessions = len(s.sessions)
	h.identities = len(s.perIdentity)
	s.mu.Unlock()
	h.pending = s.pending.Len()
	total, _, kept := s.quotas.Counts(netip.Prefix{}, s.now())
	h.kept, h.endpoints = kept, total-kept
	h.streams = e.obs.streams.Load()
	h.observed = e.obs.sessions.Load()
	h.goroutines = runtime.NumGoroutine()
	return h
}

// backToBase waits until the edge holds no more than base, within
// heldBound: well before the heartbeat's timeout.
func (e *endEdge) backToBase(t testing.TB, base held, what string) {
	t.Helper()
	deadline := time.Now().Add(heldBound)
	for {
		h := e.held()
		if h.within(base) {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Logf("%s", buf[:runtime.Stack(buf, true)])
			t.Fatalf("%s: %v after the transport closed, still %v; before it: %v", what, heldBound, h, base)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// get sends a public request for name to the edge's HTTP handler, with a
// context that ends with the test, and returns at once; the request is
// over when the returned channel closes.
func (e *endEdge) get(ctx context.Context, name string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		req := httptest.NewRequestWithContext(ctx, "GET", "http://"+name+".example.test/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		e.pub.ServeHTTP(httptest.NewRecorder(), req)
	}()
	return done
}

// The steps a hostile agent plays, one a byte of its script.
const (
	stepHello2       = iota // a version 2 hello, answered
	stepHello3              // a version 3 hello, answered
	stepBind                // a bind of a new name, answered
	stepResetEdge           // RST of the stream the edge opened last (its heartbeat, for version 2)
	stepWrongParity         // a SYN on a stream ID of the edge's parity: muxado dies
	stepDuplicateSyn        // a second SYN for the stream opened last: muxado dies
	stepRst                 // RST of some stream
	stepWndInc              // a huge window increment for the edge's last stream
	stepGoAway              // GOAWAY
	stepGarbage             // a frame header of nonsense
	stepHeartbeat           // a heartbeat stream of its own (version 2's)
	stepPing                // a ping stream (version 3's)
	stepPartial             // a control message announced long, cut short
	stepOrphanData          // DATA on a stream never opened
	stepRequest             // a public request to the last name bound
	stepHalfClose           // the agent's write side of the transport shut
	stepWaitEdge            // wait for the edge to open a stream
	steps
)

// nameSeq numbers the names scripts bind: each is new.
var nameSeq atomic.Int64

// takesArg marks the steps that take the next byte of the script as their
// argument.
var takesArg = [steps]bool{stepBind: true, stepWrongParity: true, stepRst: true, stepGoAway: true, stepGarbage: true, stepOrphanData: true}

// play plays script against the edge as a, and returns the public
// requests it started and the names it bound.
func (e *endEdge) play(ctx context.Context, a *rawAgent, script []byte) (reqs []<-chan struct{}, names []string) {
	for i := 0; i < len(script); i++ {
		step := script[i] % steps
		arg := byte(0)
		if takesArg[step] && i+1 < len(script) {
			i++
			arg = script[i]
		}
		switch step {
		case stepHello2:
			a.hello(2)
		case stepHello3:
			a.hello(3)
		case stepBind:
			name := fmt.Sprintf("n%d-%d", nameSeq.Add(1), arg)
			if resp := a.bind(name); resp.BindResp != nil {
				names = append(names, name)
			}
		case stepResetEdge:
			if id := a.lastEdgeStream(); id != 0 {
				a.rst(id)
			}
		case stepWrongParity:
			a.data(uint32(arg)*2+2, []byte{byte(wire.StreamControl)}, false, true)
		case stepDuplicateSyn:
			a.mu.Lock()
			a.last += 2
			id := a.last
			a.mu.Unlock()
			a.data(id, []byte{byte(wire.StreamControl), 0, 0}, false, true)
			a.data(id, []byte{0, 9}, false, true)
		case stepRst:
			a.rst(uint32(arg))
		case stepWndInc:
			w := new(frame.WndInc)
			if w.Pack(frame.StreamId(a.lastEdgeStream()), 1<<31-1) == nil {
				a.write(w)
			}
		case stepGoAway:
			g := new(frame.GoAway)
			if g.Pack(frame.StreamId(a.last), frame.ErrorCode(arg), []byte("away")) == nil {
				a.write(g)
			}
		case stepGarbage:
			a.wmu.Lock()
			a.conn.Write([]byte{0, 0, 4, arg, 0, 0, 0, arg, 1, 2, 3, 4})
			a.wmu.Unlock()
		case stepHeartbeat:
			a.open([]byte{byte(wire.StreamHeartbeat), 0, 0, 0, 0, 0, 0, 0, 1})
		case stepPing:
			a.open([]byte{byte(wire.StreamPing), 0, 0, 0, 0, 0, 0, 0, 1})
		case stepPartial:
			a.open([]byte{byte(wire.StreamControl), 0, 1, 0, 0, '{'})
		case stepOrphanData:
			a.data(uint32(arg)|1+1000, []byte("orphan"), false, false)
		case stepRequest:
			if len(names) > 0 {
				reqs = append(reqs, e.get(ctx, names[len(names)-1]))
			}
		case stepHalfClose:
			if tc, ok := a.conn.(*net.TCPConn); ok {
				a.wmu.Lock()
				tc.CloseWrite()
				a.wmu.Unlock()
			}
		case stepWaitEdge:
			a.waitEdgeStream()
		}
	}
	return reqs, names
}

// afterEnd waits for the public requests through an ended session to end,
// and checks that none of its names is routed still.
func (e *endEdge) afterEnd(t testing.TB, reqs []<-chan struct{}, names []string) {
	t.Helper()
	for _, done := range reqs {
		select {
		case <-done:
		case <-time.After(heldBound):
			t.Fatal("a public request through the session did not end with it")
		}
	}
	for _, name := range names {
		if routes, _ := e.rt.Lookup(context.Background(), wire.ProtoHTTP, name+".example.test"); len(routes) > 0 {
			t.Fatalf("%s is routed still, to the session that ended", name)
		}
	}
}

// sessionEndCases are the cases issue #32 found, for versions 2 and 3,
// and the fuzz test's seeds.
var sessionEndCases = []struct {
	name   string
	script []byte
	binds  int // names the script binds (when its hello is accepted)
	// open: the agent leaves its transport open, and the session must
	// end all the same (what the script did ended it).
	open bool
}{
	// (Issue #32 reset the heartbeat before binding; the edge now ends
	// the session at the reset, so the binds come first here.)
	{"v2 heartbeat reset, binds, SYN of the edge's parity", []byte{stepHello2, stepWaitEdge, stepBind, 1, stepBind, 2, stepResetEdge, stepWrongParity, 0}, 2, false},
	{"v2 heartbeat reset, binds, duplicate SYN", []byte{stepHello2, stepWaitEdge, stepBind, 1, stepBind, 2, stepResetEdge, stepDuplicateSyn}, 2, false},
	{"v2 binds, SYN of the edge's parity", []byte{stepHello2, stepBind, 1, stepWrongParity, 7}, 1, false},
	{"v3 binds, SYN of the edge's parity", []byte{stepHello3, stepBind, 1, stepBind, 2, stepWrongParity, 0}, 2, false},
	{"v3 binds, duplicate SYN", []byte{stepHello3, stepBind, 1, stepDuplicateSyn}, 1, false},
	{"v3 ping reset, binds, SYN of the edge's parity", []byte{stepHello3, stepBind, 1, stepRequest, stepWaitEdge, stepResetEdge, stepWrongParity, 3}, 1, false},
	{"v2 hello and bad frame, no binds", []byte{stepHello2, stepWrongParity, 0}, 0, false},
	{"v3 hello and bad frame, no binds", []byte{stepHello3, stepDuplicateSyn}, 0, false},
	{"v2 heartbeat reset, transport open", []byte{stepHello2, stepWaitEdge, stepBind, 4, stepResetEdge}, 1, true},
	{"v3 GOAWAY, then a request, transport open", []byte{stepHello3, stepBind, 1, stepGoAway, 0, stepRequest}, 1, true},
	{"v3 bad frame, transport open", []byte{stepHello3, stepBind, 1, stepWrongParity, 1}, 1, true},
	{"v3 requests in flight, bad frame", []byte{stepHello3, stepBind, 1, stepRequest, stepRequest, stepWaitEdge, stepWrongParity, 1}, 1, false},
	{"v2 half-closed transport", []byte{stepHello2, stepBind, 1, stepHalfClose}, 1, false},
	{"v3 garbage", []byte{stepHello3, stepBind, 1, stepGarbage, 9}, 1, false},
}

// TestSessionEndsWithItsTransport plays each case, then closes the
// transport: the session ends at once (not after the heartbeat's timeout),
// its names go into the grace (reserved for their identity), and
// everything it held is given back.
func TestSessionEndsWithItsTransport(t *testing.T) {
	e := startEndEdge(t, time.Minute)
	for _, c := range sessionEndCases {
		t.Run(c.name, func(t *testing.T) {
			base := e.held()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a := dialRawAgent(t, e.addr)
			reqs, names := e.play(ctx, a, c.script)
			if len(names) != c.binds {
				t.Fatalf("the script bound %d names, want %d", len(names), c.binds)
			}
			if !c.open {
				a.conn.Close()
			}
			e.backToBase(t, base, c.name)
			e.afterEnd(t, reqs, names)
			if kept := e.held().kept - base.kept; kept != len(names) {
				t.Fatalf("%d names kept in the grace count against the quotas, want %d", kept, len(names))
			}
			for _, name := range names {
				if _, until, ok := e.rt.Holder(wire.ProtoHTTP, name+".example.test"); !ok || until.IsZero() {
					t.Fatalf("%s is not kept in the grace (held %v, until %v)", name, ok, until)
				}
			}
		})
	}
}

// FuzzSessionEndsWithItsTransport: any script of frames followed by a
// close leaves the edge holding what it held before, well within the
// heartbeat's timeout.
func FuzzSessionEndsWithItsTransport(f *testing.F) {
	for _, c := range sessionEndCases {
		f.Add(c.script)
	}
	f.Add([]byte{stepHello3, stepBind, 0, stepPartial, stepPartial, stepHeartbeat, stepPing, stepOrphanData, 5, stepRst, 3, stepWndInc})
	f.Add([]byte{stepPartial, stepPartial})
	f.Add([]byte{stepGarbage, 0xff})
	e := startEndEdge(f, -1)
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 32 {
			script = script[:32] // each step may wait up to a second
		}
		base := e.held()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		a := dialRawAgent(t, e.addr)
		reqs, names := e.play(ctx, a, script)
		a.conn.Close()
		e.backToBase(t, base, fmt.Sprintf("script %v", script))
		e.afterEnd(t, reqs, names)
	})
}
