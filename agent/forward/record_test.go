package forward_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/build"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// recorder is a Recorder that keeps what it is handed: the simplest real
// one, for the tests of what HTTP hands a Recorder.
type recorder struct {
	mu        sync.Mutex
	exchanges []*recorded
}

// recorded is an exchange a recorder keeps. Its fields are the recorder's,
// under its lock.
type recorded struct {
	rc       *recorder
	r        *http.Request
	replay   func(*http.Request) error
	events   []string // what the Recording got, in order; consecutive bodies as one
	reqBody  bytes.Buffer
	respBody bytes.Buffer
	status   int
	header   http.Header
	ended    bool
	err      error
	overlaps int // calls that came while another ran
	running  bool

	failedID  string // Failed's request ID
	failedErr error  // and error
}

func (rc *recorder) Record(r *http.Request, replay func(*http.Request) error) forward.Recording {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	x := &recorded{rc: rc, r: r, replay: replay}
	rc.exchanges = append(rc.exchanges, x)
	return x
}

// call runs f on x under the recorder's lock, noting the event and any
// call that overlaps another.
func (x *recorded) call(event string, f func()) {
	x.rc.mu.Lock()
	if x.running {
		x.overlaps++
	}
	x.running = true
	if n := len(x.events); n == 0 || x.events[n-1] != event {
		x.events = append(x.events, event)
	}
	x.rc.mu.Unlock()
	// Outside the lock: a call that overlaps this one shows.
	x.rc.mu.Lock()
	f()
	x.running = false
	x.rc.mu.Unlock()
}

func (x *recorded) RequestBody(p []byte) { x.call("request body", func() { x.reqBody.Write(p) }) }

func (x *recorded) Response(status int, h http.Header) {
	x.call("response", func() { x.status, x.header = status, h.Clone() })
}

func (x *recorded) ResponseBody(p []byte) { x.call("response body", func() { x.respBody.Write(p) }) }

func (x *recorded) Failed(id string, err error) {
	x.call("failed", func() { x.failedID, x.failedErr = id, err })
}

func (x *recorded) End(err error) {
	x.call("end", func() {
		if x.ended {
			x.overlaps++ // a second End
		}
		x.ended, x.err = true, err
	})
}

// ended waits until n exchanges are recorded and ended, and returns them.
func (rc *recorder) ended(t testing.TB, n int) []*recorded {
	t.Helper()
	testwait.For(t, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if len(rc.exchanges) < n {
			return false
		}
		for _, x := range rc.exchanges[:n] {
			if !x.ended {
				return false
			}
		}
		return true
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*recorded(nil), rc.exchanges...)
}

