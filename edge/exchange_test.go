package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// Every exchange ends, and ends truthfully (issue #18): each test runs the
// same exchange through one plain httputil.ReverseProxy hop, the baseline,
// and through the tunnel with the agent in both of its modes (copying
// bytes, and forwarding request by request), over HTTP/1.1 and HTTP/2.

// hop is a way from a client to the app: the baseline ReverseProxy, or the
// tunnel.
type hop struct {
	name string
	// client returns a client of the hop over HTTP/2 when h2, else
	// HTTP/1.1, both over TLS; every name reaches the hop.
	client func(t testing.TB, h2 bool) *http.Client
	url    string             // the app's URL through the hop
	obs    *tally             // the edge's counts; nil for the baseline
	srv    *edge.Server       // nil for the baseline
	closed func(t testing.TB) // waits until the hop holds no stream of an exchange; nil for the baseline
}

// hops returns the baseline and the tunnel in both agent modes, in front
// of app (an HTTP/1.1 server on loopback), configuring the edge with
// configure.
func hops(t *testing.T, app http.Handler, configure func(*edge.Server)) []hop {
	t.Helper()
	appLn := listen(t)
	appSrv := &http.Server{Handler: app}
	go appSrv.Serve(appLn)
	t.Cleanup(func() { appSrv.Close() })
	appAddr := appLn.Addr().String()
	return append([]hop{baselineHop(t, appAddr)}, tunnelHops(t, appAddr, configure)...)
}

// tunnelHops returns the tunnel in both agent modes in front of the app at
// appAddr.
func tunnelHops(t *testing.T, appAddr string, configure func(*edge.Server)) []hop {
	t.Helper()
	var out []hop
	for _, mode := range []string{"bytes", "requests"} {
		obs := &tally{}
		e := startHTTPSEdge(t, func(s *edge.Server) {
			s.Observer = obs
			if os.Getenv("EXCHANGE_DEBUG") != "" {
				s.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			if configure != nil {
				configure(s)
			}
		})
		c := &agent.Client{Addrs: []string{e.agentAddr}}
		l, err := c.Listen(context.Background(), "https://app")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if mode == "bytes" {
				forward.Bytes{To: appAddr}.Serve(l)
				return
			}
			forward.HTTP{To: appAddr}.Serve(l)
		}()
		t.Cleanup(func() { c.Close(); <-done })
		// A version 3 session holds no stream at rest (its pings are
		// streams of a moment).
		const idle = 0
		testwait.For(t, func() bool { return obs.get("streams") == idle })
		out = append(out, hop{
			name:   "tunnel, agent copying " + mode,
			client: e.client,
			url:    l.URL(),
			obs:    obs,
			srv:    e.srv,
			closed: func(t testing.TB) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for obs.get("streams") != idle {
					if time.Now().After(deadline) {
						t.Fatalf("the edge holds %d streams 10 s after the exchanges ended, want %d (%s)", obs.get("streams"), idle, obs)
					}
					time.Sleep(5 * time.Millisecond)
				}
			},
		})
		if mode == "requests" {
			out[len(out)-1].name = "tunnel, agent forwarding requests"
		}
	}
	return out
}

// baselineHop is one stdlib ReverseProxy in front of the app at appAddr,
// speaking TLS (HTTP/2 and HTTP/1.1) to its clients.
func baselineHop(t *testing.T, appAddr string) hop {
	pki := testpki.New(t)
	target, _ := url.Parse("http://" + appAddr)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Host = pr.In.Host
	}}
	ln := listen(t)
	srv := &http.Server{Handler: rp, TLSConfig: &tls.Config{Certificates: []tls.Certificate{pki.Issue(t, "*.example.test")}}}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	srv.Protocols = p
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	return hop{
		name: "baseline ReverseProxy",
		client: func(t testing.TB, h2 bool) *http.Client {
			p := new(http.Protocols)
			if h2 {
				p.SetHTTP2(true)
			} else {
				p.SetHTTP1(true)
			}
			tr := &http.Transport{
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				},
				TLSClientConfig: &tls.Config{RootCAs: pki.Pool},
				Protocols:       p,
			}
			t.Cleanup(tr.CloseIdleConnections)
			return &http.Client{Transport: tr, Timeout: 30 * time.Second}
		},
		url: "https://app.example.test:" + port,
	}
}

