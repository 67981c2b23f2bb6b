package edge

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// The streams of public HTTP connections.
//
// A request travels to its agent on a stream whose header names the
// request's client, so a stream never carries two clients' requests: it
// belongs to one public connection. When the edge serves the connection
// itself (ServeHTTPListener), the connection's next request reuses the
// stream if it goes to the same route and Host; any other request closes it
// and opens a new one, to the route looked up for that request. An idle
// stream is closed when its connection closes, when its route is unbound,
// when its agent closes it, and when its session needs the stream for a
// live request. When the Server is mounted as a handler in another server,
// each request gets a stream of its own.

// clientConn is a public HTTP connection the edge serves.
type clientConn struct {
	idle   []*clientStream // its streams between requests, the latest last; guarded by streams.mu
	h2     *h2Upstream     // its HTTP/2 connection to an h2c app; likewise
	closed bool            // likewise
}

type clientConnKey struct{}

// clientStream is a stream to an agent that carries the requests of one
// public connection, one after another.
type clientStream struct {
	conn  *exchangeConn
	br    *bufio.Reader
	route router.Route
	host  string      // the Host of its requests, named in its header
	owner *clientConn // nil: one request only
	dead  atomic.Bool

	watched chan struct{} // closed when the idle watcher has stopped
	seen    error         // what the watcher's read returned
}

// close ends the stream.
func (st *clientStream) close() {
	st.dead.Store(true)
	st.conn.Close()
}

// serves reports whether st may carry a request to one of routes for host.
func (st *clientStream) serves(routes []router.Route, host string) bool {
	if st.dead.Load() || st.host != host {
		return false
	}
	for _, r := range routes {
		if r.Key() == st.route.Key() {
			return true
		}
	}
	return false
}

// watch reads while the stream is idle: the agent closing it (or sending
// what nobody asked for) makes it useless, and it goes at once. Taking the
// stream for a request interrupts the read with a deadline. done is the
// stream's watched channel of this idle period.
func (s *Server) watch(st *clientStream, done chan struct{}) {
	_, err := st.br.Peek(1)
	st.seen = err
	close(done) // from here on, st belongs to whoever took it
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		if s.streams.remove(st) {
			st.close()
		}
	}
}

// wake stops the watcher of a stream taken from the idle ones and reports
// whether the stream is still good.
func (st *clientStream) wake() bool {
	st.conn.SetReadDeadline(time.Now())
	<-st.watched
	st.conn.SetReadDeadline(time.Time{})
	return errors.Is(st.seen, os.ErrDeadlineExceeded) && !st.dead.Load()
}

// idleStreams indexes the idle streams of public connections by route.
type idleStreams struct {
	mu      sync.Mutex
	byRoute map[router.RouteKey]map[*clientStream]struct{}
	h2      map[router.RouteKey]map[*h2Upstream]struct{} // shared HTTP/2 connections, idle or not
}

// maxIdlePerConn bounds the idle streams of one public connection: one for
// HTTP/1.1, which sends a request at a time; for HTTP/2, as many as its
// requests ran at once, up to this.
const maxIdlePerConn = 64

// putIdle makes st one of its connection's idle streams, or closes it when
// the connection is gone or has as many as it may keep.
func (s *Server) putIdle(st *clientStream) {
	is := &s.streams
	is.mu.Lock()
	cc := st.owner
	if cc.closed || len(cc.idle) >= maxIdlePerConn || st.dead.Load() {
		is.mu.Unlock()
		st.close()
		return
	}
	cc.idle = append(cc.idle, st)
	k := st.route.Key()
	if is.byRoute == nil {
		is.byRoute = map[router.RouteKey]map[*clientStream]struct{}{}
	}
	if is.byRoute[k] == nil {
		is.byRoute[k] = map[*clientStream]struct{}{}
	}
	is.byRoute[k][st] = struct{}{}
	done := make(chan struct{})
	st.watched = done
	is.mu.Unlock()
	go s.watch(st, done)
}

// clientOf returns the public connection of a request the edge serves
// itself; nil for one it got as a mounted handler.
func clientOf(r *http.Request) *clientConn {
	cc, _ := r.Context().Value(clientConnKey{}).(*clientConn)
	return cc
}

// takeIdle returns the latest idle stream of cc, if any, no longer idle.
func (s *Server) takeIdle(cc *clientConn) *clientStream {
	is := &s.streams
	is.mu.Lock()
	defer is.mu.Unlock()
	if len(cc.idle) == 0 {
		return nil
	}
	st := cc.idle[len(cc.idle)-1]
	is.removeLocked(st)
	return st
}

