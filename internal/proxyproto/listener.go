package proxyproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Defaults of a Listener whose fields are zero.
const (
	// DefaultReadTimeout bounds how long a Listener waits for a header.
	DefaultReadTimeout = 10 * time.Second
	// DefaultMaxPending is how many conns a Listener holds at most between
	// accepting them from the inner listener and returning them from Accept.
	DefaultMaxPending = 1024
)

// handshakeBufSize is the buffer a Listener reads headers with: enough for
// any version 1 header and the fixed part of a version 2 one, small enough
// for many pending conns. Bytes read past the header are replayed by Conn.
const handshakeBufSize = 512

// A Listener reads a PROXY protocol header from each conn that its inner
// Listener accepts, and returns conns whose RemoteAddr and LocalAddr are the
// addresses the header carries: the listener of an edge behind a load
// balancer that sends the header.
//
// Headers are read in a goroutine per conn, concurrently, at most MaxPending
// at a time, so that a client that sends nothing delays no other: Accept
// returns conns in the order their headers complete. Every conn Accept
// returns is a *Conn. A conn whose header is invalid, cut short or late is
// closed and never returned (it is logged, and Accept goes on); Required
// says what becomes of a conn without a header.
//
// Set the fields, then call Accept; they must not change afterwards. The
// Listener takes conns from the inner listener from the first call to Accept
// on. A Listener must not be copied after first use. Close must be called,
// as for any listener: it closes the inner one and every conn not yet
// returned by Accept, and waits for the Listener's goroutines.
type Listener struct {
	// Listener is the inner listener, which the Listener owns: Close closes
	// it. It must not be nil.
	net.Listener

	// ReadTimeout bounds the time to read a header, from the moment a conn is
	// accepted, with a read deadline that is cleared before Accept returns
	// the conn. If zero, DefaultReadTimeout (10 s) is used. If negative, no
	// deadline is set: a client that sends nothing then holds one of the
	// MaxPending places until it closes.
	ReadTimeout time.Duration

	// Required, if true, closes every conn that does not start with a valid
	// header (or comes from an untrusted peer, unless PassUntrusted is set):
	// use it when every client comes through a proxy that sends one. If false, a conn that does not
	// start with a header is returned unchanged, with its own addresses and
	// every byte it sent; so is one that closes or times out before a whole
	// signature (a client that waits for the server to speak first is
	// returned after ReadTimeout). A conn that starts with a signature but
	// whose header is invalid is closed either way.
	Required bool

	// Trusted reports whether the header of a conn from the given remote
	// address is to be believed. If nil, every peer is trusted. A conn from
	// an untrusted peer is never read for a header: it is closed if
	// Required is true and PassUntrusted false (only the proxies may
	// connect), and otherwise returned unchanged, at once (but see
	// RejectUntrustedHeaders), so that a header it sends reaches the server
	// as ordinary bytes and the conn keeps its real address: a client
	// cannot choose the address it appears to come from. TrustPrefixes
	// makes one. It is called from the Listener's goroutines, concurrently.
	Trusted func(remote net.Addr) bool

	// PassUntrusted, if true, returns the conns of untrusted peers even
	// when Required is set, with their own addresses: Required then holds
	// for the trusted peers alone. Use it on a listener that clients reach
	// both through the proxies and directly.
	PassUntrusted bool

	// RejectUntrustedHeaders, if true, reads the first bytes of each conn
	// of an untrusted peer that is to be returned, and closes the conn
	// instead (with ErrUntrustedHeader) if they are a PROXY signature,
	// version 1's "PROXY " or version 2's 12 bytes: a client that tries to
	// choose the address it appears to come from, or a proxy missing from
	// Trusted. Any other conn is returned, every byte replayed, as soon as
	// its bytes differ from both signatures (on the first byte, for a TLS
	// hello or "GET"), or when it closes; one that sends nothing within
	// ReadTimeout is closed. Use it only for protocols whose clients speak
	// first, such as HTTP and TLS: a client that waits for the server to
	// speak first would wait until it is closed.
	RejectUntrustedHeaders bool

	// Rejected, if set, is called for each conn the Listener closes without
	// returning it (but for those that Close closes), with the conn's remote
	// address and why: an error wrapping ErrUntrustedHeader,
	// ErrNoProxyHeader, ErrMalformed or ErrTimeout, or another error Read
	// documents. It lets a server count them. It is called from the
	// Listener's goroutines, concurrently, and must not block.
	Rejected func(remote net.Addr, err error)

	// MaxPending is the most conns the Listener holds between accepting them
	// from the inner listener and returning them from Accept, reading their
	// headers or waiting for Accept to be called. While it holds that many,
	// it accepts no more (the kernel queues them). Conns of untrusted peers
	// hold no place, so that no number of strangers can keep the proxies'
	// conns waiting: each is read (see RejectUntrustedHeaders) in a
	// goroutine of its own for at most ReadTimeout, as a server reads any
	// client's first bytes. If zero or negative, DefaultMaxPending (1024)
	// is used.
	MaxPending int

	// Logger receives a record for each conn closed without being returned:
	// Warn for a trusted peer's conn whose header is missing (when Required
	// is set) or malformed, Debug for every conn of an untrusted peer
	// (strangers must not choose how much is logged), and for a client that
	// closed, timed out or failed. If nil, nothing is logged.
	Logger *slog.Logger

	initOnce sync.Once
	ready    chan *Conn    // conns whose header is read, for Accept
	errc     chan error    // errors of the inner Accept, for Accept
	done     chan struct{} // closed by shutdown
	sem      chan struct{} // one token per pending conn
	wg       sync.WaitGroup

	mu      sync.Mutex
	started bool                  // acceptLoop started
	closed  bool                  // shutdown called
	err     error                 // what Accept returns once closed
	pending map[net.Conn]struct{} // conns being read from
}

