package sni

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// Relaying a split-mode ECH connection between a client and a backend.

// helloRetryRandom is the random of a ServerHello that is a
// HelloRetryRequest: SHA-256 of "HelloRetryRequest" (RFC 8446, section
// 4.1.3).
var helloRetryRandom = [32]byte{
	0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
	0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
}

const (
	recordTypeChangeCipherSpec uint8 = 20
	recordTypeAlert            uint8 = 21
	typeServerHello            uint8 = 2
	// serverHelloPrefix is as much of a ServerHello as telling a
	// HelloRetryRequest needs: type, length, legacy_version, random.
	serverHelloPrefix = handshakeHeaderLen + 2 + 32
)

// errNotOuter is the error of a client conn given to Wrap that does not
// begin with the outer hello.
var errNotOuter = errors.New("sni: the client conn given to Wrap does not begin with the outer ClientHello")

// TLS alerts sent to the client when its second ClientHello fails.
const (
	alertIllegalParameter uint8 = 47
	alertDecryptError     uint8 = 51
	alertMissingExtension uint8 = 109
)

// Wrap returns client and backend wrapped for a proxy that relays the
// connection in split mode, by copying what it reads from each returned
// conn to the other, both ways at once, as any proxy does:
//
//   - Reading the client conn yields r.Records, in place of the records of
//     the outer hello, then the client's bytes, untouched, with one
//     exception: if the backend answered with a HelloRetryRequest, the
//     client's second ClientHello is decrypted with DecryptRetry and
//     replaced by its inner hello, framed in records with the record
//     version the client used. A read fails if that second hello does not
//     decrypt or is invalid (the error wraps ErrNoECH, ErrMalformed,
//     ErrInvalidName or ErrECHDecrypt), after a fatal alert was written to
//     the client; the proxy then closes both conns.
//   - Reading the backend conn yields the backend's bytes, untouched: the
//     conn looks at the first handshake message to learn whether it is a
//     HelloRetryRequest. A read of the client conn that meets the client's
//     next handshake record waits for that, so both directions must be
//     copied concurrently.
//
// client must yield the outer hello's records next, as the conn Peek
// returns does, with no handshake bytes after the hello in its last record;
// reading the client conn fails otherwise. r must be the result of Decrypt
// (not of DecryptRetry), and DecryptRetry must not be called on it too.
//
// Writes, deadlines, CloseWrite and the addresses pass through; the read
// deadline of the client conn also bounds a read waiting for the backend,
// and a read that times out can be retried with a later deadline. The
// returned conns own client and backend: closing one closes its underlying
// conn, and ends a read of the client conn waiting for the backend. Once
// the handshake is past the point where a HelloRetryRequest can occur (the
// backend's first message), reads go straight to the underlying conns.
func (r *ECHResult) Wrap(client, backend net.Conn) (clientConn, backendConn net.Conn) {
	rel := &echRelay{decided: make(chan struct{}), closed: make(chan struct{})}
	return &echClientConn{Conn: client, res: r, rel: rel, deadlineSet: make(chan struct{}, 1)},
		&echBackendConn{Conn: backend, rel: rel}
}

// echRelay is what the two conns of Wrap share: whether the backend's first
// handshake message was a HelloRetryRequest.
type echRelay struct {
	decideOnce sync.Once
	decided    chan struct{} // closed once hrr is set
	hrr        bool

	closeOnce sync.Once
	closed    chan struct{} // closed when either conn is closed
}

func (rel *echRelay) decide(hrr bool) {
	rel.decideOnce.Do(func() {
		rel.hrr = hrr
		close(rel.decided)
	})
}

func (rel *echRelay) close() { rel.closeOnce.Do(func() { close(rel.closed) }) }

// The states of an echClientConn.
const (
	readOuter   = iota // skipping the records of the outer hello
	watch              // looking for the client's next handshake record
	readRetry          // reading the second ClientHello, after an HRR
	passThrough        // reading the underlying conn
)

// echClientConn is the client side of Wrap.
type echClientConn struct {
	net.Conn
	res *ECHResult
	rel *echRelay

	mu      sync.Mutex // held by Read
	state   int
	out     []byte // bytes to return next
	pending []byte // bytes read from the conn, not yet examined
	skip    int    // bytes of a non-handshake record still to pass on
	err     error  // returned once out is empty

	// The read deadline, for a read that waits for the backend rather
	// than the conn.
	dmu         sync.Mutex
	deadline    time.Time
	deadlineSet chan struct{} // signalled when deadline changes
}

// Read returns the bytes for the backend, as Wrap describes.
func (c *echClientConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.out) == 0 {
		switch {
		case c.err != nil:
			return 0, c.err
		case c.state == passThrough && len(c.pending) > 0:
			c.out, c.pending = c.pending, nil
		case c.state == passThrough:
			return c.Conn.Read(p)
		default:
			if err := c.step(); err != nil {
				if isTimeout(err) {
					return 0, err // the caller may extend the deadline and read on
				}
				c.err = err
			}
		}
	}
	n := copy(p, c.out)
	if c.out = c.out[n:]; len(c.out) == 0 {
		c.out = nil
		if c.state == passThrough {
			c.res = nil // the handshake is past: keep no memory for it
		}
	}
	return n, nil
}

