package forward

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
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
// messages pass for each request's log line: no second parse into
// requests, no ReverseProxy, no pooled transport and its goroutines. The
// connection to the app lives as long as the conn: the edge's pool of
// conns is the pool of connections to the app.
//
// What net/http would do for an HTTP/1.1 request the app did not answer,
// this does from what the watcher saw: an app that closes a connection
// before answering its first request gets the client a 502 app_error, as
// the ReverseProxy path answers. An app that closes a connection that
// carried requests before (its keep-alive timeout) as the next request
// goes out gets the conn closed with no answer, as a server's close of an
// idle connection looks: the edge sends an idempotent request again on a
// new conn, as a Transport would, and answers 502 for any other. An app
// that cannot be reached gets its conn served by the ReverseProxy path,
// which answers 502 app_unreachable and tries the app again for each
// request.

// serveConns serves l's conns as described above, handing a conn whose
// app cannot be reached to srv (which answers each of its requests with a
// 502, trying the app again for each). It returns when l's Accept fails,
// with its error, once it has closed the conns it still serves and they
// ended.
func (p *httpProxy) serveConns(l net.Listener, srv interface{ Serve(net.Listener) error }, h2c bool) error {
	q := pipe.NewQueue(l.Addr())
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(q)
	}()
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	for {
		c, err := l.Accept()
		if err != nil {
			q.Close()
			<-served
			mu.Lock()
			for c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
			return err
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
			p.forwardConn(c, q, h2c)
		})
	}
}

// forwardConn forwards the requests of one conn over a connection of its
// own to the app (see serveConns).
func (p *httpProxy) forwardConn(c net.Conn, q *pipe.Queue, h2c bool) {
	up, err := p.transport.DialContext(p.ctx, "", "")
	if err != nil {
		if !q.Push(c) {
			c.Close()
		}
		return
	}
	if h2c {
		p.forwardH2C(c, up)
		return
	}
	client := c.RemoteAddr().String()
	var (
		obs       h1.Conn
		exchanges int       // ended on this connection; owned by the response direction
		upgrade   *upgraded // the exchange that upgraded the connection, if one did
		sent      int64     // bytes the app sent; owned by the response direction
	)
	obs.Done = func(x h1.Exchange) {
		exchanges++
		if x.Upgraded {
			// Its line comes when the connection ends, with the bytes
			// the app sent after its 101: those that came with it, and
			// those after.
			upgrade = &upgraded{x: x, from: sent - x.Bytes}
			return
		}
		p.logTarget(x.Method, x.Target, x.Status, x.Bytes, x.Start, client)
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
			p.logger.Debug("http: the app closed a kept-alive connection as a request went out", "method", printable(x.Method, 32), "path", printable(requestPath(x.Target), 256), "client", client, "to", p.to)
			return nil
		}
		p.logger.Warn("http error", "code", "app_error", "method", printable(x.Method, 32), "path", printable(requestPath(x.Target), 256), "client", client, "to", p.to, "err", io.EOF)
		resp, body := appError(x.Method, io.EOF)
		p.logTarget(x.Method, x.Target, http.StatusBadGateway, int64(body), x.Start, client)
		return resp
	})
	pipe.JoinStreams(in, out, 0)
	if err := obs.Err(); err != nil {
		p.logger.Debug("http: the requests of a connection are not logged", "client", client, "err", err)
	}
	if upgrade != nil {
		x := upgrade.x
		p.logTarget(x.Method, x.Target, x.Status, sent-upgrade.from, x.Start, client)
	}
}

// forwardH2C forwards the HTTP/2 connection (prior knowledge) that conn c
// carries over up, a connection of its own to the app, watched by an
// h2.Conn for each request's line. The edge sends one such connection per
// public connection, and its requests as streams of it. An app that
// closes the connection, or resets a stream, is seen by the edge as it
// did it: the edge answers as it answers for any upstream.
func (p *httpProxy) forwardH2C(c, up net.Conn) {
	client := c.RemoteAddr().String()
	var obs h2.Conn
	obs.Done = func(x h2.Exchange) {
		var attrs []slog.Attr
		if x.Reset {
			attrs = append(attrs, slog.Bool("reset", true))
		}
		p.logTarget(x.Method, x.Target, x.Status, x.Bytes, x.Start, client, attrs...)
	}
	in := pipe.Observe(c, obs.Request, nil)
	out := pipe.Observe(up, obs.Response, func() []byte { obs.ResponseEOF(); return nil })
	pipe.JoinStreams(in, out, 0)
	if err := obs.Err(); err != nil {
		p.logger.Debug("http: the requests of a connection are not logged", "client", client, "err", err)
	}
}

// upgraded is an exchange that upgraded its connection.
type upgraded struct {
	x    h1.Exchange
	from int64 // the bytes the app had sent when its head passed
}

// appError returns the 502 that answers a request of method the app did
// not answer, as proxyError writes it, and the length of its body.
func appError(method string, err error) (resp []byte, body int) {
	text := errorText("app_error", msgAppError, err)
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 502 Bad Gateway\r\n"+
		"Content-Type: text/plain; charset=utf-8\r\n"+
		"X-Content-Type-Options: nosniff\r\n"+
		"Tunnelkit-Error: app_error\r\n"+
		"Content-Length: %d\r\n"+
		"Connection: close\r\n\r\n", len(text))
	if method == "HEAD" {
		return []byte(b.String()), 0
	}
	b.WriteString(text)
	return []byte(b.String()), len(text)
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
