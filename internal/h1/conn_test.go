package h1

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// step is one thing the copier does: hand request or response bytes to
// the observer, or report the server's EOF. After it, Waiting must be
// waiting.
type step struct {
	req, resp string
	eof       bool
	waiting   bool
}

// got is an Exchange without its time, for comparison.
type got struct {
	Method, Target string
	Status         int
	Bytes          int64
	Upgraded       bool
}

// splitter cuts bytes into the pieces a copier hands over.
type splitter struct {
	name string
	cut  func(r *rand.Rand, p []byte) [][]byte
}

var splitters = []splitter{
	{"whole", func(_ *rand.Rand, p []byte) [][]byte { return [][]byte{p} }},
	{"bytewise", func(_ *rand.Rand, p []byte) [][]byte {
		var out [][]byte
		for i := range p {
			out = append(out, p[i:i+1])
		}
		return out
	}},
	{"random", randomSplit},
}

func randomSplit(r *rand.Rand, p []byte) [][]byte {
	var out [][]byte
	for len(p) > 0 {
		n := 1 + r.IntN(min(len(p), 17))
		out = append(out, p[:n])
		p = p[n:]
	}
	return out
}

// observe feeds p to f in the pieces s cuts it into, each in a copy so that
// nothing can keep the caller's bytes.
func observe(r *rand.Rand, s splitter, p string, f func([]byte)) {
	for _, piece := range s.cut(r, []byte(p)) {
		f(append([]byte(nil), piece...))
	}
}

func (s step) String() string {
	switch {
	case s.eof:
		return "EOF"
	case s.req != "":
		return fmt.Sprintf("request %q", s.req)
	}
	return fmt.Sprintf("response %q", s.resp)
}