// step moves the state machine on, reading the conn when it needs bytes.
// It sets out, or the state, or returns an error.
func (c *echClientConn) step() error {
	switch c.state {
	case readOuter:
		outer := c.res.Outer
		// At worst, one record per byte of the hello.
		a := assembler{max: max((recordHeaderLen+1)*len(outer.Raw), DefaultMaxBytes)}
		msg, err := c.readHello(&a)
		if err != nil {
			return fmt.Errorf("sni: reading the outer ClientHello: %w", err)
		}
		if !bytes.Equal(msg, outer.Raw) {
			return errNotOuter
		}
		c.out = c.res.Records
		c.pending = c.pending[a.end:]
		c.state = watch
		return nil

	case watch:
		if c.skip > 0 && len(c.pending) > 0 {
			n := min(c.skip, len(c.pending))
			c.out, c.pending = c.pending[:n], c.pending[n:]
			c.skip -= n
			return nil
		}
		select {
		case <-c.rel.decided:
			if !c.rel.hrr {
				c.state = passThrough
				return nil
			}
		default:
		}
		hdr := cryptobyte.String(c.pending)
		var typ uint8
		var version, length uint16
		if c.skip > 0 || !hdr.ReadUint8(&typ) || !hdr.ReadUint16(&version) || !hdr.ReadUint16(&length) {
			return c.fill()
		}
		if typ != recordTypeHandshake {
			// A ChangeCipherSpec, early data, an alert: pass it on.
			c.skip = recordHeaderLen + int(length)
			return nil
		}
		hrr, err := c.wait()
		switch {
		case err != nil:
			return err
		case hrr:
			c.state = readRetry
		default:
			c.state = passThrough
		}
		return nil

	case readRetry:
		a := assembler{max: DefaultMaxBytes}
		msg, err := c.readHello(&a)
		if err != nil {
			return c.abort(fmt.Errorf("sni: reading the second ClientHello: %w", err))
		}
		second, err := parseHello(msg)
		if err != nil {
			return c.abort(fmt.Errorf("sni: second ClientHello: %w", err))
		}
		second.RecordVersion = a.version
		res, err := c.res.DecryptRetry(second)
		if err != nil {
			return c.abort(fmt.Errorf("sni: second ClientHello: %w", err))
		}
		c.out = res.Records
		c.pending = c.pending[a.end:]
		c.state = passThrough
		return nil
	}
	return nil
}

// wait waits for the backend's first message, and reports whether it is a
// HelloRetryRequest. It gives up when either conn is closed, or when the
// read deadline passes.
func (c *echClientConn) wait() (hrr bool, err error) {
	for {
		c.dmu.Lock()
		deadline := c.deadline
		c.dmu.Unlock()
		var expired <-chan time.Time
		var timer *time.Timer
		if !deadline.IsZero() {
			timer = time.NewTimer(time.Until(deadline))
			expired = timer.C
		}
		select {
		case <-c.rel.decided:
			err = nil
		case <-c.rel.closed:
			err = fmt.Errorf("sni: waiting for the backend's ServerHello: %w", net.ErrClosed)
		case <-expired:
			err = fmt.Errorf("sni: waiting for the backend's ServerHello: %w", os.ErrDeadlineExceeded)
		case <-c.deadlineSet:
			err = errDeadlineSet
		}
		if timer != nil {
			timer.Stop()
		}
		if err != errDeadlineSet {
			return err == nil && c.rel.hrr, err
		}
	}
}

// errDeadlineSet tells wait to wait again, with the new read deadline.
var errDeadlineSet = errors.New("read deadline changed")

// fill reads the conn once, appending to pending. At the end of the
// stream, or on an error other than a timeout, it passes on what is
// pending, then the error.
func (c *echClientConn) fill() error {
	if len(c.pending) == cap(c.pending) {
		c.pending = append(make([]byte, 0, max(2*len(c.pending), 4<<10)), c.pending...)
	}
	n, err := c.Conn.Read(c.pending[len(c.pending):cap(c.pending)])
	c.pending = c.pending[:len(c.pending)+n]
	if err != nil && !isTimeout(err) {
		c.out, c.pending = c.pending, nil
	}
	return err
}

// isTimeout reports whether err is a timeout, after which a conn can be
// read again with a later deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// SetReadDeadline sets the read deadline of the client conn, which also
// bounds a read waiting for the backend's first message.
func (c *echClientConn) SetReadDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets the deadlines of the client conn, the read deadline
// as SetReadDeadline does.
func (c *echClientConn) SetDeadline(t time.Time) error {
	c.setDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *echClientConn) setDeadline(t time.Time) {
	c.dmu.Lock()
	c.deadline = t
	c.dmu.Unlock()
	select {
	case c.deadlineSet <- struct{}{}:
	default:
	}
}

