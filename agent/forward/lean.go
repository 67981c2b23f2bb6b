package forward

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/h1"
	"github.com/tunnelkit/tunnelkit/internal/h2"
	"github.com/tunnelkit/tunnelkit/internal/pipe"
)

// Forwarding HTTP without parsing it twice. The edge has read each
// client's request already, and sends the app's response on as it reads
// it; a conn from the edge carries requests one after another (HTTP/1.1),
// or as streams of one HTTP/2 connection (h2c), each sent whole and clean
// (the client's hop-by-hop headers gone). So a conn gets a connection of
// its own to the app, and their bytes are copied both ways as they come,
// as Bytes copies them, while a watcher (h1.Conn, h2.Conn) sees the
// messages pass, for each request's log line and, with a Recorder, its
// recording: no second parse into requests, no ReverseProxy, no pooled
// transport and its goroutines. The connection to the app lives as long
// as the conn: the edge's pool of conns is the pool of connections to the
// app.
//
// What net/http would do for an HTTP/1.1 request the app did not answer,
// this does from what the watcher saw: an app that closes a connection
// before answering its first request gets the client a 502 app_error, as
// a ReverseProxy answers. An app that closes a connection that carried
// requests before (its keep-alive timeout) as the next request goes out
// gets the conn closed with no answer, as a server's close of an idle
// connection looks: the edge sends an idempotent request again on a new
// conn, as a Transport would, and answers 502 for any other. A conn whose
// app cannot be reached gets its requests answered 502 app_unreachable
// from the same watchers (see unreachable.go), and ends: the edge's next
// conn tries the app again.

// pooled is a conn of a pool's member (an *agent.Conn of an endpoint that
// asked for a pool): one whose app cannot be reached is rejected before
// it is read, and its edge sends it to another member.
type pooled interface {
	Pooled() bool
	Reject(error) error
}

// errAppClosed is the detail of an app_error: the app closed a new
// connection without answering its first request.
var errAppClosed = errors.New("forward: the app closed the connection before it answered")

// origin is where a conn's requests come from: the edge, or a replay.
type origin struct {
	client string          // the public client's address, for log lines and recordings
	ctx    context.Context // the recorded requests' context
	replay bool            // a replay's conn: the exchange is over once the client's side ends
}

// forwardConn forwards the requests of one conn over a connection of its
// own to the app (see above), and closes both.
func (p *httpProxy) forwardConn(c net.Conn, o origin) {
	up, err := p.dial()
	if err != nil {
		if r, ok := c.(pooled); ok && r.Pooled() {
			// A pool's member: the edge sends the request to another
			// member, rather than this one answering for its app.
			p.logger.Warn("http: the app cannot be reached; the edge tries the pool's other members", "client", o.client, "to", p.to, "err", err)
			r.Reject(err)
			return
		}
		if p.h2c {
			p.unreachableH2C(c, o, err)
		} else {
			p.unreachableH1(c, o, err)
		}
		return
	}
	defer p.untrack(up)
	if o.replay {
		// Once the replay's client has read its response and left, the
		// connection to the app has nothing more to carry: close it
		// rather than half-close it and wait for the app's close.
		up = closeOnly{up}
	}
	if p.h2c {
		p.forwardH2C(c, up, o)
		return
	}
	var (
		obs       h1.Conn
		recs      *h1Recordings // nil: no Recorder
		exchanges int           // ended on this connection; owned by the response direction
		upgrade   *upgraded     // the exchange that upgraded the connection, if one did
		sent      int64         // bytes the app sent; owned by the response direction
	)
	if p.rec != nil {
		recs = &h1Recordings{p: p, o: o}
		recs.watch(&obs)
		defer recs.close()
	}
	obs.Done = func(x h1.Exchange) {
		exchanges++
		if recs != nil {
			recs.done(x)
		}
		if x.Upgraded {
			// Its line comes when the connection ends, with the bytes
			// the app sent after its 101: those that came with it, and
			// those after.
			upgrade = &upgraded{x: x, from: sent - x.Bytes}
			return
		}
		p.logTarget(x.Method, x.Target, x.Status, x.Bytes, x.Start, o.client)
	}
	in := pipe.Observe(c, obs.Request, nil)
	out := pipe.Observe(up, func(b []byte) {
		sent += int64(len(b))
		obs.Response(b)
	}, func() []byte {
		obs.ResponseEOF()
		x, waiting := obs.Awaited()
		if !waiting {
			return nil
		}
		if exchanges > 0 {
			p.logger.Debug("http: the app closed a kept-alive connection as a request went out", "method", printable(x.Method, 32), "path", printable(requestPath(x.Target), 256), "client", o.client, "to", p.to)
			return nil
		}
		e := p.newAppError(codeAppError, msgAppError, errAppClosed)
		p.logAppError(e, x.Method, requestPath(x.Target), o.client)
		head, body := errorResponse(e, x.Method, true)
		if recs != nil {
			// The watcher has seen the app's end: the answer passes to
			// the recording as it would have.
			recs.failed(e)
			recs.head(true, head)
			recs.body(true, body)
			recs.done(h1.Exchange{})
		}
		p.logTarget(x.Method, x.Target, http.StatusBadGateway, int64(len(body)), x.Start, o.client)
		return append(head, body...)
	})
	pipe.JoinStreams(in, out, 0)
	if err := obs.Err(); err != nil {
		p.logger.Debug("http: the requests of a connection are not logged", "client", o.client, "err", err)
	}
	if upgrade != nil {
		x := upgrade.x
		p.logTarget(x.Method, x.Target, x.Status, sent-upgrade.from, x.Start, o.client)
	}
}