func protoName(h2 bool) string {
	if h2 {
		return "h2"
	}
	return "h1"
}

// TestRefusedUploadIsAnswered: an app answers 413, with Connection:
// close, to a 10 MB upload without reading it. Through the baseline, the
// client gets the 413 every time; so it must through the tunnel, in both
// agent modes and over both protocols, promptly (it used to hang for
// good, holding its stream and its client's share), and the edge's
// streams return to zero afterwards. With "Expect: 100-continue", the app
// sees the expectation and refuses before the body is sent.
func TestRefusedUploadIsAnswered(t *testing.T) {
	t.Parallel()
	var sawExpect atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Expect") == "100-continue" {
			sawExpect.Add(1)
		}
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		io.WriteString(w, "too large")
	})
	const size = 10 << 20
	for _, h := range hops(t, app, nil) {
		for _, h2 := range []bool{false, true} {
			for _, expect := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/expect=%v", h.name, protoName(h2), expect)
				t.Run(name, func(t *testing.T) {
					client := h.client(t, h2)
					client.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Second
					sawExpect.Store(0)
					var inBefore int64
					if h.obs != nil {
						inBefore = h.obs.get("in/https")
					}
					for i := range 10 {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						req, _ := http.NewRequestWithContext(ctx, "PUT", h.url+"/upload", pattern(size))
						req.ContentLength = size
						if expect {
							req.Header.Set("Expect", "100-continue")
						}
						resp, err := client.Do(req)
						if err != nil {
							cancel()
							t.Fatalf("upload %d: %v (want the app's 413 within 5 s)", i, err)
						}
						body, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						cancel()
						if resp.StatusCode != http.StatusRequestEntityTooLarge || string(body) != "too large" {
							t.Fatalf("upload %d: %d %q, want the app's 413", i, resp.StatusCode, body)
						}
					}
					// Go's HTTP/2 server takes the expectation off the
					// request and answers it itself when the body is first
					// read (the baseline's app never sees it either).
					if expect && !h2 && sawExpect.Load() != 10 {
						t.Errorf("the app saw Expect: 100-continue %d times of 10", sawExpect.Load())
					}
					if expect && h.obs != nil {
						if in := h.obs.get("in/https") - inBefore; in > 10*1<<20 {
							t.Errorf("the edge read %d bytes of bodies the app refused before they were sent", in)
						}
					}
					client.Transport.(*http.Transport).CloseIdleConnections()
					if h.closed != nil {
						h.closed(t)
					}
				})
			}
		}
	}
}

// TestClientThatLeavesCancelsTheApp: a client gives up on a request the
// app is still working on. Through the baseline, the app's request context
// is cancelled; through the tunnel too, over HTTP/1.1 (the client closes
// its connection) and HTTP/2 (RST_STREAM), in both agent modes.
func TestClientThatLeavesCancelsTheApp(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	cancelled := make(chan time.Time, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			cancelled <- time.Now()
		case <-time.After(30 * time.Second):
			cancelled <- time.Time{} // never cancelled
		}
	})
	for _, h := range hops(t, app, nil) {
		for _, h2 := range []bool{false, true} {
			t.Run(h.name+"/"+protoName(h2), func(t *testing.T) {
				client := h.client(t, h2)
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() {
					req, _ := http.NewRequestWithContext(ctx, "GET", h.url+"/work", nil)
					resp, err := client.Do(req)
					if err == nil {
						resp.Body.Close()
					}
					errc <- err
				}()
				select {
				case <-arrived:
				case <-time.After(10 * time.Second):
					t.Fatal("the request never reached the app")
				}
				left := time.Now()
				cancel() // the client leaves
				<-errc
				at := <-cancelled
				if at.IsZero() {
					t.Fatal("the app's request ran its full 30 s: the client's leaving never reached it")
				}
				t.Logf("the app's request was cancelled %v after the client left", at.Sub(left).Round(time.Millisecond))
				if h.closed != nil {
					client.Transport.(*http.Transport).CloseIdleConnections()
					h.closed(t)
				}
			})
		}
	}
}

