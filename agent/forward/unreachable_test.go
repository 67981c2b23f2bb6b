package forward_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// downAddr returns a loopback address where nothing listens, for now.
func downAddr(t *testing.T) string {
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// proxyHop serves a plain httputil.ReverseProxy to the app at to, and
// returns its address: the hop the forwarder is held to.
func proxyHop(t *testing.T, to string, h2c bool) string {
	u, _ := url.Parse("http://" + to)
	var p http.Protocols
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.Out.Host = pr.In.Host }, Transport: tr, ErrorLog: log.New(io.Discard, "", 0)}
	return serveApp(t, rp, h2c)
}

// TestHTTPAppUnreachableLikeAProxyHop sends requests for an app that is
// down through the forwarder and, beside it, through a plain
// httputil.ReverseProxy hop, in both app protocols. Both answer each with
// 502: a HEAD without a body, and a POST whose 4 MiB body they do not
// want too (the client gets the answer, not a reset); once the app is up,
// the same client's next request reaches it. The forwarder's answers are
// the edge's: Tunnelkit-Error app_unreachable, Tunnelkit-Request-Id, a
// plain-text body saying so in words with the request ID (the dial's
// error, which names the app's address, is the log's), nosniff, Date and
// Content-Length.
func TestHTTPAppUnreachableLikeAProxyHop(t *testing.T) {
	down := downAddr(t)
	type hop struct {
		name string
		h2c  bool
		c    *http.Client
		fwd  bool
	}
	var hops []hop
	for _, m := range modes {
		addr, _ := startForwarder(t, forward.HTTP{To: down, AppProtocol: appProtocol(m.h2c)})
		hops = append(hops, hop{"forwarder/" + m.name, m.h2c, client(t, addr, m.h2c), true},
			hop{"ReverseProxy/" + m.name, m.h2c, client(t, proxyHop(t, down, m.h2c), m.h2c), false})
	}
	big := bytes.Repeat([]byte("x"), 4<<20)
	for _, h := range hops {
		t.Run(h.name+"/down", func(t *testing.T) {
			for _, method := range []string{"GET", "HEAD", "POST"} {
				var body io.Reader
				if method == "POST" {
					body = bytes.NewReader(big)
				}
				req, _ := http.NewRequest(method, "http://app.example.test/x?y=1", body)
				resp, err := h.c.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusBadGateway || method == "HEAD" && len(b) != 0 {
					t.Fatalf("%s: %s, %q, %v; want 502", method, resp.Status, b, err)
				}
				if !h.fwd {
					continue
				}
				hd := resp.Header
				id := hd.Get("Tunnelkit-Request-Id")
				want := "app_unreachable: the app behind the tunnel cannot be reached\nrequest id: " + id + "\n"
				if method == "HEAD" {
					b = []byte(want)
				}
				date, derr := http.ParseTime(hd.Get("Date"))
				if hd.Get("Tunnelkit-Error") != "app_unreachable" || hd.Get("Content-Type") != "text/plain; charset=utf-8" ||
					hd.Get("X-Content-Type-Options") != "nosniff" || derr != nil || time.Since(date) > time.Hour ||
					method != "HEAD" && resp.ContentLength != int64(len(b)) || len(id) != 16 || string(b) != want {
					t.Errorf("%s: header %v, body %q; want the edge's app_unreachable answer, %q", method, hd, b, want)
				}
			}
		})
	}

	// The app comes up where it was down.
	ln, err := net.Listen("tcp", down)
	if err != nil {
		t.Skipf("the app's address was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") }), Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for _, h := range hops {
		t.Run(h.name+"/up", func(t *testing.T) {
			resp, err := h.c.Get("http://app.example.test/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "up" {
				t.Errorf("once the app is up: %s %q", resp.Status, b)
			}
		})
	}
}

