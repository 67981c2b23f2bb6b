package edge

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/book"
	"github.com/tunnelkit/tunnelkit/edge/internal/limits"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/slogattrs"
	"github.com/tunnelkit/tunnelkit/internal/smallmap"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// session is one agent's connection to the edge.
type session struct {
	srv  *Server
	id   string
	mux  *wire.Session
	log  *slog.Logger
	src  net.Addr // the agent's address
	conn net.Conn // the transport, closed to evict a session still waiting for its hello

	done    chan struct{}       // closed when the session ends
	pending *limits.PendingConn // in srv.pending until the hello was decided

	open atomic.Int64 // streams open now, both ways

	mu       sync.Mutex
	hello    helloState
	previous string // the session this one replaced (its ticket said so), for router.Move
	identity string
	version  int                                  // the protocol's, the agent's name and when its hello came, for the view
	agent    string                               //
	since    time.Time                            //
	routes   smallmap.Map[string, *book.Endpoint] // the endpoints bound on this session, by tunnel ID
	// replaced maps the tunnel ID of an endpoint changed in place to the
	// one that took its place, for the conns sent to it as it changed: at
	// most one for each endpoint.
	replaced map[string]string
	binding  int // binds under way, counted against the endpoint bound
	// bindsDone, made while a relay stream waits for the binds under
	// way (heldRoute), is closed when binding drops to 0.
	bindsDone chan struct{}
	stopPing  func() // stops the version 3 pinger; nil before the hello, or for version 2
	// helloTimer drops the session if no hello came in time; stopped,
	// and let go, once the hello was accepted or the session ended.
	helloTimer *time.Timer
	closed     bool
	// controls are the control requests served now, at most maxControl;
	// controlFree, made while others wait, is closed when one ends.
	controls    int
	controlFree chan struct{}
	streams     sync.WaitGroup // stream handlers
}

// helloState is where a session is in its hello: it moves forward only,
// and only one hello is ever decided.
type helloState int

const (
	helloNone     helloState = iota // nothing yet
	helloDeciding                   // a hello is being decided
	helloAccepted                   // the session is open
	helloRefused                    // the session ends shortly
)

// maxControl bounds the control requests of one session served at once;
// others wait for their turn.
const maxControl = 8

// acceptBacklog is how many streams an agent may have opened that wait to
// be accepted; past it, the session reads nothing more from the agent
// until the accepting goroutine caught up (Session.Serve). The edge
// accepts each stream as it comes and serves it in a goroutine of its
// own, and an agent opens few at once (its control requests, a ping now
// and then), so the queue holds only what arrives while the accepting
// goroutine waits for a CPU. muxado's default room for 128 costs 2 KiB a
// session.
const acceptBacklog = 16

// errTooManyStreams refuses a stream past Server.MaxStreamsPerSession.
var errTooManyStreams = errors.New("edge: too many streams on the agent's session")

// acquire counts one more open stream, unless the session is at its bound.
func (ss *session) acquire() bool {
	n := ss.open.Add(1)
	if max := int64(ss.srv.cfg().streamsPerSession); max > 0 && n > max {
		ss.open.Add(-1)
		return false
	}
	ss.srv.obs().Stream(1)
	return true
}

// release counts one open stream less.
func (ss *session) release() {
	ss.open.Add(-1)
	ss.srv.obs().Stream(-1)
}

// serveSession runs the session of an agent that came to an agent port
// (ServeAgents) until it ends.
func (s *Server) serveSession(c net.Conn) {
	s.serveAgent(c, func(c net.Conn) (net.Conn, error) {
		if s.AgentTLS == nil {
			return c, nil
		}
		// The handshake happens on the preamble's first read, bounded by
		// its deadline, in its turn.
		tc, cfg := s.turnTLS(c, s.AgentTLS)
		return tls.Server(wire.BatchWrites(tc), cfg), nil
	})
}

