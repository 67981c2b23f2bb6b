package h2

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
)

// Bounds on what a Conn keeps.
const (
	maxStreams     = 10000   // streams open at once
	maxHeaderBlock = 1 << 20 // bytes of one header block, and of a dynamic table
)

// Exchange is one request and its response as they passed on a stream the
// client opened.
type Exchange struct {
	// Stream is the stream's identifier.
	Stream uint32

	// Method and Target are the request's :method and :path, or its
	// :authority for a CONNECT without a :path.
	Method, Target string

	// Start is when the request's header block (HEADERS and its
	// CONTINUATIONs) had passed.
	Start time.Time

	// Status is the final response's :status (not a 1xx), or 0 if the
	// stream was reset before one passed.
	Status int

	// Bytes counts the payload bytes of the server's DATA frames on the
	// stream, without their padding.
	Bytes int64

	// Reset reports that the stream ended with a RST_STREAM from either
	// side rather than with the server's END_STREAM.
	Reset bool
}

// Conn observes the two directions of one HTTP/2 connection as a copier
// forwards them, without altering them. Its zero value is ready to use.
//
// Request and Response may be called concurrently with each other (one
// goroutine each); Err may be called from any goroutine.
type Conn struct {
	// Done is called once per stream the client opened, when the server's
	// side of it ended or either side reset it, from the goroutine that
	// called Request (for a reset from the client) or Response. Calls do
	// not overlap. It may call Err. If nil, exchanges are not reported.
	// Streams still open when observing stops are not reported.
	Done func(Exchange)

	// Header, if not nil, is called with the fields of each header block
	// on a stream the client opened, while Done has not reported it, as
	// the block passes whole: the request's (before its DATA), the
	// response's (1xx ones too, before its DATA and before Done reports
	// the stream), and the trailers of either. Fields are in the order
	// they were sent, pseudo-header fields included, at most 1 MiB of
	// names and values (the fields past it are left out); fields is valid
	// only during the call. end reports that the block's HEADERS frame
	// ended its side of the stream (END_STREAM): a request without a
	// body, say. It is called from the goroutine that passes the block's
	// bytes (Request or Response), and must not call the Conn's methods.
	Header func(stream uint32, response bool, fields []hpack.HeaderField, end bool)

	// Data, if not nil, is called with the payload of each DATA frame on
	// such a stream, without its padding, as its bytes pass (a frame's
	// payload may come in several calls), from the goroutine that passes
	// them: the bytes that net/http's Body of the message reads. p is
	// valid only during the call. It must not call the Conn's methods.
	Data func(stream uint32, response bool, p []byte)

	stopped atomic.Bool // err != nil or the server's side ended: every call returns at once

	mu      sync.Mutex
	err     error
	streams map[uint32]stream // the streams the client opened that are still open
	lastID  uint32            // the highest stream id the client opened

	doneMu sync.Mutex // serializes calls to Done

	req  half // the client's direction, owned by the goroutine calling Request
	resp half // the server's direction, owned by the goroutine calling Response
}

// stream is what is known of an open stream's exchange.
type stream struct {
	method, target string
	start          time.Time
	status         int
	bytes          int64
}

func (s stream) exchange(id uint32, reset bool) Exchange {
	return Exchange{Stream: id, Method: s.method, Target: s.target, Start: s.start, Status: s.status, Bytes: s.bytes, Reset: reset}
}

// Request observes bytes that go to the server, in order, starting with
// the client connection preface. Call it from one goroutine. Call it
// before the copier writes p to the server: a response observed before
// its request stops observing with ErrMalformed, and a fast server can
// answer before a copier that writes first gets to call Request.
func (c *Conn) Request(p []byte) {
	if c.stopped.Load() || len(p) == 0 {
		return
	}
	c.req.client = true
	if err := c.req.feed(c, p); err != nil {
		c.fail(err)
	}
}

// Response observes bytes that came from the server, in order. Call it
// from one goroutine. Call it before the copier writes p to the client, so
// that the settings in them apply to what the client sends next.
func (c *Conn) Response(p []byte) {
	if c.stopped.Load() || len(p) == 0 {
		return
	}
	if err := c.resp.feed(c, p); err != nil {
		c.fail(err)
	}
}