// TestHTTPRecorder sends a request with a body of unknown length (chunked
// over HTTP/1.1) and trailers through a forwarder with a Recorder: the
// Recorder gets the request as the app got it, the body's bytes without
// their framing, the app's final response (not its 100 Continue), its
// body, and the end, in that order, one call at a time.
func TestHTTPRecorder(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				w.Header().Set("X-App", "yes")
				w.Header().Set("Trailer", "X-Sum")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, "got %s", body)
				w.Header().Set("X-Sum", "1")
			})
			to := serveApp(t, app, m.h2c)
			var rc recorder
			addr, _ := startForwarder(t, forward.HTTP{To: to, AppProtocol: appProtocol(m.h2c), Recorder: &rc})
			trailer := http.Header{"X-Checksum": nil}
			req, _ := http.NewRequest("POST", "http://app.example.test/p%20q?x=1", &trailerReader{strings.NewReader("payload"), trailer})
			req.ContentLength = -1
			req.Trailer = trailer
			req.Header.Set("X-Custom", "one")
			req.Header.Set("Expect", "100-continue")
			c := client(t, addr, m.h2c)
			c.Transport.(*http.Transport).ExpectContinueTimeout = time.Hour
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "got payload" {
				t.Fatalf("response %q", body)
			}
			xs := rc.ended(t, 1)
			x := xs[0]
			rc.mu.Lock()
			defer rc.mu.Unlock()
			proto := "HTTP/1.1"
			if m.h2c {
				proto = "HTTP/2.0"
			}
			r := x.r
			if len(xs) != 1 || r.Method != "POST" || r.RequestURI != "/p%20q?x=1" || r.URL.String() != "http://"+to+"/p%20q?x=1" ||
				r.Host != "app.example.test" || r.Proto != proto || r.Header.Get("X-Custom") != "one" || r.Header.Get("Host") != "" ||
				!strings.HasPrefix(r.RemoteAddr, "127.0.0.1:") || r.Body != http.NoBody || r.ContentLength != -1 || r.Context() == nil {
				t.Errorf("%d exchanges; the first's request: %+v", len(xs), r)
			}
			want := []string{"request body", "response", "response body", "end"}
			if fmt.Sprint(x.events) != fmt.Sprint(want) || x.overlaps != 0 {
				t.Errorf("events %v, %d overlapping; want %v, none", x.events, x.overlaps, want)
			}
			if x.reqBody.String() != "payload" || x.status != http.StatusCreated || x.header.Get("X-App") != "yes" ||
				x.respBody.String() != "got payload" || x.err != nil {
				t.Errorf("request body %q, response %d %v %q, end %v", x.reqBody.String(), x.status, x.header, x.respBody.String(), x.err)
			}
		})
	}
}

type replayKey struct{}

// TestHTTPRecorderReplay replays a recorded exchange with the func Record
// got: the app gets the request as given, nothing added, over a
// connection of its own; the replay is recorded like a request from the
// edge, with the replayed request's context and client, and its
// recording has ended when replay returns. Once Serve has returned,
// replay fails with http.ErrServerClosed.
func TestHTTPRecorderReplay(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			type seen struct {
				method, uri, host, body string
				header                  http.Header
			}
			got := make(chan seen, 10)
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				got <- seen{r.Method, r.RequestURI, r.Host, string(body), r.Header}
				io.WriteString(w, "answer to "+r.Method)
			})
			var rc recorder
			addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c), Recorder: &rc})
			resp, err := client(t, addr, m.h2c).Get("http://app.example.test/first")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			<-got
			first := rc.ended(t, 1)[0]

			req, _ := http.NewRequestWithContext(context.WithValue(context.Background(), replayKey{}, "mark"), "PUT", "/again?z=9", strings.NewReader("new body"))
			req.Host = "other.example.test"
			req.Header = http.Header{"X-Edited": {"yes"}}
			req.RemoteAddr = "192.0.2.9:1234"
			if err := first.replay(req); err != nil {
				t.Fatalf("replay: %v", err)
			}
			rc.mu.Lock()
			n := len(rc.exchanges)
			x := rc.exchanges[n-1]
			if n != 2 || !x.ended || x.err != nil || x.r.Context().Value(replayKey{}) != "mark" || x.r.RemoteAddr != "192.0.2.9:1234" ||
				x.r.Method != "PUT" || x.r.RequestURI != "/again?z=9" || x.reqBody.String() != "new body" || x.status != 200 || x.respBody.String() != "answer to PUT" {
				t.Errorf("%d exchanges; the replay's: ended %v (%v), request %+v, body %q, response %d %q", n, x.ended, x.err, x.r, x.reqBody.String(), x.status, x.respBody.String())
			}
			rc.mu.Unlock()
			s := <-got
			wantHeader := http.Header{"X-Edited": {"yes"}, "Content-Length": {"8"}}
			if s.method != "PUT" || s.uri != "/again?z=9" || s.host != "other.example.test" || s.body != "new body" || fmt.Sprint(s.header) != fmt.Sprint(wantHeader) {
				t.Errorf("the app got %+v; want PUT /again?z=9 for other.example.test with %v", s, wantHeader)
			}

			if err := stop(); err != nil {
				t.Fatal(err)
			}
			req, _ = http.NewRequest("GET", "/late", nil)
			if err := first.replay(req); !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("replay after Serve returned: %v, want http.ErrServerClosed", err)
			}
		})
	}
}