// serveAgent runs one agent session on c until it ends, then removes its
// routes: agents of both ports, the agent port's (serveSession) and the
// public TLS port's (serveTLSAgent), take this one path. secure returns
// the conn the session speaks on, c itself or TLS over it; it runs once c
// counts among the pending sessions, so that connections that never say
// hello are bounded together, whether they stop in their TLS handshake or
// after it.
func (s *Server) serveAgent(c net.Conn, secure func(net.Conn) (net.Conn, error)) {
	if s.auth.Blocked(limits.SourceOf(c.RemoteAddr())) {
		s.obs().Refused(ReasonAuthThrottled)
		c.Close()
		return
	}
	pending := s.addPending(c)
	raw := c
	c, err := secure(raw)
	if err != nil {
		s.log().Debug("agent session refused", "agent_addr", raw.RemoteAddr().String(), "err", err)
		raw.Close()
		s.donePending(pending)
		return
	}
	window, err := s.preamble(c)
	if err != nil {
		s.log().Debug("agent session refused", "agent_addr", c.RemoteAddr().String(), "err", err)
		c.Close()
		s.donePending(pending)
		return
	}
	ss := &session{
		srv:     s,
		id:      newID(),
		mux:     wire.NewSession(c, window, false, acceptBacklog),
		src:     c.RemoteAddr(),
		conn:    raw,
		done:    make(chan struct{}),
		pending: pending,
	}
	ss.log = discard
	if s.Logger != nil {
		ss.log = slogattrs.New(s.Logger.Handler(), ss) // with the session's attributes, formatted only with each line
	}
	if max := s.cfg().sessionUnread; max > 0 {
		ss.mux.LimitUnread(int64(max), ss.cutUnread)
		ss.mux.LimitStalled(max/int(s.cfg().window), wire.StallAfter, ss.cutStalled)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ss.mux.Close()
		s.donePending(pending)
		return
	}
	if s.sessions == nil {
		s.sessions = map[string]*session{}
	}
	s.sessions[ss.id] = ss
	s.mu.Unlock()

	// An agent that does not say hello in time is dropped.
	helloTimer := time.AfterFunc(s.cfg().handshake, func() {
		if ss.helloState() != helloAccepted {
			ss.log.Debug("agent sent no hello in time")
			ss.close(s.cfg().grace)
		}
	})
	ss.mu.Lock()
	ss.helloTimer = helloTimer
	ss.mu.Unlock()

	// The streams are accepted as they come, by a goroutine that runs only
	// while they do (wire.Session.Serve): an idle session's goroutines are
	// muxado's reader and its writer. This one ends here.
	if !s.track() {
		ss.close(s.cfg().grace) // the server is closing
		ss.stopHelloTimer()
		s.donePending(pending)
		return
	}
	early := 0 // streams opened before the hello was accepted
	ss.mux.Serve(func(st *wire.Stream) { ss.accepted(st, &early) }, func() {
		ss.close(s.cfg().grace)
		ss.streams.Wait()
		ss.stopHelloTimer()
		s.donePending(pending)
		s.wg.Done()
	})
}

// accepted serves a stream the agent opened, in a goroutine of its own:
// each stream's header is read there, so a peer that opens a stream and
// stays silent delays nothing else. Serve hands the streams over one at a
// time: early counts those opened before the hello was accepted.
func (ss *session) accepted(st *wire.Stream, early *int) {
	select {
	case <-ss.done: // the session is closing
		st.Close()
		return
	default:
	}
	// Before its hello is accepted, a session may open one stream: the
	// hello's. Anything more is a peer that does not speak the protocol,
	// or one trying to make the edge hold streams for free.
	if ss.helloState() != helloAccepted {
		if *early++; *early > 1 {
			ss.log.Debug("agent opened streams before its hello was accepted; closing the session")
			st.Close()
			ss.close(ss.srv.cfg().grace)
			return
		}
	}
	if !ss.acquire() {
		st.Close()
		return
	}
	ss.streams.Go(func() {
		defer ss.release()
		ss.handleStream(st)
	})
}

// preamble reads the agent's session preamble and answers with the stream
// window both ends will use, within the handshake timeout. Close ends it
// early: the conn is tracked meanwhile.
func (s *Server) preamble(c net.Conn) (uint32, error) {
	if !s.trackConn(c, true) {
		return 0, ErrServerClosed
	}
	defer s.trackConn(c, false)
	c.SetDeadline(time.Now().Add(s.cfg().handshake))
	want, err := wire.ReadPreamble(c)
	if err != nil {
		return 0, err
	}
	window := min(want, s.cfg().window)
	if err := wire.WritePreamble(c, window); err != nil {
		return 0, err
	}
	return window, c.SetDeadline(time.Time{})
}

func (ss *session) helloState() helloState {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.hello
}