// ResponseEOF observes that the server's side ended (it closed, or shut
// down its sending side). Observing stops, without an error: the
// exchanges still open are not reported, and later calls to Request and
// Response are ignored.
func (c *Conn) ResponseEOF() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped.Store(true)
	c.streams = nil
}

// Err returns why observing stopped: a malformed or oversized frame,
// wrapping one of the package's errors. It is nil while observing goes
// on, and after ResponseEOF. The copier goes on forwarding the bytes
// untouched either way.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail stops observing with err.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !c.stopped.Load() {
		c.err = err
	}
	c.stopped.Store(true)
	c.streams = nil
}

// done reports an exchange; c.mu is not held.
func (c *Conn) done(x Exchange) {
	if c.Done == nil {
		return
	}
	c.doneMu.Lock()
	defer c.doneMu.Unlock()
	c.Done(x)
}

// open takes in a request header block from the client on stream id. It
// reports whether the stream is open: a new one, or one whose trailers
// these are.
func (c *Conn) open(id uint32, f *fields) (bool, error) {
	if id%2 == 0 {
		return false, fmt.Errorf("%w: HEADERS from the client on even stream %d", ErrMalformed, id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped.Load() || id <= c.lastID {
		_, ok := c.streams[id]
		return ok, nil // trailers, or a stream that ended
	}
	if len(c.streams) >= maxStreams {
		return false, fmt.Errorf("%w: more than %d streams open", ErrTooLarge, maxStreams)
	}
	if c.streams == nil {
		c.streams = make(map[uint32]stream)
	}
	target := f.path
	if f.method == "CONNECT" && target == "" {
		target = f.authority
	}
	c.lastID = id
	c.streams[id] = stream{method: f.method, target: target, start: time.Now()}
	return true, nil
}

// tracked reports whether stream id is open and observed.
func (c *Conn) tracked(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.streams[id]
	return ok
}

// respond takes in a response header block from the server on stream id;
// end is its END_STREAM flag. seen, if not nil, is called once the block
// is known to be a valid one of an open stream, before Done may report
// the stream; c.mu is not held then.
func (c *Conn) respond(id uint32, f *fields, end bool, seen func()) error {
	c.mu.Lock()
	s, ok := c.streams[id]
	if id%2 == 1 && id > c.lastID && !c.stopped.Load() {
		c.mu.Unlock()
		return fmt.Errorf("%w: response on stream %d, which the client has not opened", ErrMalformed, id)
	}
	if !ok {
		c.mu.Unlock()
		return nil // a pushed stream, or one that was reset
	}
	if s.status == 0 {
		status, err := strconv.Atoi(f.status)
		if err != nil || status < 100 || status > 999 || len(f.status) != 3 {
			c.mu.Unlock()
			return fmt.Errorf("%w: response on stream %d with :status %q", ErrMalformed, id, f.status)
		}
		if status < 200 {
			c.mu.Unlock()
			if end {
				return fmt.Errorf("%w: interim response ends stream %d", ErrMalformed, id)
			}
			if seen != nil {
				seen()
			}
			return nil
		}
		s.status = status
	}
	if seen != nil {
		c.mu.Unlock()
		seen()
		c.mu.Lock()
		if _, ok := c.streams[id]; !ok {
			c.mu.Unlock()
			return nil // observing stopped meanwhile
		}
	}
	c.update(id, s, end)
	return nil
}

// data counts the n payload bytes of a DATA frame from the server on
// stream id; end is its END_STREAM flag.
func (c *Conn) data(id uint32, n int64, end bool) {
	c.mu.Lock()
	s, ok := c.streams[id]
	if !ok {
		c.mu.Unlock()
		return
	}
	s.bytes += n
	c.update(id, s, end)
}

// update stores s for stream id or, if the stream ended, reports it; c.mu
// is held, and update releases it.
func (c *Conn) update(id uint32, s stream, end bool) {
	if !end {
		c.streams[id] = s
		c.mu.Unlock()
		return
	}
	delete(c.streams, id)
	c.mu.Unlock()
	c.done(s.exchange(id, false))
}

// reset reports stream id, which either side reset.
func (c *Conn) reset(id uint32) {
	c.mu.Lock()
	s, ok := c.streams[id]
	if !ok {
		c.mu.Unlock()
		return
	}
	delete(c.streams, id)
	c.mu.Unlock()
	c.done(s.exchange(id, true))
}
