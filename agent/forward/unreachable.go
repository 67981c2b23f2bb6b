package forward

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tunnelkit/tunnelkit/internal/h1"
	"github.com/tunnelkit/tunnelkit/internal/h2"
)

// Answering for an app that cannot be reached. A conn whose connection to
// the app could not be made has each of its requests answered with the
// 502 app_unreachable that the edge answers when an agent says so, and
// then ends: the edge's next request comes on a new conn, which tries the
// app again. The answers pass the conn's watcher as an app's would: the
// request's log line and its recording come from the same code as for an
// answer of the app.

// lingerTime is how long an answered conn is read, at most, after its
// answer, before it is closed: a close with unread bytes (a request body
// the client still sends) would reset the connection, the answer with it,
// before the client reads it. The client, told that the connection
// closes, closes its side once it has read the answer; net/http's server
// waits so too (half a second, reading nothing) after an answer that
// leaves a body unread.
const lingerTime = 5 * time.Second

// lingerClose half-closes c, reads and discards what its client still
// sends until its end or for lingerTime, and closes it.
func lingerClose(c net.Conn) {
	defer c.Close()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	c.SetReadDeadline(time.Now().Add(lingerTime))
	io.Copy(io.Discard, c)
}

// unreachableH1 answers the first request of HTTP/1.1 conn c, whose app
// cannot be reached (err says why), with 502 app_unreachable, and closes
// c. Bytes that are not a request get what net/http's server answers
// them, as from a ReverseProxy hop: 400, or 431 for a head too large.
func (p *httpProxy) unreachableH1(c net.Conn, o origin, err error) {
	var obs h1.Conn
	var recs *h1Recordings
	if p.rec != nil {
		recs = &h1Recordings{p: p, o: o}
		recs.watch(&obs)
		defer recs.close()
	}
	obs.Done = func(x h1.Exchange) {
		if recs != nil {
			recs.done(x)
		}
		p.logTarget(x.Method, x.Target, x.Status, x.Bytes, x.Start, o.client)
	}
	buf := make([]byte, 4<<10)
	for {
		n, rerr := c.Read(buf)
		obs.Request(buf[:n])
		x, waiting := obs.Awaited()
		if merr := obs.Err(); merr != nil && !waiting {
			p.logger.Debug("http: a malformed request, for an app that cannot be reached", "client", o.client, "to", p.to, "err", merr)
			status := "400 Bad Request"
			if errors.Is(merr, h1.ErrTooLarge) {
				status = "431 Request Header Fields Too Large"
			}
			io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"+status)
			lingerClose(c)
			return
		}
		if waiting {
			e := p.newAppError(codeAppUnreachable, msgAppUnreachable, err)
			p.logAppError(e, x.Method, requestPath(x.Target), o.client)
			head, body := errorResponse(e, x.Method, true)
			if recs != nil {
				recs.failed(e)
			}
			obs.Response(head)
			obs.Response(body)
			c.Write(append(head, body...))
			lingerClose(c)
			return
		}
		if rerr != nil {
			c.Close()
			return
		}
	}
}