// close ends the session: its routes go at once, their names reserved for
// its identity for reserve, then the mux is closed, which fails every
// stream in flight. Only the first call does anything.
func (ss *session) close(reserve time.Duration) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	close(ss.done)
	if ss.stopPing != nil {
		ss.stopPing()
	}
	var routes []*book.Endpoint
	for _, e := range ss.routes.All() {
		routes = append(routes, e)
	}
	ss.routes.Clear()
	counted := ss.hello == helloAccepted
	ss.mu.Unlock()

	s := ss.srv
	s.mu.Lock()
	delete(s.sessions, ss.id)
	if counted {
		s.obs().Session(-1)
		if s.perIdentity[ss.identity]--; s.perIdentity[ss.identity] <= 0 {
			delete(s.perIdentity, ss.identity)
		}
	}
	s.mu.Unlock()
	for _, e := range routes {
		s.obs().Endpoint(e.Route.Proto, -1)
		if e.Health() == view.HealthDown {
			s.countDown(e.Route.Proto, false)
		}
		s.unbind(e.Route, reserve)
		// Each route was counted at its bind (routes come after the
		// hello): it counts on while its name is kept.
		s.keepEndpoint(ss.owner(), endpointOf(e.Route), s.keptUntil(e.Route, reserve))
		ss.note(e.Event(view.Unbind))
	}
	ss.mux.Close()
	if counted {
		ss.note(view.Event{Kind: view.SessionDown})
		ss.log.Info("session closed", "routes", len(routes))
	}
	s.moves.Done(ss)
}

// keptUntil returns until when r's name is kept for its identity, now
// that its route was unbound with reserve; zero if it is not. A name is
// kept unless reserve is not positive, or the Router says it is not (the
// in-memory one tells: it does not keep a name that still has routes, a
// pool's); a Router that does not tell keeps it, as rule 4 of
// router.Router has it for a name's last route.
func (s *Server) keptUntil(r router.Route, reserve time.Duration) time.Time {
	if reserve <= 0 {
		return time.Time{}
	}
	if h, ok := s.router().(interface {
		Holder(proto, name string) (string, time.Time, bool)
	}); ok {
		if identity, until, held := h.Holder(r.Proto, r.Name); !held || identity != r.Identity || until.IsZero() {
			return time.Time{}
		}
	}
	return s.now().Add(reserve)
}

// unbind removes r from the router, keeping its name reserved for its
// identity for reserve.
func (s *Server) unbind(r router.Route, reserve time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.router().Unbind(ctx, r, reserve); err != nil {
		s.log().Warn("unbind", "name", r.Name, "err", err)
	}
	s.releasePolicy(r)
	s.ups.CloseRoute(r)
	if r.Proto == wire.ProtoTCP {
		s.closeTCP(r.Name)
	}
}

// handleStream reads a stream's type and serves it.
func (ss *session) handleStream(st *wire.Stream) {
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(ss.srv.cfg().handshake))
	var t [1]byte
	if _, err := io.ReadFull(st, t[:]); err != nil {
		return
	}
	switch wire.StreamType(t[0]) {
	case wire.StreamControl:
		ss.handleControl(st)
	case wire.StreamHeartbeat: // a version 2 agent's: the edge echoes its pings
		if ss.helloState() != helloAccepted {
			ss.close(0)
			return
		}
		st.SetReadDeadline(time.Time{})
		wire.Echo(st)
	case wire.StreamPing: // a version 3 agent's: heard, which is all it is for
		if ss.helloState() != helloAccepted {
			ss.close(0)
			return
		}
		wire.ReadPing(st)
	default:
		ss.log.Debug("unexpected stream type from agent", "type", t[0])
		if ss.helloState() != helloAccepted {
			ss.close(0)
		}
	}
}

// keepAlive starts pinging the agent, and closes the session when nothing
// comes from it for the heartbeat's interval and timeout: for an agent of
// wire.PingFrameVersion or later, with the Server's Watcher, which answers
// the agent's PING frames and pings it only when it is silent (no timer of
// the session's own); with ping streams and a timer for one of version 3
// (no goroutine at rest either), with a heartbeat stream and its
// goroutines for an older one.
func (ss *session) keepAlive(version int) {
	s := ss.srv
	if version < wire.PingVersion {
		s.goTracked(ss.heartbeat)
		return
	}
	var stop func()
	if version >= wire.PingFrameVersion {
		stop = s.watcher.Watch(ss.mux, func() {
			ss.log.Warn("agent missed its heartbeat; closing the session")
			ss.close(s.cfg().grace)
		})
	} else {
		p := &wire.Pinger{
			Interval: s.cfg().heartbeatInterval,
			Timeout:  s.cfg().heartbeatTimeout,
			Dead: func() {
				ss.log.Warn("agent missed its heartbeat, or its session takes no more streams; closing the session")
				ss.close(s.cfg().grace)
			},
		}
		stop = p.Start(ss.mux)
	}
	ss.mu.Lock()
	closed := ss.closed
	ss.stopPing = stop
	ss.mu.Unlock()
	if closed {
		stop()
	}
}

