package inspect

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// recording is an exchange under way: the ResponseWriter that the
// forwarder answers through, beneath its own (which logs), and the
// request body's reader, both of which copy the first bytes into the
// exchange as they pass.
type recording struct {
	in       *Inspector
	w        http.ResponseWriter
	replay   Replayer
	ex       Exchange    // the working copy, published at each change
	reqBody  *teeBody    // nil: no body
	resp     capture     // the response body's first bytes
	replayOf *replayInfo // non-nil for a replay
	header   bool        // the final header is written
	upgrade  bool        // the connection was hijacked: the protocol switched
}

// Replayer sends a replayed request to the app the way the recorded one
// went; a forward.HTTP that records with an Inspector is one. It is
// defined here, where it is used, so that a forwarder depends on the
// inspector and not the other way round.
type Replayer interface {
	// Replay forwards r to the app as it forwards a request from a client,
	// recording it through Record with the Inspector r comes from (which
	// tells from r that it is a replay), and returns once the response has
	// ended; the response itself is discarded: the exchange holds it. It
	// returns an error wrapping http.ErrServerClosed when it forwards no
	// more requests (its Serve returned), and another error when the
	// response broke off. r's context ends the replay early.
	Replay(r *http.Request) error
}

// Record starts recording an exchange, and publishes it: r, a request that
// the caller forwards to the app at to, and the response that the caller
// writes to the returned ResponseWriter rw, which passes it all on to w
// (its flushes and hijack too, through http.ResponseController). r.Body is
// replaced with a reader that copies the body's first bytes as the
// request is forwarded. The caller calls end once the response has ended,
// with aborted set when it broke off (ReverseProxy panics with
// http.ErrAbortHandler then). replay is what sends the request again when
// the inspector's page asks; nil: the exchange cannot be replayed.
func (in *Inspector) Record(w http.ResponseWriter, r *http.Request, to string, replay Replayer) (rw http.ResponseWriter, end func(aborted bool)) {
	in.init()
	rec := &recording{in: in, w: w, replay: replay}
	uri := r.RequestURI
	if uri == "" {
		uri = r.URL.RequestURI()
	}
	x := &rec.ex
	x.Start = time.Now()
	x.Client = r.RemoteAddr
	x.To = to
	x.Method = r.Method
	x.Host = r.Host
	x.URL = uri
	x.Proto = r.Proto
	x.RequestHeader, x.HeaderTruncated = cloneHeader(r.Header, headLimit-len(uri)-len(r.Host))
	if len(uri) > headLimit {
		x.URL = uri[:headLimit]
		x.HeaderTruncated = true
	}
	if ri, ok := r.Context().Value(replayKey{}).(*replayInfo); ok && ri.in == in {
		x.ReplayOf = ri.of
		rec.replayOf = ri
	}
	if r.Body != nil && r.Body != http.NoBody {
		rec.reqBody = &teeBody{rc: r.Body, c: capture{limit: in.bodyLimit, hint: r.ContentLength}}
		r.Body = rec.reqBody
	}
	rec.resp.limit = in.bodyLimit
	in.publish(rec)
	return rec, rec.finish
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

// finish ends the exchange and publishes it: the end func of Record.
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
	if rec.replayOf != nil {
		rec.replayOf.result = e
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
