package forward_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// The tests of HTTP serve a plain loopback listener,
// which stands in for a tunnel's: the edge's conns carry the same bytes.

func listenLoopback(t testing.TB) net.Listener { return testnet.Listen(t) }

func serveApp(t testing.TB, h http.Handler, h2c bool) string { return testnet.ServeHTTP(t, h, h2c) }

func client(t testing.TB, addr string, h2c bool) *http.Client {
	return testnet.HTTPClient(t, addr, h2c)
}

// server is a forwarder of either mode.
type server interface{ Serve(net.Listener) error }

// startForwarder serves a loopback listener with f and returns its
// address, and stop, which closes the listener and returns what Serve
// returned. The test's end stops it too and wants nil.
func startForwarder(t testing.TB, f server) (addr string, stop func() error) {
	t.Helper()
	ln := listenLoopback(t)
	return ln.Addr().String(), serve(t, f, ln)
}

// serve serves ln with f; stop closes ln and returns what Serve returned.
// The test's end stops it too and wants nil.
func serve(t testing.TB, f server, ln net.Listener) (stop func() error) {
	done := make(chan error, 1)
	go func() { done <- f.Serve(ln) }()
	stop = sync.OnceValue(func() error {
		ln.Close()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return stop
}

// debugLogger returns a logger of every level into b.
func debugLogger(b *testtools.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// modes are the two ways the edge speaks to an app: the forwarder's
// AppProtocol, and so the protocol of the client standing for the edge
// and of the app.
var modes = []struct {
	name string
	h2c  bool
}{{"http1", false}, {"h2c", true}}

func appProtocol(h2c bool) string {
	if h2c {
		return "h2c"
	}
	return "http1"
}

// TestHTTPForwardHeaders sends a request as the edge would, forwarding
// headers included, and checks that the app gets it unchanged, and that
// the client gets the app's response headers without any added. Over
// HTTP/1.1 both go byte for byte, hop-by-hop headers too: the edge drops
// the client's before it sends a request, and the app's from the response
// (edge's TestHopByHopHeadersDropped).
func TestHTTPForwardHeaders(t *testing.T) {
	type seen struct {
		host, uri, proto string
		header           http.Header
	}
	got := make(chan seen, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Host, r.RequestURI, r.Proto, r.Header.Clone()}
		w.Header()["Content-Type"] = nil // none: the proxy must not sniff one
		w.Header()["Date"] = nil
		w.Header().Set("X-App", "yes")
		w.Header().Set("Connection", "X-App-Hop")
		w.Header().Set("X-App-Hop", "dropped")
		io.WriteString(w, "ok")
	})

	t.Run("http1", func(t *testing.T) {
		addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, false)})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET /a%20b/c?x=1;y=2&z HTTP/1.1\r\n"+
			"Host: app.example.test\r\n"+
			"X-Forwarded-For: 203.0.113.7\r\n"+
			"X-Forwarded-Proto: https\r\n"+
			"X-Forwarded-Host: app.example.test\r\n"+
			"Forwarded: for=203.0.113.7;proto=https\r\n"+
			"X-Custom: one\r\n"+
			"X-Custom: two\r\n"+
			"Connection: keep-alive, X-Hop\r\n"+
			"X-Hop: dropped\r\n"+
			"\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		s := <-got
		want := http.Header{
			"X-Forwarded-For":   {"203.0.113.7"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"app.example.test"},
			"Forwarded":         {"for=203.0.113.7;proto=https"},
			"X-Custom":          {"one", "two"},
			"Connection":        {"keep-alive, X-Hop"},
			"X-Hop":             {"dropped"},
		}
		if s.host != "app.example.test" || s.uri != "/a%20b/c?x=1;y=2&z" || !reflect.DeepEqual(s.header, want) {
			t.Errorf("the app got Host %q, URI %q, header %v\nwant app.example.test, /a%%20b/c?x=1;y=2&z, %v", s.host, s.uri, s.header, want)
		}
		wantResp := http.Header{"X-App": {"yes"}, "Content-Length": {"2"}, "Connection": {"X-App-Hop"}, "X-App-Hop": {"dropped"}}
		if resp.StatusCode != 200 || string(body) != "ok" || !reflect.DeepEqual(resp.Header, wantResp) {
			t.Errorf("response %d %q, header %v; want 200 \"ok\", %v", resp.StatusCode, body, resp.Header, wantResp)
		}
	})

	t.Run("h2c", func(t *testing.T) {
		addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, true), AppProtocol: "h2c"})
		req, _ := http.NewRequest("GET", "http://app.example.test/a%20b/c?x=1;y=2&z", nil)
		req.Header = http.Header{
			"User-Agent":        {"test/1"},
			"X-Forwarded-For":   {"203.0.113.7"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"app.example.test"},
			"Forwarded":         {"for=203.0.113.7;proto=https"},
			"X-Custom":          {"one", "two"},
		}
		want := req.Header.Clone()
		resp, err := client(t, addr, true).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := <-got
		if s.proto != "HTTP/2.0" || s.host != "app.example.test" || s.uri != "/a%20b/c?x=1;y=2&z" || !reflect.DeepEqual(s.header, want) {
			t.Errorf("the app got %s, Host %q, URI %q, header %v\nwant HTTP/2.0, app.example.test, /a%%20b/c?x=1;y=2&z, %v", s.proto, s.host, s.uri, s.header, want)
		}
		// HTTP/2 has no Connection header: the app's server dropped it,
		// and X-App-Hop is just a header.
		wantResp := http.Header{"X-App": {"yes"}, "X-App-Hop": {"dropped"}, "Content-Length": {"2"}}
		if resp.StatusCode != 200 || string(body) != "ok" || !reflect.DeepEqual(resp.Header, wantResp) {
			t.Errorf("response %d %q, header %v; want 200 \"ok\", %v", resp.StatusCode, body, resp.Header, wantResp)
		}
	})
}