// readHello reads, from pending and the conn, the ClientHello whose first
// record starts pending, up to the end of its last record, which must hold
// no handshake bytes after it.
func (c *echClientConn) readHello(a *assembler) ([]byte, error) {
	for {
		msg, err := a.feed(c.pending)
		if err == nil && len(c.pending) >= a.end {
			if a.tail != 0 {
				return nil, fmt.Errorf("%w: %d handshake bytes after the ClientHello in its record", ErrMalformed, a.tail)
			}
			if a.msgAt >= 0 {
				msg = bytes.Clone(msg) // pending is reused
			}
			return msg, nil
		}
		if err != nil && err != ErrIncomplete {
			return nil, err
		}
		if len(c.pending) >= a.max && a.max > 0 {
			return nil, fmt.Errorf("%w: no ClientHello in %d bytes", ErrTooLarge, a.max)
		}
		if len(c.pending) == cap(c.pending) {
			c.pending = append(make([]byte, 0, max(2*len(c.pending), 4<<10)), c.pending...)
		}
		n, rerr := c.Conn.Read(c.pending[len(c.pending):cap(c.pending)])
		c.pending = c.pending[:len(c.pending)+n]
		if rerr != nil && n == 0 {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			return nil, rerr
		}
	}
}

// abort writes the fatal alert that RFC 9849 wants for err to the client,
// and returns err.
func (c *echClientConn) abort(err error) error {
	desc := alertIllegalParameter
	switch {
	case errors.Is(err, ErrNoECH):
		desc = alertMissingExtension
	case errors.Is(err, ErrECHDecrypt):
		desc = alertDecryptError
	case !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidName) && !errors.Is(err, ErrTooLarge):
		return err // the conn failed: no alert
	}
	c.Conn.Write([]byte{recordTypeAlert, 3, 3, 0, 2, 2, desc}) // level fatal(2)
	return err
}

// CloseWrite shuts down the writing side of the client conn, if it has a
// CloseWrite method, as Conn.CloseWrite does.
func (c *echClientConn) CloseWrite() error { return closeWrite(c.Conn) }

// Close closes the client conn, and ends a read waiting for the backend.
func (c *echClientConn) Close() error {
	c.rel.close()
	return c.Conn.Close()
}

// echBackendConn is the backend side of Wrap.
type echBackendConn struct {
	net.Conn
	rel *echRelay

	mu  sync.Mutex  // held by Read until decided
	hrr hrrDetector // guarded by mu
}

// Read reads the backend conn, looking at its first handshake message.
func (c *echBackendConn) Read(p []byte) (int, error) {
	select {
	case <-c.rel.decided:
		return c.Conn.Read(p)
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if decided, hrr := c.hrr.feed(p[:n]); decided {
		c.rel.decide(hrr)
	} else if err != nil {
		c.rel.decide(false) // no ServerHello to come
	}
	return n, err
}

// CloseWrite shuts down the writing side of the backend conn, if it has a
// CloseWrite method, as Conn.CloseWrite does.
func (c *echBackendConn) CloseWrite() error { return closeWrite(c.Conn) }

// Close closes the backend conn, and ends a read of the client conn waiting
// for it.
func (c *echBackendConn) Close() error {
	c.rel.close()
	return c.Conn.Close()
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("sni: CloseWrite on a %T: %w", c, errors.ErrUnsupported)
}

// An hrrDetector reads a server's first bytes, in pieces of any size, until
// it can tell whether its first handshake message is a HelloRetryRequest.
// It keeps only what it needs: the current record header, and the first
// bytes of the handshake message.
type hrrDetector struct {
	hdr  [recordHeaderLen]byte
	nHdr int
	left int // bytes of the current record's body not yet seen
	hs   [serverHelloPrefix]byte
	nHs  int
}

// feed examines the next bytes of the stream. It reports decided once the
// bytes seen so far tell, and then whether the first message is a
// HelloRetryRequest. Anything but a handshake record starting with a
// ServerHello decides: not a HelloRetryRequest.
func (d *hrrDetector) feed(b []byte) (decided, hrr bool) {
	for len(b) > 0 {
		if d.left == 0 {
			n := copy(d.hdr[d.nHdr:], b)
			d.nHdr += n
			b = b[n:]
			if d.nHdr < recordHeaderLen {
				return false, false
			}
			d.nHdr = 0
			s := cryptobyte.String(d.hdr[:])
			var typ uint8
			var version, length uint16
			s.ReadUint8(&typ)
			s.ReadUint16(&version)
			s.ReadUint16(&length)
			if typ != recordTypeHandshake || length == 0 {
				return true, false
			}
			d.left = int(length)
			continue
		}
		n := copy(d.hs[d.nHs:], b[:min(len(b), d.left)])
		d.nHs += n
		d.left -= n
		b = b[n:]
		if d.nHs == len(d.hs) {
			s := cryptobyte.String(d.hs[:])
			var typ uint8
			var random []byte
			s.ReadUint8(&typ)
			s.Skip(3 + 2) // length, legacy_version
			s.ReadBytes(&random, 32)
			return true, typ == typeServerHello && bytes.Equal(random, helloRetryRandom[:])
		}
	}
	return false, false
}