// TestHalfClosedClientGetsTheAnswer: an HTTP/1.1 client sends its
// request, half-closes its side, and only then does the app answer: the
// client still gets the app's answer (the tunnel cannot tell a
// half-close from a client that left, but waits a moment for the answer
// before it cancels).
func TestHalfClosedClientGetsTheAnswer(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "app")
	halfClosed := make(chan struct{}, 1)
	var posts atomic.Int32
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == "POST" {
			posts.Add(1)
		}
		<-halfClosed // answer once the client half-closed
		w.WriteHeader(201)
		fmt.Fprintf(w, "%s %s", r.Method, body)
	}))
	for _, c := range []struct{ req, want string }{
		{"GET / HTTP/1.1\r\nHost: app.example.test\r\n\r\n", "GET "},
		{"POST / HTTP/1.1\r\nHost: app.example.test\r\nContent-Length: 5\r\n\r\nhello", "POST hello"},
	} {
		conn, err := net.Dial("tcp", te.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, c.req)
		conn.(*net.TCPConn).CloseWrite()
		halfClosed <- struct{}{}
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%q then half-close: %v", c.req, err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != 201 || string(body) != c.want {
			t.Fatalf("%q then half-close: %d %q, want the app's 201 %q", c.req, resp.StatusCode, body, c.want)
		}
	}
	if posts.Load() != 1 {
		t.Fatalf("%d posts reached the app, want 1", posts.Load())
	}
}

// TestHalfClosedClientGetsALongAnswer: an HTTP/1.1 client half-closes
// after its request and reads a long answer: it gets it whole, since the
// answer keeps moving (the edge cuts a half-closed client's answer only
// once it stops: see TestEventStreamClientsThatGoOverHTTP1). The app
// writes a chunk each time the client has read the one before, until the
// answer has lasted more than twice the edge's grace for a half-closed
// client's answer (1 s): it moves as fast as the machine lets it, never
// waits on a timer, and costs little.
func TestHalfClosedClientGetsALongAnswer(t *testing.T) {
	t.Parallel()
	te := startEdge(t)
	const chunk = 4 << 10
	const lasts = 2500 * time.Millisecond // past two graces of 1 s
	next := make(chan bool)               // the client read a chunk: true, another; false, the end
	stopped := make(chan struct{})
	t.Cleanup(func() { close(stopped) })
	var sent atomic.Int64
	appDone := make(chan struct{})
	te.serveApp(t, "long", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(appDone)
		rc := http.NewResponseController(w)
		for {
			n, err := w.Write(bytes.Repeat([]byte{'x'}, chunk))
			sent.Add(int64(n))
			if err != nil || rc.Flush() != nil {
				return
			}
			select {
			case more := <-next:
				if !more {
					return
				}
			case <-r.Context().Done():
				return
			case <-stopped:
				return
			}
		}
	}))
	conn, err := net.Dial("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: long.example.test\r\n\r\n")
	conn.(*net.TCPConn).CloseWrite()
	halfClosed := time.Now()
	conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	buf := make([]byte, chunk)
	for {
		m, err := io.ReadFull(resp.Body, buf)
		n += int64(m)
		if err != nil {
			if err == io.EOF {
				break
			}
			t.Fatalf("the half-closed client read %d bytes, %v after it half-closed, of %d sent: %v", n, time.Since(halfClosed).Round(time.Millisecond), sent.Load(), err)
		}
		select {
		case next <- time.Since(halfClosed) < lasts:
		case <-appDone: // the answer ends: the next read says how
		}
	}
	if n != sent.Load() {
		t.Fatalf("the half-closed client read %d bytes of %d", n, sent.Load())
	}
	t.Logf("the half-closed client read %d bytes in %v", n, time.Since(halfClosed).Round(time.Millisecond))
}

