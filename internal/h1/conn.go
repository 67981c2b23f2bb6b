package h1

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Bounds on the requests awaiting their responses.
const (
	maxQueued     = 1024    // requests
	maxQueuedText = 1 << 20 // bytes of their methods and targets
)

// Exchange is one request and its final response as they passed.
type Exchange struct {
	Method, Target string    // the request line's method and request-target, as sent
	Start          time.Time // when the request head had passed
	Status         int       // the final response's status (101 for an upgrade)

	// Bytes counts the response body's bytes, as sent: the chunked
	// framing is not counted. For an upgrade, it counts the bytes of the
	// new protocol that followed the head in the same call to Response:
	// the copier counts those after it.
	Bytes int64

	// Upgraded reports that the connection carries another protocol from
	// here on (a 101, or a 2xx answer to CONNECT): nothing more is parsed.
	Upgraded bool
}

// Conn observes the two directions of one HTTP/1.x connection as a copier
// forwards them, without altering them. Its zero value is ready to use.
//
// Request and Response may be called concurrently with each other (one
// goroutine each); Waiting and Err may be called from any goroutine.
type Conn struct {
	// Done is called once per exchange, when its final response's message
	// has passed whole (for an upgrade: once its head has passed), from the
	// goroutine that called Response or ResponseEOF. It may call Waiting and
	// Err. If nil, exchanges are not reported.
	Done func(Exchange)

	// Head, if not nil, is called with the head of each message as it
	// passes whole, its start line and header fields up to the blank line
	// that ends it: a request's once it is queued to await its response
	// (before its body's bytes), a response's (1xx ones too) before its
	// body's bytes and before Done reports its exchange. head is valid only
	// during the call. A response's is passed from the goroutine that calls
	// Response; a request's from the one that calls Request, or, for
	// requests held after one that may switch protocols, from the one that
	// calls Response, when its answer lets them be parsed. It must not call
	// the Conn's methods.
	Head func(response bool, head []byte)

	// Body, if not nil, is called with the bytes of each message's body as
	// they pass, in order, without the chunked framing (chunk size lines,
	// chunk ends, the trailer section): the bytes that net/http's Body of
	// the message reads. It is called from the goroutine that passes the
	// message's head to Head, after it; p is valid only during the call. It
	// must not call the Conn's methods. The bytes of an upgraded connection
	// are not a body and are not passed.
	Body func(response bool, p []byte)

	stopped atomic.Bool // err != nil or upgraded: every call returns at once

	mu       sync.Mutex
	err      error
	upgraded bool
	queue    []request // requests awaiting their final responses, oldest first
	next     int       // index of the oldest in queue
	text     int       // bytes of the methods and targets in the queue
	started  bool      // a byte of a response to queue[next] has passed
	req      reader    // the request direction; guarded by mu too
	holding  bool      // a request may upgrade: hold the bytes after it until its answer
	paused   bool      // the request direction holds its bytes in pending
	pending  []byte    // request bytes held while paused
	lost     bool      // pending passed its bound and was dropped
	heldAt   time.Time // when bytes were last added to pending

	// The response direction, owned by the goroutine calling Response.
	resp   reader
	cur    request // the request the response in progress answers
	status int     // the status of the response in progress
	eof    bool    // ResponseEOF was called
}

// request is a request awaiting its final response.
type request struct {
	method, target string
	start          time.Time
	upgrade        bool // it may switch protocols (CONNECT, or an Upgrade field)
}

// Request observes bytes that go to the server, in order. Call it from
// one goroutine. Call it before the copier writes p to the server: a
// response observed before its request stops observing with
// ErrUnexpectedResponse, and a fast server can answer before a copier
// that writes first gets to call Request.
//
// After a request that may switch protocols (CONNECT, or one with an
// Upgrade field) has passed whole, the bytes that follow it are held
// (up to 1 MiB) and parsed only once its final response shows that the
// connection still carries HTTP/1.x.
func (c *Conn) Request(p []byte) {
	if c.stopped.Load() || len(p) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.upgraded {
		return
	}
	if c.paused {
		c.hold(p, time.Now())
		return
	}
	c.request(p, time.Time{})
}