// TestHTTPAppUnreachableEndsConn checks the exchange on the wire: an
// HTTP/1.1 conn gets its request's answer, which says it closes, and
// ends, so that the edge's next request comes on a new conn, which tries
// the app again. Bytes that are no request get what a ReverseProxy hop's
// server answers them, 400 or 431, and end the conn so too; the log has a
// request line and a warning for the request only.
func TestHTTPAppUnreachableEndsConn(t *testing.T) {
	down := downAddr(t)
	var log testtools.Buffer
	addr, stop := startForwarder(t, forward.HTTP{To: down, Logger: debugLogger(&log)})
	for _, tc := range []struct {
		req    string
		status int
		code   string
	}{
		{"GET /a HTTP/1.1\r\nHost: app.example.test\r\n\r\nGET /b HTTP/1.1\r\nHost: app.example.test\r\n\r\n", 502, "app_unreachable"},
		{"GARBAGE\r\n\r\n", 400, ""},
		{"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400, ""},
		{"GET / HTTP/1.1\r\n" + strings.Repeat("X-Big: "+strings.Repeat("a", 1000)+"\r\n", 2000) + "\r\n", 431, ""},
	} {
		req := tc.req
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		go io.WriteString(c, req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%.20q: %v", req, err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != tc.status || !resp.Close || resp.Header.Get("Tunnelkit-Error") != tc.code {
			t.Errorf("%.20q: %s, close %v, header %v; want %d, close, Tunnelkit-Error %q", req, resp.Status, resp.Close, resp.Header, tc.status, tc.code)
		}
		if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
			t.Errorf("%.20q: after the answer, %q, %v; want the conn's end", req, rest, err)
		}
		c.Close()
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(log.String(), "msg=http "); n != 1 || !strings.Contains(log.String(), "msg=http method=GET path=/a status=502 ") {
		t.Errorf("log:\n%s\nwant one request line, for /a", log.String())
	}
	if n := regexp.MustCompile(`level=WARN msg="http error" code=app_unreachable request_id=[0-9a-f]{16} method=GET path=/a `).FindAllString(log.String(), -1); len(n) != 1 || strings.Count(log.String(), "level=WARN") != 1 {
		t.Errorf("log:\n%s\nwant one warning, for /a", log.String())
	}
}

// h2Peer speaks HTTP/2 frames over a conn, as a test's client.
type h2Peer struct {
	fr  *http2.Framer
	hb  bytes.Buffer
	enc *hpack.Encoder
}

func newH2Peer(c net.Conn) *h2Peer {
	p := &h2Peer{fr: http2.NewFramer(c, c)}
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.enc = hpack.NewEncoder(&p.hb)
	return p
}

func (p *h2Peer) headers(id uint32, end bool, kv ...string) {
	p.hb.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.hb.Bytes(), EndStream: end, EndHeaders: true})
}