// TestStalledExchangesEnd: whatever side stops moving bytes it owes, the
// exchange ends after Timeouts.HTTPIdle: the client hears of it, the
// edge's streams are released, and the agent drops its connection to the
// app, which the app learns when it reads or writes again (as behind any
// proxy that gave up): an app that stops reading an upload, a client that
// stops reading a download, an app that stops sending its body.
func TestStalledExchangesEnd(t *testing.T) {
	t.Parallel()
	appSaid := make(chan string, 16)
	var resume chan struct{}
	var mu sync.Mutex
	resumed := func() chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return resume
	}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stop-reading": // reads a little of the upload, then stalls
			io.ReadFull(r.Body, make([]byte, 1024))
			<-resumed()
			if _, err := io.Copy(io.Discard, r.Body); err != nil {
				appSaid <- "stop-reading: the rest of the body failed"
			} else {
				appSaid <- "stop-reading: the whole body came"
			}
		case "/big": // a body far larger than every buffer on the way
			buf := make([]byte, 64<<10)
			for i := 0; i < (256<<20)/len(buf); i++ {
				if _, err := w.Write(buf); err != nil {
					appSaid <- "big: write failed"
					return
				}
			}
			appSaid <- "big: sent whole"
		case "/stop-sending": // a little of the body, then stalls
			w.Write(make([]byte, 1024))
			http.NewResponseController(w).Flush()
			<-resumed()
			buf := make([]byte, 64<<10)
			for i := 0; i < (64<<20)/len(buf); i++ {
				if _, err := w.Write(buf); err != nil {
					appSaid <- "stop-sending: write failed"
					return
				}
			}
			appSaid <- "stop-sending: sent whole"
		}
	})
	appLn := listen(t)
	appSrv := &http.Server{Handler: app}
	go appSrv.Serve(appLn)
	t.Cleanup(func() { appSrv.Close() })
	stall := func() chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		resume = make(chan struct{})
		return resume
	}

	// A second of silence ends an exchange: a stall of the machine's while
	// bytes are due (the agent and the app taking a request in) must not.
	idle := func(s *edge.Server) { s.Timeouts.HTTPIdle = time.Second }
	for _, h := range tunnelHops(t, appLn.Addr().String(), idle) {
		for _, h2 := range []bool{false, true} {
			t.Run(h.name+"/"+protoName(h2), func(t *testing.T) {
				client := h.client(t, h2)
				// The app stops reading an upload: the agent stops reading
				// its stream, the edge's writes wait for window.
				resume := stall()
				req, _ := http.NewRequest("PUT", h.url+"/stop-reading", pattern(256<<20))
				req.ContentLength = 256 << 20
				if resp, err := client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadGateway {
						t.Errorf("the stalled upload got %d, want 502", resp.StatusCode)
					}
				}
				close(resume)
				waitApp(t, appSaid, "stop-reading: the rest of the body failed")

				// The client stops reading a download.
				resp, err := client.Get(h.url + "/big")
				if err != nil {
					t.Fatal(err)
				}
				io.ReadFull(resp.Body, make([]byte, 1024))
				waitApp(t, appSaid, "big: write failed")
				resp.Body.Close()

				// The app stops sending its body.
				resume = stall()
				resp, err = client.Get(h.url + "/stop-sending")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, resp.Body); err == nil {
					t.Error("a body the app stopped sending read as whole")
				}
				resp.Body.Close()
				close(resume)
				waitApp(t, appSaid, "stop-sending: write failed")

				client.Transport.(*http.Transport).CloseIdleConnections()
				h.closed(t)
			})
		}
	}
}