// hold keeps request bytes until the answer to a request that may upgrade
// says whether they are HTTP. Past a bound they are dropped, which is an
// error only if they turn out to be HTTP.
func (c *Conn) hold(p []byte, at time.Time) {
	c.heldAt = at
	if c.lost || len(c.pending)+len(p) > maxHead {
		c.lost, c.pending = true, nil
		return
	}
	c.pending = append(c.pending, p...)
}

// request parses request bytes; c.mu is held. at is when they passed, or
// zero for now.
func (c *Conn) request(p []byte, at time.Time) {
	r := &c.req
	for len(p) > 0 {
		st := r.st
		n, ev, err := r.feed(p, true)
		if err != nil {
			c.fail(err)
			return
		}
		if c.Body != nil && n > 0 && st.inBody() {
			c.Body(false, p[:n])
		}
		p = p[n:]
		if ev == evHead {
			if at.IsZero() {
				at = time.Now()
			}
			ended, err := c.requestHead(r.head, at)
			if err == nil && c.Head != nil {
				c.Head(false, r.head)
			}
			r.release()
			if err != nil {
				c.fail(err)
				return
			}
			if ended {
				ev = evEnd
			}
		}
		if ev == evEnd && c.holding {
			c.paused = true
			c.pending = append(c.pending[:0], p...) // p may be a suffix of pending: append moves it
			return
		}
	}
}

// requestHead queues a request whose head passed and sets up its body. It
// reports whether the message ended with its head.
func (c *Conn) requestHead(h []byte, at time.Time) (bool, error) {
	first, rest := line(h)
	method, target, atLeast11, err := requestLine(first)
	if err != nil {
		return false, err
	}
	f, err := readFields(rest, atLeast11)
	if err != nil {
		return false, err
	}
	kind := noBody
	switch {
	case f.te && f.chunked:
		kind = chunkedBody
	case f.te:
		return false, fmt.Errorf("%w: request Transfer-Encoding does not end in chunked", ErrMalformed)
	case f.length > 0:
		kind = lengthBody
	}
	if len(c.queue)-c.next >= maxQueued || c.text+len(first) > maxQueuedText {
		return false, fmt.Errorf("%w: too many requests awaiting their responses", ErrTooLarge)
	}
	// One string holds both the method and the target.
	s := string(first[:len(method)+1+len(target)])
	rq := request{method: s[:len(method)], target: s[len(method)+1:], start: at}
	rq.upgrade = f.upgrade || rq.method == "CONNECT"
	c.holding = c.holding || rq.upgrade
	c.queue = append(c.queue, rq)
	c.text += len(s)
	return c.req.expect(kind, uint64(f.length)), nil
}

// fail stops observing; c.mu is held.
func (c *Conn) fail(err error) {
	if c.err == nil {
		c.err = err
	}
	c.stopped.Store(true)
	c.pending, c.queue = nil, nil
}

// failLocked stops observing.
func (c *Conn) failLocked(err error) {
	c.mu.Lock()
	c.fail(err)
	c.mu.Unlock()
}

// Response observes bytes that came from the server, in order. Call it
// from one goroutine.
func (c *Conn) Response(p []byte) {
	if c.stopped.Load() || c.eof {
		return
	}
	r := &c.resp
	for len(p) > 0 {
		if r.st == inHead && r.n == 0 && !c.begin() {
			return
		}
		st := r.st
		n, ev, err := r.feed(p, false)
		if err != nil {
			c.failLocked(err)
			return
		}
		if c.Body != nil && n > 0 && st.inBody() {
			c.Body(true, p[:n])
		}
		p = p[n:]
		if ev == evHead {
			ended, err := c.responseHead(r.head, len(p))
			r.release()
			if err != nil {
				c.failLocked(err)
				return
			}
			if c.stopped.Load() {
				return
			}
			if ended {
				ev = evEnd
			}
		}
		if ev == evEnd && !c.interim() {
			c.finish()
		}
	}
}

// begin notes that a response head begins, taking the oldest request as
// the one it answers. It reports false if there is none.
func (c *Conn) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.upgraded {
		return false
	}
	if c.next == len(c.queue) {
		c.fail(ErrUnexpectedResponse)
		return false
	}
	c.started = true
	c.cur = c.queue[c.next]
	return true
}

// interim reports whether the response in progress is a 1xx other than
// 101, after which the request still awaits its final response.
func (c *Conn) interim() bool { return c.status/100 == 1 }

