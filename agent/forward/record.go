package forward

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http2/hpack"

	"github.com/tunnelkit/tunnelkit/internal/h1"
	"github.com/tunnelkit/tunnelkit/internal/h2"
)

// Recorder records the exchanges that an [HTTP] forwards, as their bytes
// pass: to show them, keep them or replay them. An *inspect.Inspector
// (package agent/inspect) is one.
//
// HTTP calls Record from the goroutines that forward a conn's bytes, on
// the request's path: it must not block.
type Recorder interface {
	// Record starts recording an exchange, once its request's head has
	// passed to the app, and returns what records the rest of it; nil:
	// the exchange is not recorded.
	//
	// r is the request as it went to the app: Method, RequestURI (the
	// request-target as sent), Proto, Header (names in canonical form,
	// Host taken out as net/http's server does), Host, ContentLength, and
	// RemoteAddr, the public client's address; URL is the request-target
	// made absolute at the app's address, HTTP.To, with scheme http. Its
	// Body is http.NoBody: the body's bytes go to the Recording as they
	// pass. Its context is done when HTTP.Serve returns, and, for a
	// request that replay sent, is the context of the request replay was
	// given, values included.
	//
	// replay sends a request to the app as HTTP forwards a request from
	// the edge, on a connection of its own, recorded through this
	// Recorder like any other, and returns once its response has ended,
	// with the response discarded. It returns an error wrapping
	// http.ErrServerClosed once Serve has returned, another when the
	// exchange broke off; the request's context ends it early. The
	// request needs Method, URL (a path and query suffice), Host, Header
	// and Body as a client's; replay adds no User-Agent, nor anything
	// else but the framing a Transport writes (Content-Length, or
	// chunking, over HTTP/1.1).
	Record(r *http.Request, replay func(*http.Request) error) Recording
}

// Recording is one exchange under way, as a Recorder records it. HTTP
// calls its methods one at a time, never two at once, in this order:
// RequestBody and, once the final response's head has passed, Response
// and then ResponseBody, as the bytes of each direction pass; then End,
// once. The byte slices are valid only during the call.
type Recording interface {
	// RequestBody takes the next bytes of the request's body, as they
	// pass to the app: without HTTP/1.1's chunked framing or HTTP/2's
	// padding.
	RequestBody(p []byte)

	// Response takes the final response's status (not 1xx, but 101, or
	// any 2xx to CONNECT) and header (names in canonical form), as the
	// app sent them, or as HTTP answered for an app it could not reach
	// (502, the Tunnelkit-Error header saying why).
	Response(status int, header http.Header)

	// ResponseBody takes the next bytes of the response's body, as they
	// pass to the client: without chunked framing or padding.
	ResponseBody(p []byte)

	// End ends the exchange: err is nil when the response passed whole
	// (for an upgraded connection: when the connection ended), and says
	// what broke it off otherwise.
	End(err error)
}

// FailureRecording is a Recording that also keeps why HTTP answered for
// the app (502 app_unreachable, app_error): HTTP calls Failed, on a
// Recording that has it, before Response, with the request ID that the
// answer carries (its Tunnelkit-Request-Id header) and the error, whose
// detail the answer shows only with HTTP.VerboseErrors. An
// *inspect.Inspector's recordings have it.
type FailureRecording interface {
	Recording
	Failed(requestID string, err error)
}

// The errors a Recording's End gets.
var (
	// errBrokeOff: the conn ended, or its bytes stopped being HTTP as
	// the watcher reads them, before the response had passed whole.
	errBrokeOff = errors.New("forward: the exchange broke off before its response ended")

	// errStreamReset: the HTTP/2 stream was reset before its end.
	errStreamReset = errors.New("forward: the stream was reset")
)

// h1Recordings records the exchanges of one HTTP/1.1 conn through the
// Recorder, as its h1.Conn sees them pass: requests and their responses
// in order, one response at a time.
type h1Recordings struct {
	p *httpProxy
	o origin

	mu       sync.Mutex  // serializes the calls to the recordings
	queue    []Recording // the exchanges under way, oldest first; nil ones unrecorded
	answered int         // of queue, the first that have their final response's head
	upgraded []Recording // exchanges that switched protocols: they end with the conn
}

// watch sets obs's hooks to record through rs.
func (rs *h1Recordings) watch(obs *h1.Conn) {
	obs.Head = rs.head
	obs.Body = rs.body
}