// TestHTTPAppUnreachableH2CStreams checks the exchange on the wire for an
// h2c conn whose app cannot be reached: the first stream gets 502
// app_unreachable; the streams that the client sends before it sees the
// GOAWAY are refused (REFUSED_STREAM: not processed), so that the client
// sends them again on a new conn, which tries the app again; and the
// connection ends as a server ends one gracefully (RFC 9113, section
// 6.8): a GOAWAY that lets the streams in flight come, a PING, and once
// its answer came back, a GOAWAY naming the last stream answered, and the
// end. Each stream gets an answer or a refusal.
func TestHTTPAppUnreachableH2CStreams(t *testing.T) {
	down := downAddr(t)
	addr, _ := startForwarder(t, forward.HTTP{To: down, AppProtocol: "h2c"})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	p := newH2Peer(c)
	p.fr.WriteSettings()
	get := func(path string) []string {
		return []string{":method", "GET", ":scheme", "http", ":authority", "app.example.test", ":path", path}
	}
	p.headers(1, true, get("/1")...)
	p.headers(3, false, ":method", "POST", ":scheme", "http", ":authority", "app.example.test", ":path", "/3")
	p.fr.WriteData(3, false, []byte("some of a body"))
	p.fr.WritePing(false, [8]byte{1})

	var (
		answered = map[uint32]string{} // stream: status and Tunnelkit-Error
		refused  []uint32
		goaways  []uint32
		settings bool
		pinged   bool // our PING came back
		sent5    bool
	)
	for {
		f, err := p.fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("after %v, %v, goaways %v: %v", answered, pinged, goaways, err)
			}
			break
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				settings = true
				p.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			answered[f.StreamID] = f.PseudoValue("status") + " " + headerValue(f, "tunnelkit-error")
		case *http2.PingFrame:
			if !f.IsAck() {
				p.fr.WritePing(true, f.Data)
			} else if f.Data == [8]byte{1} {
				pinged = true
			}
		case *http2.RSTStreamFrame:
			if f.ErrCode == http2.ErrCodeRefusedStream {
				refused = append(refused, f.StreamID)
			} else if f.StreamID != 1 {
				t.Errorf("stream %d reset with %v", f.StreamID, f.ErrCode)
			}
		case *http2.GoAwayFrame:
			goaways = append(goaways, f.LastStreamID)
			if len(goaways) == 1 && !sent5 {
				// A stream in flight as the first GOAWAY went out: the
				// forwarder gets it before the answer to its PING.
				sent5 = true
				p.headers(5, true, get("/5")...)
			}
		}
	}
	want := map[uint32]string{1: "502 app_unreachable"}
	if fmt.Sprint(answered) != fmt.Sprint(want) || fmt.Sprint(refused) != "[3 5]" || !settings || !pinged || fmt.Sprint(goaways) != fmt.Sprint([]uint32{1<<31 - 1, 1}) {
		t.Errorf("answered %v, refused %v, settings %v, ping answered %v, GOAWAYs %v; want %v, [3 5], true, true, [2147483647 1]", answered, refused, settings, pinged, goaways, want)
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.RegularFields() {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

// verboseListener is a listener whose endpoint asks for verbose errors,
// as an *agent.Listener of an agent.Endpoint with VerboseErrors says.
type verboseListener struct{ net.Listener }

func (verboseListener) VerboseErrors() bool { return true }

// TestHTTPAnswersShowNoDetail: every answer the forwarder writes for its
// app (app_unreachable for an app that refuses the connection, or whose
// certificate the forwarder does not trust; app_error for an HTTP/1.1 app
// that closes without answering), over HTTP/1.1 and h2c, shows its client
// what happened in words, with its code and a request ID, and nothing of
// the detail: no address, port, dial or certificate error, no Go error
// text. The warning in the log has the detail under the same ID. With
// VerboseErrors, or a listener whose VerboseErrors method says so, the
// answer shows the detail too.
func TestHTTPAnswersShowNoDetail(t *testing.T) {
	down := downAddr(t)
	tlsApp, _ := serveTLSApp(t, whoami)
	untrusted := &tls.Config{RootCAs: testpki.New(t).Pool}
	closer := func(h2c bool) string {
		return serveApp(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
		}), h2c)
	}
	type answer struct {
		name, to string
		tls      *tls.Config
		code     string
		msg      string
		detail   string // what the log has, and a verbose answer
	}
	cases := func(h2c bool) []answer {
		cs := []answer{
			{"refused", down, nil, "app_unreachable", "the app behind the tunnel cannot be reached", "dial tcp " + down + ": connect: connection refused"},
			{"untrusted certificate", tlsApp, untrusted, "app_unreachable", "the app behind the tunnel cannot be reached", "x509: certificate signed by unknown authority"},
		}
		if !h2c {
			// An h2c app's close reaches the edge as the app did it.
			cs = append(cs, answer{"closes", closer(h2c), nil, "app_error", "the app closed the connection without a whole response", "the app closed the connection before it answered"})
		}
		return cs
	}
	for _, m := range modes {
		for _, tc := range cases(m.h2c) {
			for _, verbose := range []string{"", "field", "listener"} {
				name := m.name + "/" + tc.name
				if verbose != "" {
					name += "/verbose " + verbose
				}
				t.Run(name, func(t *testing.T) {
					var log testtools.Buffer
					f := forward.HTTP{To: tc.to, TLSConfig: tc.tls, AppProtocol: appProtocol(m.h2c), Logger: debugLogger(&log), VerboseErrors: verbose == "field"}
					var ln net.Listener = listenLoopback(t)
					if verbose == "listener" {
						ln = verboseListener{ln}
					}
					stop := serve(t, f, ln)
					resp, err := client(t, ln.Addr().String(), m.h2c).Get("http://app.example.test/x")
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					stop()
					id := resp.Header.Get("Tunnelkit-Request-Id")
					want := tc.code + ": " + tc.msg + "\nrequest id: " + id + "\n"
					if verbose != "" {
						if !strings.HasPrefix(string(b), want+"detail: ") || !strings.Contains(string(b), tc.detail) {
							t.Errorf("%s, body %q; want %q, then the detail, %q", resp.Status, b, want, tc.detail)
						}
						return
					}
					if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != tc.code || len(id) != 16 || string(b) != want {
						t.Errorf("%s, header %v, body %q; want 502 %s, %q", resp.Status, resp.Header, b, tc.code, want)
					}
					if leaks := testtools.Leaks(resp.Header, string(b), []string{tc.to, ln.Addr().String()}, tc.detail); leaks != nil {
						t.Errorf("the answer shows %q: header %v, body %q", leaks, resp.Header, b)
					}
					warn := regexp.MustCompile(`level=WARN msg="http error" code=` + tc.code + ` request_id=` + id + ` method=GET path=/x .* to=` + regexp.QuoteMeta(tc.to) + ` err=.*` + regexp.QuoteMeta(tc.detail))
					if !warn.MatchString(log.String()) {
						t.Errorf("log:\n%s\nwant a warning with request_id=%s and %q", log.String(), id, tc.detail)
					}
				})
			}
		}
	}
}