// remove makes st no longer idle, and reports whether it was.
func (is *idleStreams) remove(st *clientStream) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	if !slices.Contains(st.owner.idle, st) {
		return false
	}
	is.removeLocked(st)
	return true
}

func (is *idleStreams) removeLocked(st *clientStream) {
	cc := st.owner
	if i := slices.Index(cc.idle, st); i >= 0 {
		cc.idle = slices.Delete(cc.idle, i, i+1)
	}
	k := st.route.Key()
	delete(is.byRoute[k], st)
	if len(is.byRoute[k]) == 0 {
		delete(is.byRoute, k)
	}
}

// dropClient forgets a public connection that closed, and its stream.
func (s *Server) dropClient(cc *clientConn) {
	is := &s.streams
	is.mu.Lock()
	cc.closed = true
	idle := slices.Clone(cc.idle)
	for _, st := range idle {
		is.removeLocked(st)
	}
	up := cc.h2
	if up != nil {
		is.forgetH2Locked(up)
	}
	is.mu.Unlock()
	for _, st := range idle {
		st.close()
	}
	if up != nil {
		up.st.close()
	}
}

// closeIdle closes the idle streams to r: its endpoint is gone.
func (s *Server) closeIdle(r router.Route) {
	is := &s.streams
	is.mu.Lock()
	var gone []*clientStream
	for st := range is.byRoute[r.Key()] {
		gone = append(gone, st)
	}
	for _, st := range gone {
		is.removeLocked(st)
	}
	var ups []*h2Upstream
	for up := range is.h2[r.Key()] {
		ups = append(ups, up)
	}
	for _, up := range ups {
		is.forgetH2Locked(up)
	}
	is.mu.Unlock()
	for _, st := range gone {
		st.close()
	}
	for _, up := range ups {
		up.shutdown() // its requests in flight finish
	}
}

// evictIdle closes one idle stream of the session sessionID, so that a live
// request can have its place, and reports whether there was one.
func (s *Server) evictIdle(sessionID string) bool {
	is := &s.streams
	is.mu.Lock()
	var victim *clientStream
	for k, sts := range is.byRoute {
		if k.Edge != s.ID || k.Session != sessionID {
			continue
		}
		for st := range sts {
			victim = st
			break
		}
		break
	}
	if victim != nil {
		is.removeLocked(victim)
		is.mu.Unlock()
		victim.close()
		return true
	}
	var idleH2 *h2Upstream
	for k, ups := range is.h2 {
		if k.Edge != s.ID || k.Session != sessionID {
			continue
		}
		for up := range ups {
			if up.idle() {
				idleH2 = up
				break
			}
		}
		if idleH2 != nil {
			break
		}
	}
	if idleH2 != nil {
		is.forgetH2Locked(idleH2)
	}
	is.mu.Unlock()
	if idleH2 == nil {
		return false
	}
	idleH2.st.close()
	return true
}

// trackClients makes hs tell the Server about its connections, so that
// their requests can reuse their streams.
func (s *Server) trackClients(hs *http.Server, proto string) {
	var clients sync.Map // net.Conn to *clientConn
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		s.obs().Conn(proto)
		cc := &clientConn{}
		clients.Store(c, cc)
		return context.WithValue(ctx, clientConnKey{}, cc)
	}
	hs.ConnState = func(c net.Conn, state http.ConnState) {
		if state == http.StateClosed || state == http.StateHijacked {
			if cc, ok := clients.LoadAndDelete(c); ok {
				s.dropClient(cc.(*clientConn))
			}
		}
	}
}

// streamFor returns the stream for a request to one of routes: its
// connection's idle stream when that goes to the same route and host, or a
// new one to the first of routes that can be reached.
func (s *Server) streamFor(ctx context.Context, r *http.Request, routes []router.Route, client ConnInfo) (st *clientStream, reused bool, err error) {
	cc := clientOf(r)
	if cc != nil {
		if st := s.takeIdle(cc); st != nil {
			if st.wake() && st.serves(routes, r.Host) {
				return st, true, nil
			}
			st.close()
		}
	}
	conn, route, err := s.dialRoutes(ctx, routes, client)
	if err != nil {
		return nil, false, err
	}
	return newClientStream(conn, route, r.Host, cc), false, nil
}

// newClientStream wraps a stream just dialled to route for requests to
// host of the connection owner (nil: one request only).
func newClientStream(conn net.Conn, route router.Route, host string, owner *clientConn) *clientStream {
	c := &exchangeConn{Conn: conn}
	c.touch()
	return &clientStream{conn: c, br: bufio.NewReaderSize(c, 4<<10), route: route, host: host, owner: owner}
}