func (rs *h1Recordings) head(response bool, b []byte) {
	if !response {
		rec := rs.p.rec.Record(rs.p.request1(b, rs.o), rs.p.replayFunc)
		rs.mu.Lock()
		rs.queue = append(rs.queue, rec)
		rs.mu.Unlock()
		return
	}
	status, header := response1(b)
	if status/100 == 1 && status != http.StatusSwitchingProtocols {
		return // interim
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.answered < len(rs.queue) {
		if rec := rs.queue[rs.answered]; rec != nil {
			rec.Response(status, header)
		}
		rs.answered++
	}
}

// failed tells the exchange that awaits its response that HTTP answers
// it with e.
func (rs *h1Recordings) failed(e appError) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.answered < len(rs.queue) {
		if rec, ok := rs.queue[rs.answered].(FailureRecording); ok {
			rec.Failed(e.id, e.err)
		}
	}
}

// body passes body bytes on: a request's belong to the newest request,
// whose head passed last, a response's to the oldest exchange.
func (rs *h1Recordings) body(response bool, p []byte) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch {
	case len(rs.queue) == 0:
	case response:
		if rec := rs.queue[0]; rec != nil {
			rec.ResponseBody(p)
		}
	default:
		if rec := rs.queue[len(rs.queue)-1]; rec != nil {
			rec.RequestBody(p)
		}
	}
}

// done ends the oldest exchange, whose response passed whole (or
// switched protocols).
func (rs *h1Recordings) done(x h1.Exchange) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if len(rs.queue) == 0 {
		return
	}
	rec := rs.queue[0]
	rs.queue[0] = nil
	rs.queue = rs.queue[1:]
	rs.answered = max(0, rs.answered-1)
	switch {
	case rec == nil:
	case x.Upgraded:
		rs.upgraded = append(rs.upgraded, rec)
	default:
		rec.End(nil)
	}
}

// close ends what is still under way once the conn has ended: an
// upgraded connection whole, any other exchange broken off.
func (rs *h1Recordings) close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, rec := range rs.queue {
		if rec != nil {
			rec.End(errBrokeOff)
		}
	}
	for _, rec := range rs.upgraded {
		rec.End(nil)
	}
	rs.queue, rs.upgraded = nil, nil
}

// h2Recordings records the exchanges of one HTTP/2 connection through the
// Recorder, as its h2.Conn sees them pass, stream by stream.
type h2Recordings struct {
	p *httpProxy
	o origin

	mu      sync.Mutex // serializes the calls to the recordings
	streams map[uint32]*h2Recording
}

// h2Recording is the recording of one stream.
type h2Recording struct {
	rec      Recording // nil: not recorded
	answered bool      // the final response's head passed
}

// watch sets obs's hooks to record through rs.
func (rs *h2Recordings) watch(obs *h2.Conn) {
	obs.Header = rs.header
	obs.Data = rs.data
}

func (rs *h2Recordings) header(id uint32, response bool, fields []hpack.HeaderField, end bool) {
	rs.mu.Lock()
	s := rs.streams[id]
	rs.mu.Unlock()
	if !response {
		if s != nil {
			return // the request's trailers
		}
		s = &h2Recording{rec: rs.p.rec.Record(rs.p.request2(fields, end, rs.o), rs.p.replayFunc)}
		rs.mu.Lock()
		if rs.streams == nil {
			rs.streams = map[uint32]*h2Recording{}
		}
		rs.streams[id] = s
		rs.mu.Unlock()
		return
	}
	if s == nil || s.answered {
		return // a trailer
	}
	status, header := response2(fields)
	if status/100 == 1 {
		return // interim
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s.answered = true
	if s.rec != nil {
		s.rec.Response(status, header)
	}
}

// failed tells the exchange of stream id that HTTP answers it with e.
func (rs *h2Recordings) failed(id uint32, e appError) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if s := rs.streams[id]; s != nil {
		if rec, ok := s.rec.(FailureRecording); ok {
			rec.Failed(e.id, e.err)
		}
	}
}

func (rs *h2Recordings) data(id uint32, response bool, p []byte) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s := rs.streams[id]
	switch {
	case s == nil || s.rec == nil:
	case response:
		s.rec.ResponseBody(p)
	default:
		s.rec.RequestBody(p)
	}
}