// forwardH2C forwards the HTTP/2 connection (prior knowledge) that conn c
// carries over up, a connection of its own to the app, watched by an
// h2.Conn for each request's line and recording. The edge sends one such
// connection per public connection, and its requests as streams of it.
// An app that closes the connection, or resets a stream, is seen by the
// edge as it did it: the edge answers as it answers for any upstream.
func (p *httpProxy) forwardH2C(c, up net.Conn, o origin) {
	var obs h2.Conn
	var recs *h2Recordings
	if p.rec != nil {
		recs = &h2Recordings{p: p, o: o}
		recs.watch(&obs)
		defer recs.close()
	}
	obs.Done = p.h2Done(recs, o.client)
	in := pipe.Observe(c, obs.Request, nil)
	out := pipe.Observe(up, obs.Response, func() []byte { obs.ResponseEOF(); return nil })
	pipe.JoinStreams(in, out, 0)
	if err := obs.Err(); err != nil {
		p.logger.Debug("http: the requests of a connection are not logged", "client", o.client, "err", err)
	}
}

// h2Done returns the Done of an h2.Conn: it ends the stream's recording,
// if recs is not nil, and logs its line.
func (p *httpProxy) h2Done(recs *h2Recordings, client string) func(h2.Exchange) {
	return func(x h2.Exchange) {
		if recs != nil {
			recs.done(x)
		}
		var attrs []slog.Attr
		if x.Reset {
			attrs = append(attrs, slog.Bool("reset", true))
		}
		p.logTarget(x.Method, x.Target, x.Status, x.Bytes, x.Start, client, attrs...)
	}
}

// closeOnly is a connection that cannot be half-closed: pipe.JoinStreams
// closes it when its other side ends.
type closeOnly struct{ net.Conn }

// upgraded is an exchange that upgraded its connection.
type upgraded struct {
	x    h1.Exchange
	from int64 // the bytes the app had sent when its head passed
}

// errorResponse returns the HTTP/1.1 502 that answers a request of method
// for the app, as the edge answers (see appError), in two parts: its
// head, and its body (none for HEAD). With close, the head says that the
// connection closes after it.
func errorResponse(e appError, method string, close bool) (head, body []byte) {
	text := e.text()
	head = append(head, "HTTP/1.1 502 Bad Gateway\r\n"...)
	for _, f := range e.header(len(text)) {
		head = append(append(append(append(head, f[0]...), ": "...), f[1]...), "\r\n"...)
	}
	if close {
		head = append(head, "Connection: close\r\n"...)
	}
	head = append(head, "\r\n"...)
	if method == "HEAD" {
		return head, nil
	}
	return head, []byte(text)
}

// logTarget writes a request's line as logLine does, from its
// request-target: the path is parsed out of it only when the line is
// written.
func (p *httpProxy) logTarget(method, target string, status int, bytes int64, start time.Time, client string, attrs ...slog.Attr) {
	if p.logger.Enabled(context.Background(), slog.LevelInfo) {
		p.logLine(context.Background(), method, requestPath(target), status, bytes, start, client, attrs...)
	}
}

// requestPath returns the path of a request-target, unescaped, as
// net/http's URL.Path has it.
func requestPath(target string) string {
	if u, err := url.ParseRequestURI(target); err == nil {
		return u.Path
	}
	path, _, _ := strings.Cut(target, "?")
	return path
}

// roundDuration rounds a request's duration for its line: to the
// microsecond below 10 ms, to the millisecond above.
func roundDuration(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