// unreachableH2C answers each stream of the HTTP/2 connection (prior
// knowledge) that conn c carries, whose app cannot be reached (err says
// why), with 502 app_unreachable, and ends the connection as RFC 9113
// (section 6.8) has a server end one gracefully: once the first stream is
// answered, a GOAWAY that lets the client's streams in flight come, and a
// PING; once the PING comes back, the client has seen the GOAWAY and opens
// no more streams here, and a last GOAWAY names the last stream answered.
// The first stream gets the answer; those that the client sent before it
// saw the GOAWAY are refused, not processed, and the client (the edge's
// Transport) sends them again on a new connection, which tries the app
// again, as a ReverseProxy hop dials the app for each request.
func (p *httpProxy) unreachableH2C(c net.Conn, o origin, err error) {
	defer lingerClose(c)
	var obs h2.Conn
	var recs *h2Recordings
	if p.rec != nil {
		recs = &h2Recordings{p: p, o: o}
		recs.watch(&obs)
		defer recs.close()
	}
	obs.Done = p.h2Done(recs, o.client)
	// The frames go out from a goroutine of their own, in order, so that
	// reading never waits for the client to read: a client may write its
	// preface and SETTINGS in one write before it reads (Go's, over a
	// net.Pipe, a replay's conn), and a peer that reads nothing stalls
	// the queue, and then the reading, not more.
	out := newFrameQueue(c, obs.Response)
	defer out.close()
	in := io.TeeReader(c, seeWriter(obs.Request))
	fr := http2.NewFramer(out, in)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(in, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.SetMaxDynamicTableSizeLimit(0) // no table: whatever the client's SETTINGS allow
	if fr.WriteSettings() != nil {
		return
	}
	var (
		last      uint32         // the newest stream answered
		draining  bool           // the first GOAWAY went out, and the PING
		window    int64  = 65535 // the connection's send window (RFC 9113, section 6.9.2)
		initial   int64  = 65535 // a new stream's send window: SETTINGS_INITIAL_WINDOW_SIZE
		drainPing        = [8]byte{'t', 'u', 'n', 'n', 'e', 'l', 'k', 't'}
	)
	for {
		f, rerr := fr.ReadFrame()
		if rerr != nil {
			var se http2.StreamError
			if errors.As(rerr, &se) && fr.WriteRSTStream(se.StreamID, se.Code) == nil {
				continue
			}
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				initial = int64(v)
			}
			fr.WriteSettingsAck()
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				window += int64(f.Increment)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				fr.WritePing(true, f.Data)
			} else if draining && f.Data == drainPing {
				fr.WriteGoAway(last, http2.ErrCodeNo, nil)
				return
			}
		case *http2.GoAwayFrame:
			return
		case *http2.MetaHeadersFrame:
			id := f.StreamID
			if id <= last || id%2 == 0 {
				continue // a request's trailers
			}
			if draining {
				// A request sent before the client saw the GOAWAY: refused
				// as not processed, so that the client sends it again on a
				// new conn, which tries the app again (it may be up by
				// now), rather than answered with this conn's old error.
				fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
				continue
			}
			last = id
			method := f.PseudoValue("method")
			e := p.newAppError(codeAppUnreachable, msgAppUnreachable, err)
			p.logAppError(e, method, requestPath(f.PseudoValue("path")), o.client)
			if recs != nil {
				recs.failed(id, e)
			}
			body := []byte(e.text())
			n := len(body)
			if method == "HEAD" {
				body = nil
			} else if int64(n) > min(window, initial) {
				body, n = nil, 0 // no room for it yet: the header says why
			}
			hb.Reset()
			enc.WriteField(hpack.HeaderField{Name: ":status", Value: "502"})
			for _, h := range e.header(n) {
				enc.WriteField(hpack.HeaderField{Name: strings.ToLower(h[0]), Value: h[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: len(body) == 0, EndHeaders: true})
			if len(body) > 0 {
				fr.WriteData(id, true, body)
				window -= int64(len(body))
			}
			if !f.StreamEnded() {
				// The request's body is not wanted (RFC 9113, section 8.1).
				fr.WriteRSTStream(id, http2.ErrCodeNo)
			}
			if !draining {
				draining = true
				fr.WriteGoAway(1<<31-1, http2.ErrCodeNo, nil)
				fr.WritePing(false, drainPing)
			}
		}
	}
}

// frameQueue is the writer of unreachableH2C's frames: each write is
// queued, and a goroutine of its own passes the writes, in order, to see
// and then to the conn.
type frameQueue struct {
	ch   chan []byte
	done chan struct{}
}

func newFrameQueue(c net.Conn, see func([]byte)) *frameQueue {
	q := &frameQueue{ch: make(chan []byte, 64), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		var err error
		for b := range q.ch {
			if err == nil {
				see(b)
				_, err = c.Write(b)
			}
		}
	}()
	return q
}

// Write queues a copy of b: the framer reuses its buffer.
func (q *frameQueue) Write(b []byte) (int, error) {
	q.ch <- bytes.Clone(b)
	return len(b), nil
}

// close waits for the queued frames to go out (or fail).
func (q *frameQueue) close() {
	close(q.ch)
	<-q.done
}

// seeWriter is an io.Writer that only sees what is written to it.
type seeWriter func([]byte)

func (see seeWriter) Write(p []byte) (int, error) {
	see(p)
	return len(p), nil
}