// waitApp waits for the app to say want.
func waitApp(t *testing.T, said <-chan string, want string) {
	t.Helper()
	select {
	case got := <-said:
		if got != want {
			t.Fatalf("the app said %q, want %q", got, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the app never said %q: the exchange did not end", want)
	}
}

// TestAccessLogSaysSwitchingProtocols: the access line of a WebSocket
// upgrade records 101, the status the client got, and the upgraded
// connection's bytes.
func TestAccessLogSaysSwitchingProtocols(t *testing.T) {
	t.Parallel()
	var logged testtools.Buffer
	te := edgeOn(t, &edge.Server{Domain: "example.test", AccessLog: slog.New(slog.NewTextHandler(&logged, nil))}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}}
	defer c.Close()
	l := bind(t, c, "ws")
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the client closes
	}))
	conn, err := net.Dial("tcp", te.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: ws.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "hello")
	got := make([]byte, 5)
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello" {
		t.Fatalf("echo: %q %v", got, err)
	}
	conn.Close()
	testwait.For(t, func() bool { return strings.Contains(logged.String(), "\n") })
	line := logged.String()
	if !strings.Contains(line, "status=101") || !strings.Contains(line, "bytes=5") {
		t.Fatalf("access line %q, want status=101 and the 5 bytes echoed", line)
	}
}

// TestHopByHopHeadersDropped sends a request with hop-by-hop headers of
// the client's, to an app that answers with hop-by-hop headers of its
// own: through every hop, the app sees none of the client's and the
// client none of the app's. (The agent forwarding requests passes
// HTTP/1.1 on byte for byte: the edge drops them both ways.)
func TestHopByHopHeadersDropped(t *testing.T) {
	t.Parallel()
	type seen struct{ conn, hop, keep string }
	got := make(chan seen, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{strings.Join(r.Header["Connection"], ","), r.Header.Get("X-Hop"), r.Header.Get("Keep-Alive")}
		w.Header().Set("Connection", "X-App-Hop")
		w.Header().Set("X-App-Hop", "app")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, "ok")
	})
	for _, h := range hops(t, app, nil) {
		for _, h2 := range []bool{false, true} {
			req, _ := http.NewRequest("GET", h.url+"/hop", nil)
			if !h2 { // HTTP/2 has no hop-by-hop headers: Go's client refuses them
				req.Header.Set("Connection", "X-Hop")
				req.Header.Set("X-Hop", "client")
				req.Header.Set("Keep-Alive", "timeout=9")
			}
			resp, err := h.client(t, h2).Do(req)
			if err != nil {
				t.Fatalf("%s (h2 %v): %v", h.name, h2, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			s := <-got
			if s != (seen{}) {
				t.Errorf("%s (h2 %v): the app got Connection %q, X-Hop %q, Keep-Alive %q; want none", h.name, h2, s.conn, s.hop, s.keep)
			}
			for _, k := range []string{"Connection", "X-App-Hop", "Keep-Alive"} {
				if v := resp.Header.Get(k); v != "" {
					t.Errorf("%s (h2 %v): the client got %s %q; want none", h.name, h2, k, v)
				}
			}
		}
	}
}

// TestMalformedAppResponse has the app answer with bytes that are not a
// valid HTTP response: the tunnel answers as the baseline does (a 502, or
// a broken answer for a body that breaks after its head), and the forwarder
// that watches the bytes (the agent forwarding requests) passes them on
// and stops watching, without a panic or a hang.
func TestMalformedAppResponse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, answer string }{
		{"garbage", "SSH-2.0-OpenSSH_9.6\r\n\r\n"},
		{"bad status", "HTTP/1.1 abc Nope\r\nContent-Length: 0\r\n\r\n"},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok"},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				io.WriteString(c, tc.answer)
			})
			var want string
			for i, h := range hops(t, app, nil) {
				// A broken answer, whether the client saw its head or not
				// (a race at every hop), or the status of a whole one.
				got := "broken"
				resp, err := h.client(t, false).Get(h.url + "/x")
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil {
						got = resp.Status
					}
				}
				if i == 0 {
					want = got // the baseline's
					continue
				}
				if got != want {
					t.Errorf("%s: %s; the baseline: %s", h.name, got, want)
				}
			}
		})
	}
}