// responseHead takes in the head of a response that passed, with after
// bytes after it in the same call to Response, and sets up its body. It
// reports whether the message ended with its head.
func (c *Conn) responseHead(h []byte, after int) (bool, error) {
	first, rest := line(h)
	status, atLeast11, err := statusLine(first)
	if err != nil {
		return false, err
	}
	f, err := readFields(rest, atLeast11)
	if err != nil {
		return false, err
	}
	c.status = status
	if c.Head != nil {
		c.Head(true, h)
	}
	if status == 101 || c.cur.method == "CONNECT" && status/100 == 2 {
		c.mu.Lock()
		c.upgraded = true
		c.stopped.Store(true)
		c.pending, c.queue = nil, nil
		c.mu.Unlock()
		c.done(Exchange{Method: c.cur.method, Target: c.cur.target, Start: c.cur.start, Status: status, Bytes: int64(after), Upgraded: true})
		return true, nil
	}
	if status/100 == 1 {
		return true, nil
	}
	if c.cur.upgrade {
		c.resume()
	}
	kind := untilEOFBody
	switch {
	case c.cur.method == "HEAD" || status == 204 || status == 304:
		kind = noBody
	case f.te && f.chunked:
		kind = chunkedBody
	case f.te:
		// A transfer coding other than chunked last: the body runs until
		// the server closes (RFC 9112, section 6.3).
	case f.length >= 0:
		kind = lengthBody
	}
	return c.resp.expect(kind, uint64(f.length)), nil
}

// resume lets the request direction go on parsing once a request that
// could have switched protocols got a final answer that does not.
func (c *Conn) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = false
	if !c.paused || c.err != nil {
		return
	}
	c.paused = false
	if c.lost {
		c.fail(fmt.Errorf("%w: request bytes held during an upgrade attempt above %d bytes", ErrTooLarge, maxHead))
		return
	}
	p := c.pending
	c.pending = c.pending[:0]
	c.request(p, c.heldAt)
}

// finish reports the exchange whose final response ended.
func (c *Conn) finish() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.queue[c.next] = request{}
	c.next++
	c.text -= len(c.cur.method) + 1 + len(c.cur.target)
	c.started = false
	switch {
	case c.next == len(c.queue):
		c.queue, c.next = c.queue[:0], 0
	case c.next >= 64 && 2*c.next >= len(c.queue):
		n := copy(c.queue, c.queue[c.next:])
		clear(c.queue[n:])
		c.queue, c.next = c.queue[:n], 0
	}
	c.mu.Unlock()
	c.done(Exchange{Method: c.cur.method, Target: c.cur.target, Start: c.cur.start, Status: c.status, Bytes: c.resp.body})
}

func (c *Conn) done(x Exchange) {
	if c.Done != nil {
		c.Done(x)
	}
}

// ResponseEOF observes that the server's side ended (it closed, or shut
// down its sending side). A response whose body runs until then is
// complete, and Done is called for it; one that was cut short stops
// observing with ErrTruncated. Call it from the goroutine that calls
// Response; later calls to Response are ignored.
func (c *Conn) ResponseEOF() {
	if c.stopped.Load() || c.eof {
		return
	}
	c.eof = true
	if c.resp.st == inUntilEOF {
		c.finish()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		c.fail(ErrTruncated)
	}
}

// Waiting reports whether a request head has passed whose response has not
// begun: not a byte of its final response, nor of a 1xx response, has
// passed. Requests held after one that may switch protocols do not count
// until its answer. Once observing has stopped (Err is not nil, or the
// connection was upgraded) it reports false, as nothing more is known.
func (c *Conn) Waiting() bool {
	_, ok := c.Awaited()
	return ok
}

// Awaited returns the oldest request that Waiting counts (whose response
// has not begun), as an Exchange with its Method, Target and Start. ok is
// false when there is none.
func (c *Conn) Awaited() (x Exchange, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.upgraded {
		return Exchange{}, false
	}
	i := c.next
	if c.started {
		i++
	}
	if i >= len(c.queue) {
		return Exchange{}, false
	}
	r := c.queue[i]
	return Exchange{Method: r.method, Target: r.target, Start: r.start}, true
}

// Err returns why observing stopped: a malformed or oversized message, or
// a response without a request, wrapping one of the package's errors. It
// is nil while observing goes on, and after an upgrade. The copier goes on
// forwarding the bytes untouched either way.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