// TestHTTPRecorderBrokenOff: a response that breaks off, and a streamed
// one under way when Serve returns, end their recordings with an error,
// and what passed of them recorded; the recorded request's context is
// done once Serve has returned.
func TestHTTPRecorderBrokenOff(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/stream" {
					io.WriteString(w, "data: one\n\n")
					w.(http.Flusher).Flush()
					<-r.Context().Done()
					return
				}
				w.Header().Set("Content-Length", "100")
				io.WriteString(w, "0123456789")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			})
			var rc recorder
			addr, stop := startForwarder(t, forward.HTTP{To: serveApp(t, app, m.h2c), AppProtocol: appProtocol(m.h2c), Recorder: &rc})
			c := client(t, addr, m.h2c)
			if resp, err := c.Get("http://app.example.test/abort"); err == nil {
				if _, err := io.ReadAll(resp.Body); err == nil {
					t.Error("the client got the whole response")
				}
				resp.Body.Close()
			}
			x := rc.ended(t, 1)[0]
			rc.mu.Lock()
			if x.err == nil || x.status != 200 || x.respBody.String() != "0123456789" {
				t.Errorf("broken-off exchange: end %v, %d %q", x.err, x.status, x.respBody.String())
			}
			rc.mu.Unlock()

			resp, err := c.Get("http://app.example.test/stream")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if _, err := io.ReadFull(resp.Body, make([]byte, 5)); err != nil {
				t.Fatal(err)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			xs := rc.ended(t, 2)
			rc.mu.Lock()
			defer rc.mu.Unlock()
			if x := xs[1]; x.err == nil || x.status != 200 || !strings.HasPrefix(x.respBody.String(), "data: one") || x.r.Context().Err() == nil {
				t.Errorf("stream cut by Serve's return: end %v, %d %q, context %v", x.err, x.status, x.respBody.String(), x.r.Context().Err())
			}
		})
	}
}

// TestHTTPRecorderUnreachable: the 502 that answers for an app that
// cannot be reached is recorded as the app's answers are, and a
// FailureRecording gets its request ID and the dial's error first, which
// the answer does not show.
func TestHTTPRecorderUnreachable(t *testing.T) {
	ln := listenLoopback(t)
	down := ln.Addr().String()
	ln.Close()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var rc recorder
			addr, _ := startForwarder(t, forward.HTTP{To: down, AppProtocol: appProtocol(m.h2c), Recorder: &rc})
			resp, err := client(t, addr, m.h2c).Get("http://app.example.test/x")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			x := rc.ended(t, 1)[0]
			rc.mu.Lock()
			defer rc.mu.Unlock()
			if x.r.RequestURI != "/x" || x.status != http.StatusBadGateway || x.header.Get("Tunnelkit-Error") != "app_unreachable" ||
				x.respBody.String() != string(body) || x.err != nil {
				t.Errorf("recorded %s, %d %v %q, end %v; the client got %q", x.r.RequestURI, x.status, x.header, x.respBody.String(), x.err, body)
			}
			if id := resp.Header.Get("Tunnelkit-Request-Id"); x.failedID != id || id == "" || x.failedErr == nil || !strings.HasPrefix(x.failedErr.Error(), "dial tcp "+down+": ") ||
				fmt.Sprint(x.events) != "[failed response response body end]" {
				t.Errorf("recorded Failed(%q, %v), events %v; want the answer's request ID %q, the dial's error, before the response", x.failedID, x.failedErr, x.events, id)
			}
		})
	}
}

// TestHTTPBuildsNoInspector: the forwarder's package imports no agent
// package, the inspector included: an app that forwards does not build
// it ("go list -deps ./agent/forward" lists none either).
func TestHTTPBuildsNoInspector(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range pkg.Imports {
		if strings.HasPrefix(path, "github.com/tunnelkit/tunnelkit/agent") {
			t.Errorf("forward imports %s", path)
		}
	}
}