// TestAppClosesKeptAliveConnection has the app close a kept-alive
// connection as the next request arrives on it, without answering (as an
// app whose keep-alive timeout ends just then does): the tunnel answers as
// the baseline does, sending an idempotent request again on a new
// connection, and answering 502 for a POST.
func TestAppClosesKeptAliveConnection(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	served := map[string]int{} // requests per app connection
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		served[r.RemoteAddr]++
		n := served[r.RemoteAddr]
		mu.Unlock()
		if n == 2 {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		io.WriteString(w, "ok")
	})
	for _, method := range []string{"GET", "POST"} {
		var want string
		for i, h := range hops(t, app, nil) {
			c := h.client(t, false)
			var got []string
			for range 2 {
				req, _ := http.NewRequest(method, h.url+"/k", nil)
				resp, err := c.Do(req)
				if err != nil {
					got = append(got, "error")
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got = append(got, resp.Status)
			}
			if i == 0 {
				want = strings.Join(got, ", ") // the baseline's
				continue
			}
			if g := strings.Join(got, ", "); g != want {
				t.Errorf("%s %s: %s; the baseline: %s", method, h.name, g, want)
			}
		}
		t.Logf("%s: %s", method, want)
	}
}

// TestRequestTrailersAsBaseline: a request's trailers reach the app as
// through the baseline, over HTTP/1.1 and HTTP/2, but for those named like
// a header the edge reserves or sets (Tunnelkit-*, X-Forwarded-*,
// Forwarded, however spelled), which the baseline passes on and the edge
// drops (issue #32, item 6: Tunnelkit-Auth-User as a trailer reached the
// app in r.Trailer). The baseline's app gets the trailers' names alone,
// without their values (its clone of the request has a trailer map of its
// own, which nothing fills: see exchange.rewrite); the tunnel's gets both.
func TestRequestTrailersAsBaseline(t *testing.T) {
	t.Parallel()
	got := make(chan http.Header, 1)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got <- r.Trailer
	})
	sent := http.Header{
		"X-Checksum": {"abc"}, "Grpc-Status": {"0"},
		"Tunnelkit-Auth-User": {"root"}, "Tunnelkit_Auth_User": {"root"},
		"X-Forwarded-For": {"6.6.6.6"}, "Forwarded": {"for=6.6.6.6"}, "X.Forwarded.Host": {"evil.example"},
	}
	reserved := map[string]bool{"Tunnelkit-Auth-User": true, "Tunnelkit_auth_user": true, "X-Forwarded-For": true, "Forwarded": true, "X.forwarded.host": true}
	for _, h2 := range []bool{false, true} {
		var want []string
		for i, h := range hops(t, app, nil) {
			req, _ := http.NewRequest("POST", h.url+"/upload", io.MultiReader(strings.NewReader("body")))
			req.Trailer = sent.Clone()
			resp, err := h.client(t, h2).Do(req)
			if err != nil {
				t.Fatalf("%s/%s: %v", h.name, protoName(h2), err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			trailer := <-got
			names := slices.Sorted(maps.Keys(trailer))
			if i == 0 {
				t.Logf("%s: the baseline passes %q", protoName(h2), names)
				for _, name := range names {
					if !reserved[name] {
						want = append(want, name)
					}
				}
				continue
			}
			if !slices.Equal(names, want) {
				t.Errorf("%s/%s: the app got the trailers %q; want %q", h.name, protoName(h2), names, want)
			}
			for _, name := range want {
				if v := sent[name]; !slices.Equal(trailer[name], v) {
					t.Errorf("%s/%s: the app got %s %q; want %q", h.name, protoName(h2), name, trailer[name], v)
				}
			}
		}
	}
}

// laxUpgrades is an app that switches to whatever protocol a request asks
// for in Upgrade (as a lax h2c server does, to speak HTTP/2 on the
// connection from then on), and answers others with their protocol;
// seen gets what it saw of each request.
func laxUpgrades(seen chan<- string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := r.Header.Get("Upgrade")
		seen <- fmt.Sprintf("Upgrade %q Connection %q HTTP2-Settings %q", r.Header.Values("Upgrade"), r.Header.Values("Connection"), r.Header.Values("Http2-Settings"))
		if up == "" {
			io.WriteString(w, r.Proto)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		proto, _, _ := strings.Cut(up, ",")
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", strings.TrimSpace(proto))
		brw.Flush()
	})
}