// stopHelloTimer stops the timer of the hello, and lets it go: it would
// stay in the session's memory for as long as the session lasts.
func (ss *session) stopHelloTimer() {
	ss.mu.Lock()
	t := ss.helloTimer
	ss.helloTimer = nil
	ss.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// heartbeat pings the agent of a version 2 session and closes the session
// when it stops answering. The heartbeat stream is the session's only
// watch on a version 2 agent: when it cannot be opened, or ends (the agent
// reset it, or the session ended), the session ends too, or a silent agent
// would hold its names for as long as its connection stays open.
func (ss *session) heartbeat() {
	defer ss.close(ss.srv.cfg().grace)
	st, err := ss.mux.OpenStream()
	if err != nil {
		ss.log.Debug("heartbeat stream not opened; closing the session", "err", err)
		return
	}
	defer st.Close()
	if _, err := st.Write([]byte{byte(wire.StreamHeartbeat)}); err != nil {
		ss.log.Debug("heartbeat stream not opened; closing the session", "err", err)
		return
	}
	hb := wire.Heartbeat{
		Interval: ss.srv.cfg().heartbeatInterval,
		Timeout:  ss.srv.cfg().heartbeatTimeout,
		Heard:    ss.mux.Heard,
		Dead: func() {
			ss.log.Warn("agent missed its heartbeat; closing the session")
			ss.close(ss.srv.cfg().grace)
		},
	}
	if err := hb.Run(st); err != nil && !ss.isClosed() {
		ss.log.Debug("heartbeat stream ended; closing the session", "err", err)
	}
}

// isClosed tells whether the session was closed.
func (ss *session) isClosed() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.closed
}

// cutUnread counts a stream cut for holding unread bytes when the session
// held Limits.SessionUnread: its client stopped reading. It is called from
// the session's reader.
func (ss *session) cutUnread(*wire.Stream) {
	ss.srv.obs().Refused(ReasonStalled)
	ss.log.Debug("stream cut: its client stopped reading and the session holds its bound of unread bytes", "max", ss.srv.cfg().sessionUnread)
}

// cutStalled counts a stream cut because its sends waited for the agent's
// window while the session held its bound of such streams: the agent (or
// its app) stopped reading an upload.
func (ss *session) cutStalled(*wire.Stream) {
	ss.srv.obs().Refused(ReasonStalled)
	ss.log.Debug("stream cut: its agent stopped reading, and the session holds its bound of stalled streams", "max", ss.srv.cfg().sessionUnread/int(ss.srv.cfg().window))
}

// goAway tells the agent that the edge is going away: it should expect the
// session to end, and reconnect then; with move, an agent that can move
// (wire.MoveVersion) is asked to, and Drain waits for it.
func (ss *session) goAway(reason string, move bool) {
	ss.mu.Lock()
	move = move && ss.hello == helloAccepted && !ss.closed && ss.version >= wire.MoveVersion
	if move && ss.routes.Len()+ss.binding > 0 {
		ss.srv.moves.Ask(ss) // under ss.mu: close's Done comes after
	}
	ss.mu.Unlock()
	st, err := ss.mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	st.SetWriteDeadline(time.Now().Add(time.Second))
	wire.WriteMessage(st, []byte{byte(wire.StreamGoAway)}, wire.GoAway{Message: reason, Move: move})
}

// farewell tells the agent why its session ends now, and waits, a second
// at most, until it has read it (it closes the stream then), so that the
// close that follows does not overtake the words.
func (ss *session) farewell(reason string) {
	st, err := ss.mux.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(time.Second))
	if wire.WriteMessage(st, []byte{byte(wire.StreamGoAway)}, wire.GoAway{Message: reason}) != nil {
		return
	}
	st.CloseWrite()
	io.Copy(io.Discard, st)
}

// LogAttrs are the attributes of each line the session logs: its ID and
// the agent's address (see slogattrs).
func (ss *session) LogAttrs() []slog.Attr {
	return []slog.Attr{slog.String("session", ss.id), slog.String("agent_addr", ss.src.String())}
}

// note tells the watchers of ev, on the session: when, which, and who
// (ev.Identity if set: a hello refused, before the session had one).
func (ss *session) note(ev view.Event) {
	if ss.srv.events.Watched() {
		ev.Time, ev.Session, ev.Remote, ev.Identity = ss.srv.now(), ss.id, ss.src.String(), cmp.Or(ev.Identity, ss.identity)
		ss.srv.events.Publish(ev)
	}
}