// trailerReader is a request body of unknown length, so that it goes
// chunked over HTTP/1.1, and whose trailer is set when it ends, as a
// streaming client sets it.
type trailerReader struct {
	r       io.Reader
	trailer http.Header
}

func (b *trailerReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.trailer.Set("X-Checksum", "abc123")
	}
	return n, err
}

// TestHTTPForwardRequestTrailers sends a request whose trailer follows its
// body, chunked over HTTP/1.1 and in a HEADERS frame over h2c.
func TestHTTPForwardRequestTrailers(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				fmt.Fprintf(w, "%s %s %v %q", r.Proto, body, r.TransferEncoding, r.Trailer.Get("X-Checksum"))
			})
			addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c)})
			trailer := http.Header{"X-Checksum": nil}
			req, _ := http.NewRequest("POST", "http://app.example.test/upload", &trailerReader{strings.NewReader("payload"), trailer})
			req.ContentLength = -1
			req.Trailer = trailer
			resp, err := client(t, addr, m.h2c).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			want := `HTTP/1.1 payload [chunked] "abc123"`
			if m.h2c {
				want = `HTTP/2.0 payload [] "abc123"`
			}
			if string(got) != want {
				t.Errorf("the app got %s; want %s", got, want)
			}
		})
	}
}

// TestHTTPForwardResponseTrailers checks an announced trailer and one set
// after the body (http.TrailerPrefix), as gRPC's status.
func TestHTTPForwardResponseTrailers(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Result")
				io.WriteString(w, "body")
				w.Header().Set("X-Result", "done")
				w.Header().Set(http.TrailerPrefix+"X-Late", "late")
			})
			addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c)})
			resp, err := client(t, addr, m.h2c).Get("http://app.example.test/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if string(body) != "body" || resp.Trailer.Get("X-Result") != "done" || resp.Trailer.Get("X-Late") != "late" {
				t.Errorf("body %q, trailer %v; want \"body\", X-Result done, X-Late late", body, resp.Trailer)
			}
		})
	}
}

