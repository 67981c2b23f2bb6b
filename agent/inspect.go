package agent

import (
	"bufio"
	"io"
	"iter"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Inspector records the HTTP exchanges that go through the Forwarders
// whose Inspector field points to it (in HTTP mode), and serves them, as
// an http.Handler, on a web page that updates live and replays a request
// to the app in one click, as it was or edited.
//
// It keeps the newest Max exchanges in a ring: method, URL, host, headers,
// status, timing, the client's address, and the first BodyLimit bytes of
// each body, the request's and the response's. The bodies themselves pass
// through whole and unchanged, as they arrive; the inspector keeps a copy
// of their first bytes only, and drops it with the exchange when Max newer
// ones have come. Several Forwarders may share one Inspector; it is safe
// for concurrent use. The zero value is ready to use; an Inspector must
// not be copied after first use.
//
// Typical use, next to a Forwarder:
//
//	insp := new(agent.Inspector)
//	go http.ListenAndServe("127.0.0.1:4040", insp) // loopback only: see below
//	f := &agent.Forwarder{To: "127.0.0.1:3000", HTTP: true, Inspector: insp}
//	return f.Serve(l)
//
// or under a path of the app's own mux, on loopback:
//
//	mux.Handle("/inspect/", http.StripPrefix("/inspect", insp))
//
// The handler answers, relative to where it is mounted:
//
//	GET  /                            the page: HTML, CSS and JavaScript in one
//	                                  response, which loads nothing else
//	GET  /api/requests                {"max": Max, "version": V, "exchanges": [...]},
//	                                  newest first, without headers or body data
//	GET  /api/requests/{id}           one Exchange, whole
//	GET  /api/events                  server-sent events: an "exchange" event, whose
//	                                  data is the exchange as in the list, each time
//	                                  one arrives or changes (its response's header,
//	                                  its end); the event's id is the version V the
//	                                  change made, and the stream starts after the
//	                                  Last-Event-ID header's version, else after the
//	                                  since=V query parameter's, else now; the
//	                                  changes of 50 ms go together
//	POST /api/requests/{id}/replay    sends the request again and answers with the
//	                                  new Exchange, when its response has ended
//
// A replay sends the recorded request through the Forwarder that recorded
// it, to its To, as the edge would: recorded, with ReplayOf set, and
// logged. Its POST body is empty to send the request as it was, or a
// JSON object whose members, each optional, replace the recorded ones:
//
//	{"method": "PUT", "url": "/path?query", "host": "app.example.com",
//	 "header": {"Name": ["value"]}, "body": "sent as its UTF-8 bytes"}
//
// A request whose body was longer than BodyLimit, or whose exchange is
// not done, replays only with a new body. A replay needs its Forwarder's
// Serve running.
//
// Security: the exchanges hold what clients sent (cookies, tokens), and a
// replay acts as them, so serve the handler on loopback only, never on a
// public address. Against the web pages of the developer's own browser,
// it answers only requests whose Host is an IP address, localhost or a
// name in Hosts (a page on a name that resolves to 127.0.0.1 is not the
// inspector's: DNS rebinding), and it replays only same-origin requests
// (as [http.CrossOriginProtection] tells) that carry the header
// X-Tunnelkit-Inspector: 1, which a page of another origin cannot send
// without the inspector's consent, which it never gives. Its page may not
// be framed.
type Inspector struct {
	// Max is how many exchanges are kept: the newest. Zero: 100. Read
	// when the first exchange is recorded.
	Max int

	// BodyLimit is how many bytes of each body, the request's and the
	// response's, an exchange keeps: the first. Zero: 64 KiB. Negative:
	// none. Read when the first exchange is recorded.
	BodyLimit int

	// Hosts are the host names, besides IP addresses, localhost and
	// *.localhost, that the handler answers under: the names of the
	// loopback address it is served on, if the browser reaches it by
	// another. Nil: none.
	Hosts []string

	once      sync.Once
	bodyLimit int
	mux       *http.ServeMux
	csrf      *http.CrossOriginProtection

	mu      sync.Mutex
	ring    []*entry // the exchange whose ID is id sits at (id-1) % len(ring)
	lastID  uint64
	version uint64                     // counts the changes: each new entry is one
	subs    map[chan struct{}]struct{} // of the event streams, woken by a change
}

// Exchange is an HTTP request that went through a Forwarder, and its
// response, as an [Inspector] recorded them. Its JSON form is what the
// Inspector's API serves.
type Exchange struct {
	// ID numbers the exchanges an Inspector recorded, from 1.
	ID uint64 `json:"id"`

	// ReplayOf is the ID of the exchange that this one replayed. Zero:
	// the request came from a client.
	ReplayOf uint64 `json:"replay_of,omitempty"`

	// Done is set when the response has ended (or failed). Until then
	// Duration is zero, the bodies are not known, and Status, until the
	// response's header is, is zero.
	Done bool `json:"done"`

	// Start is when the request arrived; Duration how long until its
	// response ended.
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"duration_ns"`

	// Client is the address of the client: the public client's, for a
	// request through the tunnel; the inspector page's, for a replay.
	Client string `json:"client"`

	// To is the address of the app: the Forwarder's To.
	To string `json:"to"`

	// Method, Host, URL (the path and query, as sent) and Proto
	// ("HTTP/1.1") are those of the request.
	Method string `json:"method"`
	Host   string `json:"host"`
	URL    string `json:"url"`
	Proto  string `json:"proto"`

	// RequestHeader is the request's header as the Forwarder got it,
	// before it drops the hop-by-hop fields; Host is not in it.
	RequestHeader http.Header `json:"request_header,omitempty"`
	RequestBody   Body        `json:"request_body"`

	// Status is the response's final status (not a 1xx but 101), 502
	// when the Forwarder answered for an app it could not reach (the
	// Tunnelkit-Error header says why), zero when the request failed
	// before any response.
	Status int `json:"status"`

	// ResponseHeader is the response's header as the app sent it.
	ResponseHeader http.Header `json:"response_header,omitempty"`
	ResponseBody   Body        `json:"response_body"`

	// HeaderTruncated is set when the URL and the headers together were
	// longer than the 64 KiB kept of them: fields are missing.
	HeaderTruncated bool `json:"header_truncated,omitempty"`

	// Error, when not empty, says why the exchange failed: "aborted" when
	// the response broke off (the app's side or the client's ended in
	// the middle of it).
	Error string `json:"error,omitempty"`
}

// Body is what an Exchange keeps of a request's or response's body: the
// first bytes, up to the Inspector's BodyLimit.
type Body struct {
	// Data holds the first bytes of the body (base64 in JSON).
	Data []byte `json:"data,omitempty"`

	// Size counts the body's bytes that went through, all of them.
	Size int64 `json:"size"`

	// Truncated is set when Data holds fewer bytes than Size.
	Truncated bool `json:"truncated,omitempty"`
}

const (
	defaultInspectorMax = 100
	defaultBodyLimit    = 64 << 10
	// headLimit bounds what an exchange keeps of the URL and headers.
	headLimit = 64 << 10
)

func (in *Inspector) init() {
	in.once.Do(func() {
		n := in.Max
		if n <= 0 {
			n = defaultInspectorMax
		}
		in.ring = make([]*entry, n)
		switch {
		case in.BodyLimit == 0:
			in.bodyLimit = defaultBodyLimit
		case in.BodyLimit > 0:
			in.bodyLimit = in.BodyLimit
		}
		in.subs = map[chan struct{}]struct{}{}
		in.initHandler()
	})
}

// Exchanges returns the exchanges kept, newest first. Their headers and
// Data are shared: they must not be modified.
func (in *Inspector) Exchanges() []Exchange {
	in.init()
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Exchange, 0, len(in.ring))
	for e := range in.newestFirst() {
		out = append(out, e.ex)
	}
	return out
}

// entry is an exchange as the ring holds it. It does not change once
// published: a change publishes a new entry, which takes the old one's
// place if it is still there.
type entry struct {
	ex      Exchange
	version uint64     // the change that made it
	proxy   *httpProxy // the handler of the Forwarder that recorded it, which replays it
	body    bool       // the request has a body, which the exchange holds once done
}

// summary is the exchange without its headers and body data: what the
// list and the events carry.
func (e *entry) summary() Exchange {
	x := e.ex
	x.RequestHeader, x.ResponseHeader = nil, nil
	x.RequestBody.Data, x.ResponseBody.Data = nil, nil
	return x
}

// newestFirst yields the entries of the ring, newest first. in.mu is held.
func (in *Inspector) newestFirst() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		n := uint64(len(in.ring))
		for id := in.lastID; id > 0 && id+n > in.lastID; id-- {
			if e := in.ring[(id-1)%n]; e != nil && e.ex.ID == id && !yield(e) {
				return
			}
		}
	}
}

// lookup returns the entry of the exchange id, or nil when it is not kept.
func (in *Inspector) lookup(id uint64) *entry {
	in.mu.Lock()
	defer in.mu.Unlock()
	if id == 0 || len(in.ring) == 0 {
		return nil
	}
	if e := in.ring[(id-1)%uint64(len(in.ring))]; e != nil && e.ex.ID == id {
		return e
	}
	return nil
}

// publish puts rec's exchange in the ring as it is now, under a new ID
// when it has none, and wakes the event streams. It returns the entry.
func (in *Inspector) publish(rec *recording) *entry {
	in.mu.Lock()
	defer in.mu.Unlock()
	if rec.ex.ID == 0 {
		in.lastID++
		rec.ex.ID = in.lastID
	}
	in.version++
	e := &entry{ex: rec.ex, version: in.version, proxy: rec.proxy, body: rec.reqBody != nil}
	slot := &in.ring[(e.ex.ID-1)%uint64(len(in.ring))]
	// An exchange that newer ones pushed out stays out.
	if *slot == nil || (*slot).ex.ID <= e.ex.ID {
		*slot = e
	}
	for ch := range in.subs {
		select {
		case ch <- struct{}{}:
		default: // already woken
		}
	}
	return e
}

// recording is an exchange under way: the ResponseWriter that the
// Forwarder's proxy answers through, beneath its loggingWriter, and the
// request body's reader, both of which copy the first bytes into the
// exchange as they pass.
type recording struct {
	in      *Inspector
	w       http.ResponseWriter
	proxy   *httpProxy
	ex      Exchange    // the working copy, published at each change
	reqBody *teeBody    // nil: no body
	resp    capture     // the response body's first bytes
	replay  *replayInfo // non-nil for a replay
	header  bool        // the final header is written
	upgrade bool        // the connection was hijacked: the protocol switched
}

// begin starts recording r, which p forwards, and publishes it. r's body
// becomes a reader that copies its first bytes; the caller answers
// through the returned recording, and calls end when done.
func (in *Inspector) begin(p *httpProxy, w http.ResponseWriter, r *http.Request) *recording {
	in.init()
	rec := &recording{in: in, w: w, proxy: p}
	uri := r.RequestURI
	if uri == "" {
		uri = r.URL.RequestURI()
	}
	x := &rec.ex
	x.Start = time.Now()
	x.Client = r.RemoteAddr
	x.To = p.to
	x.Method = r.Method
	x.Host = r.Host
	x.URL = uri
	x.Proto = r.Proto
	x.RequestHeader, x.HeaderTruncated = cloneHeader(r.Header, headLimit-len(uri)-len(r.Host))
	if len(uri) > headLimit {
		x.URL = uri[:headLimit]
		x.HeaderTruncated = true
	}
	if ri, ok := r.Context().Value(replayKey{}).(*replayInfo); ok {
		x.ReplayOf = ri.of
		rec.replay = ri
	}
	if r.Body != nil && r.Body != http.NoBody {
		rec.reqBody = &teeBody{rc: r.Body, c: capture{limit: in.bodyLimit, hint: r.ContentLength}}
		r.Body = rec.reqBody
	}
	rec.resp.limit = in.bodyLimit
	in.publish(rec)
	return rec
}

func (rec *recording) Header() http.Header { return rec.w.Header() }

// WriteHeader notes the final status and header, and publishes them.
func (rec *recording) WriteHeader(code int) {
	if !rec.header && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		rec.writeHeader(code)
	}
	rec.w.WriteHeader(code)
}

func (rec *recording) writeHeader(code int) {
	rec.header = true
	rec.ex.Status = code
	var cut bool
	rec.ex.ResponseHeader, cut = cloneHeader(rec.w.Header(), headLimit)
	if n, err := strconv.ParseInt(rec.ex.ResponseHeader.Get("Content-Length"), 10, 64); err == nil {
		rec.resp.hint = n
	}
	rec.ex.HeaderTruncated = rec.ex.HeaderTruncated || cut
	rec.in.publish(rec)
}

func (rec *recording) Write(b []byte) (int, error) {
	if !rec.header {
		rec.writeHeader(http.StatusOK)
	}
	n, err := rec.w.Write(b)
	rec.resp.add(b[:n])
	return n, err
}

// Hijack hands over the client's connection, after the app switched
// protocols (ReverseProxy writes the 101 response on it), and publishes
// the switch.
func (rec *recording) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil && !rec.header {
		rec.upgrade = true
		rec.header = true
		rec.ex.Status = http.StatusSwitchingProtocols
		rec.in.publish(rec)
	}
	return c, brw, err
}

// Unwrap gives http.ResponseController the server's ResponseWriter, for
// flushes.
func (rec *recording) Unwrap() http.ResponseWriter { return rec.w }

// end finishes the exchange and publishes it: deferred by the proxy's
// ServeHTTP, it sees the panic with which ReverseProxy aborts a response
// that broke off, and lets it go on.
func (rec *recording) end() {
	if v := recover(); v != nil {
		rec.finish(true)
		panic(v)
	}
	rec.finish(false)
}

func (rec *recording) finish(aborted bool) {
	x := &rec.ex
	x.Done = true
	x.Duration = time.Since(x.Start)
	if rec.upgrade {
		// The 101 response's header, which ReverseProxy set after the
		// hijack.
		var cut bool
		x.ResponseHeader, cut = cloneHeader(rec.w.Header(), headLimit)
		x.HeaderTruncated = x.HeaderTruncated || cut
	}
	if aborted {
		x.Error = "aborted"
	} else if !rec.header {
		// What net/http sends for a handler that wrote nothing.
		x.Status = http.StatusOK
	}
	if rec.reqBody != nil {
		x.RequestBody = rec.reqBody.seal()
	}
	x.ResponseBody = rec.resp.body()
	e := rec.in.publish(rec)
	if rec.replay != nil {
		rec.replay.result = e
	}
}

// capture keeps the first limit bytes of a body, and counts them all.
type capture struct {
	data  []byte
	size  int64
	limit int
	hint  int64 // the body's length, when known: the capture's, up to limit
}

func (c *capture) add(b []byte) {
	c.size += int64(len(b))
	room := c.limit - len(c.data)
	if room <= 0 || len(b) == 0 {
		return
	}
	b = b[:min(room, len(b))]
	if len(c.data)+len(b) > cap(c.data) {
		// Grow to at most limit, which append could pass, and at once to
		// the length the body announced.
		d := make([]byte, len(c.data), min(c.limit, max(2*cap(c.data), len(c.data)+len(b), 512, int(min(c.hint, int64(c.limit))))))
		copy(d, c.data)
		c.data = d
	}
	c.data = append(c.data, b...)
}

func (c *capture) body() Body {
	return Body{Data: c.data, Size: c.size, Truncated: c.size > int64(len(c.data))}
}

// teeBody is a request body that copies its first bytes as it is read:
// by the transport's goroutine, which may still read after the handler
// ended.
type teeBody struct {
	rc     io.ReadCloser
	mu     sync.Mutex
	c      capture
	sealed bool // the exchange took the capture: no more changes
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.mu.Lock()
		if !b.sealed {
			b.c.add(p[:n])
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *teeBody) Close() error { return b.rc.Close() }

// seal returns what was read, and stops the copying.
func (b *teeBody) seal() Body {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sealed = true
	return b.c.body()
}

// cloneHeader copies h, without the fields that have no value (the
// proxy's marks for headers the server must not add), keeping at most
// limit bytes of names and values; cut reports fields left out.
func cloneHeader(h http.Header, limit int) (c http.Header, cut bool) {
	nv := 0
	for _, vv := range h {
		nv += len(vv)
	}
	if nv == 0 {
		return nil, false
	}
	c = make(http.Header, len(h))
	all := make([]string, 0, nv) // one allocation for the values, as Header.Clone
	size := 0
	for k, vv := range h {
		if len(vv) == 0 {
			continue
		}
		n := 0
		for _, v := range vv {
			if size+len(k)+len(v) > limit {
				cut = true
				break
			}
			size += len(k) + len(v)
			n++
		}
		if n == 0 {
			continue
		}
		all = append(all, vv[:n]...)
		c[k] = all[len(all)-n : len(all) : len(all)]
	}
	return c, cut
}