// done ends the exchange of the stream x reports.
func (rs *h2Recordings) done(x h2.Exchange) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s := rs.streams[x.Stream]
	delete(rs.streams, x.Stream)
	if s == nil || s.rec == nil {
		return
	}
	if x.Reset {
		s.rec.End(errStreamReset)
	} else {
		s.rec.End(nil)
	}
}

// close ends the exchanges still under way, once the connection ended.
func (rs *h2Recordings) close() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, s := range rs.streams {
		if s.rec != nil {
			s.rec.End(errBrokeOff)
		}
	}
	rs.streams = nil
}

// request1 returns the request whose HTTP/1.1 head is b, as Record gets
// it. A head that the watcher took and net/http does not gets what its
// request line says.
func (p *httpProxy) request1(b []byte, o origin) *http.Request {
	r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		first, _, _ := bytes.Cut(b, []byte("\n"))
		method, rest, _ := strings.Cut(strings.TrimSuffix(string(first), "\r"), " ")
		target, proto, _ := strings.Cut(rest, " ")
		r = &http.Request{Method: method, RequestURI: target, Proto: proto, Header: http.Header{}, ContentLength: -1}
		r.ProtoMajor, r.ProtoMinor, _ = http.ParseHTTPVersion(proto)
	}
	return p.outgoing(r, o)
}

// request2 returns the request whose HTTP/2 header block is fields, as
// Record gets it, its fields as net/http's server reads them; end reports
// that the block ended the stream: the request has no body.
func (p *httpProxy) request2(fields []hpack.HeaderField, end bool, o origin) *http.Request {
	r := &http.Request{Proto: "HTTP/2.0", ProtoMajor: 2, Header: make(http.Header, len(fields)), ContentLength: -1}
	for _, f := range fields {
		switch f.Name {
		case ":method":
			r.Method = f.Value
		case ":path":
			r.RequestURI = f.Value
		case ":authority":
			r.Host = f.Value
		default:
			if !strings.HasPrefix(f.Name, ":") {
				k := http.CanonicalHeaderKey(f.Name)
				r.Header[k] = append(r.Header[k], f.Value)
			}
		}
	}
	if r.Host == "" {
		r.Host = r.Header.Get("Host")
	}
	delete(r.Header, "Host")
	if c := r.Header["Cookie"]; len(c) > 1 {
		// RFC 9113, section 8.2.3, as net/http joins them.
		r.Header["Cookie"] = []string{strings.Join(c, "; ")}
	}
	if n, err := strconv.ParseInt(r.Header.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		r.ContentLength = n
	}
	if end {
		r.ContentLength = 0
	}
	target := r.RequestURI
	if r.Method == "CONNECT" && target == "" {
		target = r.Host
	}
	r.URL, _ = url.ParseRequestURI(target)
	return p.outgoing(r, o)
}

// outgoing completes a request read from a conn as Record gets it.
func (p *httpProxy) outgoing(r *http.Request, o origin) *http.Request {
	u := &url.URL{Scheme: p.app.scheme(), Host: p.app.urlHost()}
	if r.URL != nil {
		u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	}
	r.URL = u
	r.Body = http.NoBody
	r.RemoteAddr = o.client
	return r.WithContext(o.ctx)
}

// response1 returns the status and header of the HTTP/1.1 response head
// b; 0 and nil when net/http does not read it.
func response1(b []byte) (int, http.Header) {
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil)
	if err != nil {
		first, _, _ := bytes.Cut(b, []byte("\n"))
		_, rest, _ := bytes.Cut(first, []byte(" "))
		status, _ := strconv.Atoi(string(bytes.TrimSpace(rest[:min(3, len(rest))])))
		return status, nil
	}
	return resp.StatusCode, resp.Header
}

// response2 returns the status and header of an HTTP/2 response header
// block.
func response2(fields []hpack.HeaderField) (int, http.Header) {
	status := 0
	h := make(http.Header, len(fields))
	for _, f := range fields {
		switch {
		case f.Name == ":status":
			status, _ = strconv.Atoi(f.Value)
		case !strings.HasPrefix(f.Name, ":"):
			k := http.CanonicalHeaderKey(f.Name)
			h[k] = append(h[k], f.Value)
		}
	}
	return status, h
}