var (
	_ net.Listener = (*Listener)(nil)
	_ net.Conn     = (*Conn)(nil)
)

func (l *Listener) init() {
	l.initOnce.Do(func() {
		maxPending := l.MaxPending
		if maxPending <= 0 {
			maxPending = DefaultMaxPending
		}
		l.ready = make(chan *Conn)
		l.errc = make(chan error)
		l.done = make(chan struct{})
		l.sem = make(chan struct{}, maxPending)
		l.pending = make(map[net.Conn]struct{})
	})
}

// Accept waits for and returns the next conn whose header is read (or that
// is passed through, see Required and Trusted). It is a *Conn, which the
// caller owns. Errors of the inner listener's Accept are returned as they
// come, one per call, except one wrapping net.ErrClosed (the inner listener
// was closed), which closes the Listener. Once the Listener is closed,
// Accept returns an error wrapping net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	l.init()
	l.mu.Lock()
	if !l.started && !l.closed {
		l.started = true
		l.wg.Add(1)
		go l.acceptLoop()
	}
	l.mu.Unlock()
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.errc:
		return nil, err
	case <-l.done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return nil, l.err
	}
}

// Close closes the inner listener and every conn not yet returned by Accept,
// makes Accept return an error wrapping net.ErrClosed, and waits for the
// Listener's goroutines to end. It returns the inner listener's Close error
// the first time, nil afterwards.
func (l *Listener) Close() error {
	l.init()
	err := l.shutdown(fmt.Errorf("proxyproto: listener closed: %w", net.ErrClosed))
	l.wg.Wait()
	return err
}

// shutdown closes the Listener without waiting; acceptErr is what Accept
// returns afterwards. It returns the inner listener's Close error, the first
// time only.
func (l *Listener) shutdown(acceptErr error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.err = acceptErr
	close(l.done)
	for c := range l.pending {
		c.Close() // unblocks its header read
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// acceptLoop accepts conns from the inner listener and starts a goroutine to
// read the header of each.
func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			return
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.sem
			if errors.Is(err, net.ErrClosed) {
				l.shutdown(err)
				return
			}
			select {
			case l.errc <- err: // Accept's caller decides whether to go on
			case <-l.done:
				return
			}
			continue
		}
		l.wg.Add(1)
		go l.handshake(c)
	}
}

// handshake reads the header of c and hands the resulting Conn to Accept, or
// closes c.
func (l *Listener) handshake(c net.Conn) {
	defer l.wg.Done()
	var once sync.Once
	release := func() { once.Do(func() { <-l.sem }) }
	defer release()
	trusted := l.Trusted == nil || l.Trusted(c.RemoteAddr())
	if !trusted {
		release() // strangers hold no place (see MaxPending)
	}
	pc, err := l.readHeader(c, trusted)
	if err != nil {
		c.Close()
		l.rejected(c, trusted, err)
		return
	}
	select {
	case l.ready <- pc:
	case <-l.done:
		c.Close()
	}
}