// TestHTTPForwardStreamsResponse has the client read an event while the
// app's handler still runs.
func TestHTTPForwardStreamsResponse(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			release := make(chan struct{})
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: one\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				io.WriteString(w, "data: two\n\n")
			})
			addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c)})
			resp, err := client(t, addr, m.h2c).Get("http://app.example.test/events")
			if err != nil {
				close(release)
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if line != "data: one\n" {
				close(release)
				t.Fatalf("first line %q, %v", line, err)
			}
			close(release)
			rest, err := io.ReadAll(br)
			if string(rest) != "\ndata: two\n\n" || err != nil {
				t.Errorf("rest %q, %v", rest, err)
			}
		})
	}
}

// TestHTTPForwardUpgrade switches protocols as WebSocket does, echoes
// bytes both ways, half-closes, and checks the request's log line.
func TestHTTPForwardUpgrade(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw) // echo until the client's half-close
	})
	var log testtools.Buffer
	addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, false), Logger: debugLogger(&log)})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The first message rides with the request, as a client that does not
	// wait for the 101 sends it.
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: app.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly ")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo" {
		t.Fatalf("response %s, header %v", resp.Status, resp.Header)
	}
	for _, msg := range []string{"ping", "pong", strings.Repeat("x", 100000)} {
		io.WriteString(c, msg)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	want := "early pingpong" + strings.Repeat("x", 100000)
	if string(got) != want || err != nil {
		t.Fatalf("echoed %d bytes (%v), want %d", len(got), err, len(want))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("msg=http method=GET path=/ws status=101 bytes=%d ", len(want))
	if !strings.Contains(log.String(), line) {
		t.Errorf("log:\n%s\nwant a line with %s", log.String(), line)
	}
}

// h2cListener is a listener whose conns carry h2c.
type h2cListener struct{ net.Listener }

func (h2cListener) AppProtocol() string { return "h2c" }

// TestHTTPForwardBidiStream is a gRPC-style bidirectional stream over h2c:
// the app echoes each message before the request body ends.
func TestHTTPForwardBidiStream(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		br := bufio.NewReader(r.Body)
		for {
			msg, err := br.ReadString('\n')
			if err != nil {
				break
			}
			io.WriteString(w, "echo "+msg)
			w.(http.Flusher).Flush()
		}
		w.Header().Set("Grpc-Status", "0")
	})
	// The listener says h2c, as an *agent.Listener of an h2c endpoint.
	ln := h2cListener{listenLoopback(t)}
	addr := ln.Addr().String()
	serve(t, forward.HTTP{To: serveApp(t, app, true)}, ln)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://app.example.test/echo.Echo/Stream", pr)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := client(t, addr, true).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 5 {
		msg := fmt.Sprintf("message %d\n", i)
		if _, err := io.WriteString(pw, msg); err != nil {
			t.Fatal(err)
		}
		got, err := br.ReadString('\n')
		if got != "echo "+msg {
			t.Fatalf("got %q, %v; want %q", got, err, "echo "+msg)
		}
	}
	pw.Close()
	if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
		t.Fatalf("after the end: %q, %v", rest, err)
	}
	if resp.Trailer.Get("Grpc-Status") != "0" {
		t.Errorf("trailer %v, want Grpc-Status 0", resp.Trailer)
	}
}

// TestHTTPForwardExpectContinue has a client wait for the app's 100
// Continue before it sends its body.
func TestHTTPForwardExpectContinue(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "%s %s", r.Header.Get("Expect"), body)
			})
			addr, _ := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c)})
			c := client(t, addr, m.h2c)
			c.Transport.(*http.Transport).ExpectContinueTimeout = time.Hour // wait for the 100
			continued := make(chan struct{}, 1)
			trace := &httptrace.ClientTrace{Got100Continue: func() { continued <- struct{}{} }}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "PUT", "http://app.example.test/f", strings.NewReader("big upload"))
			req.Header.Set("Expect", "100-continue")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			want := "100-continue big upload"
			if m.h2c {
				// net/http's HTTP/2 servers take Expect out of the
				// request's header, the forwarder's as the app's.
				want = " big upload"
			}
			if string(body) != want {
				t.Errorf("the app answered %q", body)
			}
			select {
			case <-continued:
			default:
				t.Error("no 100 Continue")
			}
		})
	}
}

