package inspect

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
)

var (
	_ forward.Recorder         = (*Inspector)(nil)
	_ forward.FailureRecording = (*recording)(nil)
)

// recording is an exchange under way, as a forwarder hands it over: the
// forward.Recording that Record returns. The forwarder calls its methods
// one at a time.
type recording struct {
	in       *Inspector
	replay   func(*http.Request) error // nil: the exchange cannot be replayed
	ex       Exchange                  // the working copy, published at each change
	body     bool                      // the request has a body, or may have
	req      capture                   // the request body's first bytes
	resp     capture                   // the response body's first bytes
	replayOf *replayInfo               // non-nil for a replay
	header   bool                      // the final header is known
	failure  string                    // the forwarder answered for the app: its code and why
}

// Record starts recording an exchange, and publishes it: r, a request
// that a forwarder forwards to the app at r.URL.Host, as described by
// [forward.Recorder], which replay sends again when the inspector's page
// asks (nil: the exchange cannot be replayed). A nil *Inspector records
// nothing: Record returns nil.
func (in *Inspector) Record(r *http.Request, replay func(*http.Request) error) forward.Recording {
	if in == nil {
		return nil
	}
	in.init()
	rec := &recording{in: in, replay: replay, body: r.ContentLength != 0}
	uri := r.RequestURI
	if uri == "" && r.URL != nil {
		uri = r.URL.RequestURI()
	}
	x := &rec.ex
	x.Start = time.Now()
	x.Client = r.RemoteAddr
	if r.URL != nil {
		x.To = r.URL.Host
	}
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
	rec.req = capture{limit: in.bodyLimit, hint: r.ContentLength}
	rec.resp.limit = in.bodyLimit
	in.publish(rec)
	return rec
}

// RequestBody copies the request body's first bytes.
func (rec *recording) RequestBody(p []byte) {
	rec.body = true
	rec.req.add(p)
}

// Response notes the final status and header, and publishes them.
func (rec *recording) Response(status int, h http.Header) {
	rec.header = true
	rec.ex.Status = status
	var cut bool
	rec.ex.ResponseHeader, cut = cloneHeader(h, headLimit)
	if n, err := strconv.ParseInt(h.Get("Content-Length"), 10, 64); err == nil {
		rec.resp.hint = n
	}
	rec.ex.HeaderTruncated = rec.ex.HeaderTruncated || cut
	rec.in.publish(rec)
}

// Failed notes the request ID and the detail of the answer the forwarder
// writes for the app, which Response, to come, will show.
func (rec *recording) Failed(requestID string, err error) {
	rec.ex.RequestID = requestID
	if err != nil {
		rec.failure = err.Error()
	}
}

// ResponseBody copies the response body's first bytes.
func (rec *recording) ResponseBody(p []byte) { rec.resp.add(p) }

// End ends the exchange and publishes it: "aborted" when err says it
// broke off, the code and detail of an answer the forwarder wrote for
// the app (see Failed).
func (rec *recording) End(err error) {
	x := &rec.ex
	x.Done = true
	x.Duration = time.Since(x.Start)
	switch {
	case rec.failure != "":
		x.Error = x.ResponseHeader.Get("Tunnelkit-Error") + ": " + rec.failure
	case err != nil:
		x.Error = "aborted"
	case !rec.header:
		// What net/http sends for a handler that wrote nothing.
		x.Status = http.StatusOK
	}
	if rec.body {
		x.RequestBody = rec.req.body()
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