// errUntrusted is the reason a conn from an untrusted peer is closed when
// only the proxies may connect.
var errUntrusted = errors.New("proxyproto: peer not trusted to send a PROXY header")

// readHeader reads the header of c, or the first bytes of an untrusted
// peer's, as the fields say. An error means c is to be closed.
func (l *Listener) readHeader(c net.Conn, trusted bool) (*Conn, error) {
	if !trusted {
		switch {
		case l.Required && !l.PassUntrusted:
			return nil, errUntrusted
		case !l.RejectUntrustedHeaders:
			return newConn(c, nil, nil), nil
		}
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, l.err
	}
	l.pending[c] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
	}()

	timeout := l.ReadTimeout
	if timeout == 0 {
		timeout = DefaultReadTimeout
	}
	if timeout > 0 {
		if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return nil, fmt.Errorf("proxyproto: setting the read deadline: %w", err)
		}
	}
	br := bufio.NewReaderSize(c, handshakeBufSize)
	var h *Header
	var err error
	if trusted {
		h, err = l.header(br)
	} else {
		err = noSignature(br)
	}
	if err != nil {
		return nil, err
	}
	if timeout > 0 {
		if err := c.SetReadDeadline(time.Time{}); err != nil {
			return nil, fmt.Errorf("proxyproto: clearing the read deadline: %w", err)
		}
	}
	rest, _ := br.Peek(br.Buffered()) // br is dropped: rest is Conn's to keep
	return newConn(c, h, rest), nil
}

// header reads a trusted peer's header from br: nil and no error for a
// conn without one that is passed through (see Required).
func (l *Listener) header(br *bufio.Reader) (*Header, error) {
	version, err := detect(br)
	switch {
	case err == nil:
		return readVersion(br, version)
	case l.Required:
		return nil, err
	case errors.Is(err, ErrNoProxyHeader), errors.Is(err, ErrTimeout),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return nil, nil // not a header, and nothing consumed
	}
	return nil, err
}

// noSignature checks that an untrusted peer's conn does not start with a
// PROXY signature (see RejectUntrustedHeaders), consuming nothing.
func noSignature(br *bufio.Reader) error {
	version, err := detect(br)
	switch {
	case err == nil:
		return fmt.Errorf("%w (a version %d signature)", ErrUntrustedHeader, version)
	case errors.Is(err, ErrNoProxyHeader), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return nil // its own bytes, or it closed: the server sees them as they are
	}
	return err // silent past ReadTimeout, or a failed read
}

// rejected reports that c, from a trusted peer or not, was closed for err:
// to Rejected, and to the Logger.
func (l *Listener) rejected(c net.Conn, trusted bool, err error) {
	select {
	case <-l.done: // closed by Close, not worth a record
		return
	default:
	}
	if l.Rejected != nil {
		l.Rejected(c.RemoteAddr(), err)
	}
	if l.Logger == nil {
		return
	}
	level := slog.LevelDebug
	if trusted && (errors.Is(err, ErrMalformed) || errors.Is(err, ErrNoProxyHeader)) {
		level = slog.LevelWarn
	}
	msg := "proxyproto: connection closed without a valid PROXY header"
	if !trusted {
		msg = "proxyproto: connection of an untrusted peer closed"
	}
	l.Logger.Log(context.Background(), level, msg, "remote", c.RemoteAddr().String(), "err", err)
}

// TrustPrefixes returns a Listener.Trusted function that trusts the peers
// whose IP address is in one of the prefixes (an IPv4-mapped IPv6 address
// is taken as IPv4, so give IPv4 prefixes for IPv4 peers; zones are ignored).
// It trusts only *net.TCPAddr peers.
func TrustPrefixes(prefixes ...netip.Prefix) func(net.Addr) bool {
	return func(a net.Addr) bool {
		ta, ok := a.(*net.TCPAddr)
		if !ok {
			return false
		}
		ip := ta.AddrPort().Addr().Unmap().WithZone("")
		for _, p := range prefixes {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}
}