// TestHTTPForwardAppUnreachable checks the edge's format for the errors
// the forwarder answers itself: the code and what happened, in words, and
// a request ID, in the body and the header; the warning has the ID, and
// the detail the answer does not show (the dial's error, naming the app's
// address; the app's close).
func TestHTTPForwardAppUnreachable(t *testing.T) {
	ln := listenLoopback(t)
	down := ln.Addr().String()
	ln.Close()
	closer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	})
	for _, tc := range []struct {
		name, to, code, msg, detail string
	}{
		{"unreachable", down, "app_unreachable", "the app behind the tunnel cannot be reached", `err="dial tcp ` + down + `: connect: connection refused"`},
		{"closes", serveApp(t, closer, false), "app_error", "the app closed the connection without a whole response", `err="forward: the app closed the connection before it answered"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log testtools.Buffer
			addr, stop := startForwarder(t, forward.HTTP{To: tc.to, Logger: debugLogger(&log)})
			resp, err := client(t, addr, false).Post("http://app.example.test/x", "text/plain", strings.NewReader("data"))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			id := resp.Header.Get("Tunnelkit-Request-Id")
			if want := tc.code + ": " + tc.msg + "\nrequest id: " + id + "\n"; resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != tc.code || id == "" || string(body) != want {
				t.Errorf("%s, Tunnelkit-Error %q, body %q; want 502, %s, %q", resp.Status, resp.Header.Get("Tunnelkit-Error"), body, tc.code, want)
			}
			stop()
			for _, want := range []string{"level=WARN msg=\"http error\" code=" + tc.code + " request_id=" + id + " method=POST path=/x ", " to=" + tc.to + " " + tc.detail + "\n", "msg=http method=POST path=/x status=502 bytes=" + fmt.Sprint(len(body))} {
				if !strings.Contains(log.String(), want) {
					t.Errorf("log:\n%s\nwant a line with %s", log.String(), want)
				}
			}
		})
	}
}

// TestHTTPForwardLogLine checks the request's line, and that a path
// cannot forge log lines.
func TestHTTPForwardLogLine(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "hello")
			})
			var log testtools.Buffer
			addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c), Logger: debugLogger(&log)})
			c := client(t, addr, m.h2c)
			for _, path := range []string{"/hello/world", "/x%0Ay%1B" + strings.Repeat("z", 300)} {
				resp, err := c.Get("http://app.example.test" + path + "?q=1")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(log.String()), "\n")
			wants := []string{
				"level=INFO msg=http method=GET path=/hello/world status=201 bytes=5 duration=",
				"level=INFO msg=http method=GET path=/x?y?" + strings.Repeat("z", 256-5) + " status=201 bytes=5 duration=",
			}
			if len(lines) != len(wants) {
				t.Fatalf("log:\n%s\nwant %d lines", log.String(), len(wants))
			}
			for i, want := range wants {
				if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], " client=127.0.0.1:") {
					t.Errorf("line %q\nwant %s... client=127.0.0.1:...", lines[i], want)
				}
			}
		})
	}
}

// proxyGoroutines counts the goroutines that run this package's code or
// serve or hold HTTP connections: those of a forwarder, or of the app at
// the other end of its connections.
func proxyGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		for _, mark := range []string{"tunnelkit/tunnelkit/agent/forward.", "net/http.(*persistConn)", "net/http.(*conn).serve", "net/http.(*http2"} {
			if bytes.Contains(g, []byte(mark)) {
				n++
				break
			}
		}
	}
	return n
}

// TestHTTPForwardServeReturns closes the listener while a response streams
// and an upgraded connection is open, and a connection to the app is
// idle: Serve returns nil, all end, and none of the forwarder's goroutines
// is left.
func TestHTTPForwardServeReturns(t *testing.T) {
	before := proxyGoroutines()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
			return
		}
		if r.Method == "HEAD" {
			return
		}
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, false)})
	c := client(t, addr, false)

	resp, err := c.Get("http://app.example.test/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil {
		t.Fatalf("first line %q, %v", line, err)
	}

	up, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	io.WriteString(up, "GET /ws HTTP/1.1\r\nHost: app.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	upr := bufio.NewReader(up)
	if r, err := http.ReadResponse(upr, nil); err != nil || r.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v", err)
	}

	// A request done: its connection to the app waits, idle.
	head, err := c.Head("http://app.example.test/")
	if err != nil {
		t.Fatal(err)
	}
	head.Body.Close()

	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := io.ReadAll(br); err == nil {
		t.Error("the streamed response ended cleanly; want an error")
	}
	if _, err := io.ReadAll(upr); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("upgraded conn: %v", err)
	}
	// Serve waited for its requests; what is left of its goroutines is
	// unblocked and ends at once.
	for i := 0; proxyGoroutines() > before; i++ {
		if i == 1000 {
			t.Fatalf("%d goroutines of the forwarder or its conns left, %d before", proxyGoroutines(), before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne)
}

// TestHTTPForwardConfigErrors checks what Serve refuses.
func TestHTTPForwardConfigErrors(t *testing.T) {
	for _, f := range []server{
		forward.HTTP{To: "127.0.0.1:1", AppProtocol: "h3"},
		forward.Bytes{To: "127.0.0.1:1", ProxyProtocol: 3},
	} {
		ln := listenLoopback(t)
		err := f.Serve(ln)
		ln.Close()
		if err == nil {
			t.Errorf("%+v: Serve returned nil", f)
		}
	}
}

// BenchmarkForwarder compares the HTTP mode with the bytes mode on small
// GETs over keep-alive connections: bytes and http run requests in
// parallel, each mode on its own; interleaved runs one request at a time,
// in turn through each mode, so that both see the same machine, and
// reports their latencies and the HTTP mode's speed as a fraction of the
// bytes mode's (speed-vs-bytes).
func BenchmarkForwarder(b *testing.B) {
	app := serveApp(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "hello, world\n")
	}), false)
	get := func(b *testing.B, c *http.Client) {
		resp, err := c.Get("http://app.example.test/")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, mode := range []struct {
		name string
		f    server
	}{{"bytes", forward.Bytes{To: app}}, {"http", forward.HTTP{To: app}}} {
		b.Run(mode.name, func(b *testing.B) {
			addr, _ := startForwarder(b, mode.f)
			c := client(b, addr, false)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get(b, c)
				}
			})
		})
	}
	b.Run("interleaved", func(b *testing.B) {
		bytesAddr, _ := startForwarder(b, forward.Bytes{To: app})
		httpAddr, _ := startForwarder(b, forward.HTTP{To: app})
		bytesClient, httpClient := client(b, bytesAddr, false), client(b, httpAddr, false)
		get(b, bytesClient)
		get(b, httpClient)
		var inBytes, inHTTP time.Duration
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			get(b, bytesClient)
			t1 := time.Now()
			get(b, httpClient)
			inBytes += t1.Sub(t0)
			inHTTP += time.Since(t1)
		}
		b.ReportMetric(float64(inBytes.Nanoseconds())/float64(b.N), "bytes-ns/req")
		b.ReportMetric(float64(inHTTP.Nanoseconds())/float64(b.N), "http-ns/req")
		b.ReportMetric(float64(inBytes)/float64(inHTTP), "speed-vs-bytes")
	})
}

// TestHTTPForwardMalformedRequest sends bytes that are not an HTTP/1.1
// request straight to the forwarder (the edge never sends such): they
// reach the app as they are, whose 400 reaches the client, and the
// forwarder logs no request line for them.
func TestHTTPForwardMalformedRequest(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	var log testtools.Buffer
	addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, false), Logger: debugLogger(&log)})
	for _, req := range []string{
		"GARBAGE\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"GET / HTTP/1.1\r\n" + strings.Repeat("X-Big: "+strings.Repeat("a", 1000)+"\r\n", 2000) + "\r\n",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		go io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%.20q: %v", req, err)
		}
		if resp.StatusCode/100 != 4 {
			t.Errorf("%.20q: %s, want the app's 4xx", req, resp.Status)
		}
		c.Close()
	}
	stop()
	if strings.Contains(log.String(), "msg=http ") {
		t.Errorf("log:\n%s\nwant no request line", log.String())
	}
}