// TestH2CUpgradeServedAsHTTP11: a request that asks to upgrade to h2c
// reaches the app as plain HTTP/1.1, without Upgrade: h2c or
// HTTP2-Settings (nor Connection tokens naming them), so that no app opens
// HTTP/2 on a connection whose later requests the edge's per-request
// policy would no longer see (issue #32, item 8); a WebSocket upgrade
// reaches the app as through the baseline. The baseline, Go's
// ReverseProxy, passes Upgrade: h2c on (dropping HTTP2-Settings), and a
// lax app switches: there the edge differs from it, on purpose.
func TestH2CUpgradeServedAsHTTP11(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	const settings = "AAMAAABkAARAAAAAAAIAAAAA"
	type answer struct{ app, status string }
	for _, tc := range []struct {
		name, upgrade string
		tunnel        answer // nil: the baseline's
	}{
		{"h2c", "h2c", answer{`Upgrade [] Connection [] HTTP2-Settings []`, "200 OK HTTP/1.1"}},
		{"websocket", "websocket", answer{}},
	} {
		var baseline answer
		for i, h := range hops(t, laxUpgrades(seen), nil) {
			req, _ := http.NewRequest("GET", h.url+"/", nil)
			req.Header.Set("Connection", "Upgrade, HTTP2-Settings")
			req.Header.Set("Upgrade", tc.upgrade)
			req.Header.Set("HTTP2-Settings", settings)
			resp, err := h.client(t, false).Do(req)
			if err != nil {
				t.Fatalf("%s: %s: %v", tc.name, h.name, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := answer{<-seen, resp.Status + " " + string(body)}
			if i == 0 {
				baseline = got
				t.Logf("%s: the baseline: %+v", tc.name, got)
				continue
			}
			want := tc.tunnel
			if want == (answer{}) {
				want = baseline
			}
			if got != want {
				t.Errorf("%s: %s: the app saw %s and answered %q; want %s, %q", tc.name, h.name, got.app, got.status, want.app, want.status)
			}
		}
	}
}

// TestH2CUpgradeSpellings: on the plain HTTP port, an upgrade to h2c in
// any case, alone or beside another protocol, with its Connection tokens
// or without, never reaches the app; the other protocol does.
func TestH2CUpgradeSpellings(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 1)
	e := startPolicyEdge(t, nil)
	e.bindApp(t, "", agent.Endpoint{URL: "http://app"}, laxUpgrades(seen))
	const from = "203.0.113.5:4000"
	for _, tc := range []struct{ hdr, app, status string }{
		{"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n", `Upgrade [] Connection [] HTTP2-Settings []`, "200"},
		{"Connection: upgrade\r\nUpgrade: H2C\r\n", `Upgrade [] Connection [] HTTP2-Settings []`, "200"},
		{"Connection: HTTP2-Settings, Upgrade, X-Hop\r\nX-Hop: 1\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n", `Upgrade [] Connection [] HTTP2-Settings []`, "200"},
		{"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n", `Upgrade [] Connection [] HTTP2-Settings []`, "200"},
		{"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c, websocket\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n", `Upgrade ["websocket"] Connection ["Upgrade"] HTTP2-Settings []`, "101"},
		{"Connection: Upgrade\r\nUpgrade: websocket\r\n", `Upgrade ["websocket"] Connection ["Upgrade"] HTTP2-Settings []`, "101"},
	} {
		resp, _ := sendRaw(t, e.httpAddr, from, nil, "GET / HTTP/1.1\r\nHost: app.example.test\r\n"+tc.hdr+"\r\n", false)
		if app := <-seen; app != tc.app || strconv.Itoa(resp.StatusCode) != tc.status {
			t.Errorf("%q: the app saw %s and answered %d; want %s, %s", tc.hdr, app, resp.StatusCode, tc.app, tc.status)
		}
	}
}
