package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// HTTP/2 to the app: an http or https route bound with the app protocol
// "h2c" gets its requests over HTTP/2 with prior knowledge, which gRPC
// needs (trailers, and streams both ways at once).
//
// A public connection's requests to the same route and Host share one
// HTTP/2 connection to the app, over one stream, concurrently; it is
// closed when the public connection closes or the route goes, and an idle
// one gives way when its session needs the stream for a live request. When
// the Server is mounted as a handler in another server, each request gets
// a connection of its own.

// h2Upstream is an HTTP/2 connection to an app over one stream.
type h2Upstream struct {
	cc      *http.ClientConn
	st      *clientStream // the stream it runs on
	owner   *clientConn   // the public connection whose requests share it; nil: one request
	retired atomic.Bool   // closed once its last request is done
}

// h2Transport opens HTTP/2 connections without TLS over the stream in the
// dial's context.
var h2Transport = func() *http.Transport {
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, _ := ctx.Value(h2StreamKey{}).(net.Conn)
			if c == nil {
				return nil, errors.New("edge: no stream to speak HTTP/2 on")
			}
			return c, nil
		},
	}
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	t.Protocols = p
	return t
}()

type h2StreamKey struct{}

// newH2 starts an HTTP/2 connection on a stream just dialled, with a
// request reserved on it. It is shared by the requests of its public
// connection when that has none yet.
func (s *Server) newH2(st *clientStream) (*h2Upstream, error) {
	ctx := context.WithValue(context.Background(), h2StreamKey{}, net.Conn(st.conn))
	cc, err := h2Transport.NewClientConn(ctx, "http", st.route.TunnelID+":80")
	if err == nil {
		err = cc.Reserve()
	}
	if err != nil {
		st.close()
		return nil, err
	}
	up := &h2Upstream{cc: cc, st: st}
	cc.SetStateHook(func(cc *http.ClientConn) {
		if up.retired.Load() && cc.InFlight() == 0 || cc.Err() != nil {
			up.st.close()
		}
	})
	owner := st.owner
	if owner == nil {
		return up, nil
	}
	is := &s.streams
	is.mu.Lock()
	defer is.mu.Unlock()
	if owner.closed || owner.h2 != nil {
		return up, nil // this request's own; closed after it
	}
	up.owner = owner
	owner.h2 = up
	k := st.route.Key()
	if is.h2 == nil {
		is.h2 = map[router.RouteKey]map[*h2Upstream]struct{}{}
	}
	if is.h2[k] == nil {
		is.h2[k] = map[*h2Upstream]struct{}{}
	}
	is.h2[k][up] = struct{}{}
	return up, nil
}

// sharedH2 returns the HTTP/2 connection of the public connection cc, with
// a request reserved on it, when it goes to one of routes for host and can
// take one more.
func (s *Server) sharedH2(cc *clientConn, routes []router.Route, host string) *h2Upstream {
	if cc == nil {
		return nil
	}
	is := &s.streams
	is.mu.Lock()
	up := cc.h2
	is.mu.Unlock()
	if up == nil || !up.st.serves(routes, host) {
		return nil
	}
	if err := up.cc.Reserve(); err != nil {
		if up.cc.Err() != nil {
			s.dropH2(up)
		}
		return nil
	}
	return up
}

// dropH2 forgets a shared HTTP/2 connection and closes it.
func (s *Server) dropH2(up *h2Upstream) {
	s.streams.forgetH2(up)
	up.st.close()
}

// forgetH2 removes a shared HTTP/2 connection from the registry and its
// public connection, and reports whether it was there.
func (is *idleStreams) forgetH2(up *h2Upstream) bool {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.forgetH2Locked(up)
}

func (is *idleStreams) forgetH2Locked(up *h2Upstream) bool {
	if up.owner == nil || up.owner.h2 != up {
		return false
	}
	up.owner.h2 = nil
	k := up.st.route.Key()
	delete(is.h2[k], up)
	if len(is.h2[k]) == 0 {
		delete(is.h2, k)
	}
	return true
}

// shutdown closes an HTTP/2 connection once its requests are done.
func (up *h2Upstream) shutdown() {
	up.retired.Store(true)
	if up.cc.InFlight() == 0 {
		up.st.close()
	}
}

// idle reports whether the connection carries no request.
func (up *h2Upstream) idle() bool { return up.cc.InFlight() == 0 }

// roundTripH2 sends req on the exchange's HTTP/2 connection.
func (t exchangeTransport) roundTripH2(req *http.Request, x *exchange) (*http.Response, error) {
	up := x.h2
	x.h2Reserved.Store(false) // RoundTrip takes the reservation
	// The edge forwards the body as it comes: net/http answered Expect.
	req.Header.Del("Expect")
	ctx, cancel := context.WithCancel(req.Context())
	var late atomic.Bool
	var timer *time.Timer
	if t.responseHeaderTimeout > 0 {
		timer = time.AfterFunc(t.responseHeaderTimeout, func() {
			late.Store(true)
			cancel()
		})
	}
	resp, err := up.cc.RoundTrip(req.WithContext(ctx))
	if timer != nil {
		timer.Stop()
	}
	if err != nil {
		cancel()
		if up.owner == nil {
			up.st.close()
		}
		if late.Load() {
			return nil, errResponseHeaderTimeout
		}
		return nil, err
	}
	resp.Body = &h2Body{ReadCloser: resp.Body, up: up, cancel: cancel}
	return resp, nil
}

// h2Body is a response body over HTTP/2: closing it ends the request, and
// the connection when it carried this request only.
type h2Body struct {
	io.ReadCloser
	up     *h2Upstream
	cancel context.CancelFunc
	once   sync.Once
}

func (b *h2Body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		b.cancel()
		if b.up.owner == nil {
			b.up.st.close()
		}
	})
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