func TestConn(t *testing.T) {
	const (
		get     = "GET /a?b=c HTTP/1.1\r\nHost: x\r\n\r\n"
		ok5     = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
		chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
			"5;name=value\r\nhello\r\n6 ; x\r\n world\r\n0\r\nTrailer-A: 1\r\nTrailer-B: 2\r\n\r\n"
	)
	tests := []struct {
		name  string
		steps []step
		want  []got
		err   error
	}{
		{"GET without body", []step{
			{req: get, waiting: true},
			{resp: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		}, []got{{"GET", "/a?b=c", 200, 0, false}}, nil},
		{"POST with Content-Length", []step{
			{req: "POST /p HTTP/1.1\r\nContent-Length: 11\r\n\r\nhello world", waiting: true},
			{resp: ok5},
		}, []got{{"POST", "/p", 200, 5, false}}, nil},
		{"chunked request with trailers", []step{
			{req: "PUT /c HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", waiting: true},
			{resp: "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", waiting: false},
			{req: get, waiting: true},
			{resp: ok5},
		}, []got{{"PUT", "/c", 201, 2, false}, {"GET", "/a?b=c", 200, 5, false}}, nil},
		{"bare LF heads", []step{
			{req: "GET / HTTP/1.1\nHost: x\n\n", waiting: true},
			{resp: "HTTP/1.1 200 OK\nContent-Length: 3\n\nabc"},
		}, []got{{"GET", "/", 200, 3, false}}, nil},
		{"blank lines before a request", []step{
			{req: "\r\n\r\n" + get, waiting: true},
			{resp: ok5},
		}, []got{{"GET", "/a?b=c", 200, 5, false}}, nil},
		{"pipelined", []step{
			{req: get + "HEAD /h HTTP/1.1\r\n\r\n" + "DELETE /d HTTP/1.1\r\nContent-Length: 2\r\n\r\nxy", waiting: true},
			{resp: ok5, waiting: true},
			{resp: "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", waiting: true},
			{resp: "HTTP/1.1 204 No Content\r\n", waiting: false},
			{resp: "\r\n", waiting: false},
		}, []got{{"GET", "/a?b=c", 200, 5, false}, {"HEAD", "/h", 200, 0, false}, {"DELETE", "/d", 204, 0, false}}, nil},
		{"HEAD with chunked", []step{
			{req: "HEAD / HTTP/1.1\r\n\r\n", waiting: true},
			{resp: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
			{req: get, waiting: true},
			{resp: ok5},
		}, []got{{"HEAD", "/", 200, 0, false}, {"GET", "/a?b=c", 200, 5, false}}, nil},
		{"204 and 304", []step{
			{req: get + get, waiting: true},
			{resp: "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n", waiting: true},
			{resp: "HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n"},
		}, []got{{"GET", "/a?b=c", 204, 0, false}, {"GET", "/a?b=c", 304, 0, false}}, nil},
		{"100-continue then 200", []step{
			{req: "POST /u HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", waiting: true},
			{resp: "H", waiting: false},
			{resp: "TTP/1.1 100 Continue\r\n\r\n", waiting: false},
			{req: "abc"},
			{resp: ok5},
		}, []got{{"POST", "/u", 200, 5, false}}, nil},
		{"103 then 200", []step{
			{req: get, waiting: true},
			{resp: "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n", waiting: false},
			{resp: "HTTP/1.1 103 Early Hints\r\nLink: </t.css>; rel=preload\r\n\r\n" + ok5},
		}, []got{{"GET", "/a?b=c", 200, 5, false}}, nil},
		{"101 upgrade", []step{
			{req: "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x05hello", waiting: true},
			{resp: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x82\x03abc"},
			{req: "not HTTP at all\r\n\r\n"},
			{resp: "HTTP/1.1 200 OK\r\n\r\n"},
		}, []got{{"GET", "/ws", 101, 0, true}}, nil},
		{"upgrade refused", []step{
			{req: "GET / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n" + get, waiting: true},
			{resp: ok5, waiting: true},
			{resp: ok5},
		}, []got{{"GET", "/", 200, 5, false}, {"GET", "/a?b=c", 200, 5, false}}, nil},
		{"CONNECT", []step{
			{req: "CONNECT example.com:443 HTTP/1.1\r\n\r\n\x16\x03\x01", waiting: true},
			{resp: "HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x03"},
		}, []got{{"CONNECT", "example.com:443", 200, 0, true}}, nil},
		{"CONNECT refused", []step{
			{req: "CONNECT example.com:443 HTTP/1.1\r\n\r\n" + get, waiting: true},
			{resp: "HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno", waiting: true},
			{resp: ok5},
		}, []got{{"CONNECT", "example.com:443", 403, 2, false}, {"GET", "/a?b=c", 200, 5, false}}, nil},
		{"response until EOF", []step{
			{req: get, waiting: true},
			{resp: "HTTP/1.0 200 OK\r\n\r\nsome bytes", waiting: false},
			{resp: " and more"},
			{eof: true},
		}, []got{{"GET", "/a?b=c", 200, 19, false}}, nil},
		{"chunked response with extensions and trailers", []step{
			{req: get, waiting: true},
			{resp: chunked},
		}, []got{{"GET", "/a?b=c", 200, 11, false}}, nil},
		{"keep-alive", func() []step {
			var s []step
			for range 20 {
				s = append(s, step{req: get, waiting: true}, step{resp: ok5}, step{req: get, waiting: true}, step{resp: chunked})
			}
			return s
		}(), func() []got {
			var g []got
			for range 20 {
				g = append(g, got{"GET", "/a?b=c", 200, 5, false}, got{"GET", "/a?b=c", 200, 11, false})
			}
			return g
		}(), nil},
		{"EOF with requests waiting", []step{
			{req: get + get, waiting: true},
			{resp: ok5, waiting: true},
			{eof: true, waiting: true},
		}, []got{{"GET", "/a?b=c", 200, 5, false}}, nil},
		{"EOF mid-response", []step{
			{req: get, waiting: true},
			{resp: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel"},
			{eof: true},
		}, nil, ErrTruncated},
	}
	for _, tt := range tests {
		for _, s := range splitters {
			t.Run(tt.name+"/"+s.name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(1, 2))
				var exchanges []got
				c := &Conn{Done: func(x Exchange) {
					if x.Start.IsZero() {
						t.Errorf("exchange %s %s has no start time", x.Method, x.Target)
					}
					exchanges = append(exchanges, got{x.Method, x.Target, x.Status, bodyBytes(x), x.Upgraded})
				}}
				for i, st := range tt.steps {
					switch {
					case st.eof:
						c.ResponseEOF()
					case st.req != "":
						observe(r, s, st.req, c.Request)
					default:
						observe(r, s, st.resp, c.Response)
					}
					if w := c.Waiting(); w != st.waiting {
						t.Errorf("after step %d (%v): Waiting() = %v, want %v", i, st, w, st.waiting)
					}
				}
				if err := c.Err(); !errors.Is(err, tt.err) || (err == nil) != (tt.err == nil) {
					t.Errorf("Err() = %v, want %v", err, tt.err)
				}
				if fmt.Sprint(exchanges) != fmt.Sprint(tt.want) {
					t.Errorf("exchanges:\n got %v\nwant %v", exchanges, tt.want)
				}
			})
		}
	}
}

func TestHostile(t *testing.T) {
	big := strings.Repeat("a", maxHead)
	tests := []struct {
		name      string
		req, resp string
		err       error
	}{
		{"oversized request head", "GET / HTTP/1.1\r\nX: " + big + "\r\n\r\n", "", ErrTooLarge},
		{"endless request head", "GET / HTTP/1.1\r\n" + strings.Repeat("X: y\r\n", maxHead/6+1), "", ErrTooLarge},
		{"oversized response head", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nX: " + big, ErrTooLarge},
		{"oversized trailer", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + strings.Repeat("X: y\r\n", maxHead/6+1), ErrTooLarge},
		{"long chunk size line", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + big, ErrTooLarge},
		{"bad chunk size", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", ErrMalformed},
		{"empty chunk size", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n", ErrMalformed},
		{"chunk size with bare LF", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n", ErrMalformed},
		{"chunk without CRLF", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n", ErrMalformed},
		{"conflicting Content-Length", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "", ErrMalformed},
		{"conflicting Content-Length list", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 3, 4\r\n\r\n", ErrMalformed},
		{"signed Content-Length", "POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", "", ErrMalformed},
		{"negative Content-Length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "", ErrMalformed},
		{"request Transfer-Encoding not chunked", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "", ErrMalformed},
		{"response without request", "", "HTTP/1.1 200 OK\r\n\r\n", ErrUnexpectedResponse},
		{"more responses than requests", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", ErrUnexpectedResponse},
		{"garbage request", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "", ErrMalformed},
		{"garbage response", "GET / HTTP/1.1\r\n\r\n", "SSH-2.0-OpenSSH_9.6\r\n\r\n", ErrMalformed},
		{"bad status", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n", ErrMalformed},
		{"header without colon", "GET / HTTP/1.1\r\nHost x\r\n\r\n", "", ErrMalformed},
		{"folded first header", "GET / HTTP/1.1\r\n Host: x\r\n\r\n", "", ErrMalformed},
		{"blank line before status", "GET / HTTP/1.1\r\n\r\n", "\r\nHTTP/1.1 200 OK\r\n\r\n", ErrMalformed},
		{"too many pipelined", strings.Repeat("GET / HTTP/1.1\r\n\r\n", maxQueued+1), "", ErrTooLarge},
		{"held bytes above bound, then refused", "GET / HTTP/1.1\r\nUpgrade: x\r\n\r\n" + big + "x", "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", ErrTooLarge},
	}
	for _, tt := range tests {
		for _, s := range splitters {
			if s.name == "bytewise" && len(tt.req)+len(tt.resp) > 1<<16 {
				continue
			}
			t.Run(tt.name+"/"+s.name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(3, 4))
				var c Conn
				observe(r, s, tt.req, c.Request)
				observe(r, s, tt.resp, c.Response)
				c.ResponseEOF()
				if err := c.Err(); !errors.Is(err, tt.err) {
					t.Fatalf("Err() = %v, want %v", err, tt.err)
				}
				if c.Waiting() {
					t.Errorf("Waiting() after %v", c.Err())
				}
				if cap(c.req.buf) > maxHead+maxHead/2 || cap(c.resp.buf) > maxHead+maxHead/2 || cap(c.pending) > maxHead+maxHead/2 {
					t.Errorf("buffers grew to %d, %d, %d bytes", cap(c.req.buf), cap(c.resp.buf), cap(c.pending))
				}
				// Observing stopped: later calls return at once.
				c.Request([]byte("GET / HTTP/1.1\r\n\r\n"))
				c.Response([]byte("HTTP/1.1 200 OK\r\n\r\n"))
			})
		}
	}
}

// TestConcurrent runs the two directions in their own goroutines, as a
// copier does, with Waiting called from a third (go test -race).
func TestConcurrent(t *testing.T) {
	const n = 200
	var c Conn
	done := make(chan Exchange, n)
	c.Done = func(x Exchange) { done <- x }
	var wg sync.WaitGroup
	requested := make(chan struct{}, n)
	wg.Go(func() {
		for i := range n {
			c.Request(fmt.Appendf(nil, "GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i))
			requested <- struct{}{}
		}
	})
	wg.Go(func() {
		for range n {
			<-requested
			c.Response([]byte("HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nHello, world!"))
		}
	})
	wg.Go(func() {
		for range 1000 {
			c.Waiting()
			_ = c.Err()
		}
	})
	wg.Wait()
	close(done)
	i := 0
	for x := range done {
		if want := fmt.Sprintf("/%d", i); x.Target != want || x.Bytes != 13 {
			t.Fatalf("exchange %d: %+v, want target %s and 13 bytes", i, x, want)
		}
		i++
	}
	if i != n || c.Err() != nil || c.Waiting() {
		t.Fatalf("%d exchanges, Err %v, Waiting %v", i, c.Err(), c.Waiting())
	}
}

// TestAwaited follows the method of the oldest request whose response has
// not begun, through pipelined requests.
func TestAwaited(t *testing.T) {
	var c Conn
	want := func(method string, ok bool) {
		t.Helper()
		if x, o := c.Awaited(); x.Method != method || o != ok || ok && (x.Target == "" || x.Start.IsZero()) {
			t.Errorf("Awaited() = %+v, %v; want %q, %v", x, o, method, ok)
		}
	}
	want("", false)
	c.Request([]byte("GET /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b HTTP/1.1\r\nHost: x\r\n\r\n"))
	want("GET", true)
	c.Response([]byte("HTTP/1.1 200 OK\r\n"))
	want("HEAD", true)
	c.Response([]byte("Content-Length: 2\r\n\r\nok"))
	want("HEAD", true)
	c.Response([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"))
	want("", false)
}

// bodyBytes returns x.Bytes, but 0 for an upgrade, whose Bytes depend on
// how its bytes were split (TestUpgradeBytes checks them).
func bodyBytes(x Exchange) int64 {
	if x.Upgraded {
		return 0
	}
	return x.Bytes
}

// TestUpgradeBytes checks the Bytes of an upgrade: those of the new
// protocol that came with its head.
func TestUpgradeBytes(t *testing.T) {
	var got []Exchange
	c := &Conn{Done: func(x Exchange) { got = append(got, x) }}
	c.Request([]byte("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"))
	c.Response([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello"))
	c.Response([]byte("more"))
	if len(got) != 1 || !got[0].Upgraded || got[0].Status != 101 || got[0].Bytes != int64(len("hello")) {
		t.Errorf("exchanges %+v; want one upgrade with 5 bytes", got)
	}
}
