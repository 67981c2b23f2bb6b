package proxyproto

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// ---- Helpers ----

// hookListener reports each conn its Accept returns.
type hookListener struct {
	net.Listener
	accepted chan net.Addr // buffered
}

func (l *hookListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted <- c.RemoteAddr()
	}
	return c, err
}

// newListener returns a Listener over a new loopback TCP listener, set up by
// configure, closed when the test ends, and the hook on its inner listener.
func newListener(t *testing.T, configure func(*Listener)) (*Listener, *hookListener) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hook := &hookListener{Listener: inner, accepted: make(chan net.Addr, 100)}
	ln := &Listener{Listener: hook}
	if configure != nil {
		configure(ln)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, hook
}

// dial connects to ln and writes first, if any, in one Write. The conn is
// closed when the test ends.
func dial(t *testing.T, ln net.Listener, first []byte) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if len(first) > 0 {
		if _, err := c.Write(first); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

type acceptResult struct {
	c   net.Conn
	err error
}

// acceptAsync calls ln.Accept in a goroutine, which ends when it returns,
// and returns its result on the channel, for wait.
func acceptAsync(ln net.Listener) <-chan acceptResult {
	ch := make(chan acceptResult, 1)
	go func() {
		c, err := ln.Accept()
		ch <- acceptResult{c, err}
	}()
	return ch
}

// wait returns the conn from ch, closed when the test ends, and fails the
// test on an error, or if none comes within 5 seconds (a bound for a failing
// test, never reached by a passing one).
func wait(t *testing.T, ch <-chan acceptResult) *Conn {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Accept: %v", r.err)
		}
		t.Cleanup(func() { r.c.Close() })
		return r.c.(*Conn)
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return")
		return nil
	}
}

// accept calls ln.Accept and returns its conn, closed when the test ends.
func accept(t *testing.T, ln net.Listener) *Conn {
	t.Helper()
	return wait(t, acceptAsync(ln))
}

// header returns a PROXY header of the given version.
func header(t *testing.T, version int, src, dst string) []byte {
	t.Helper()
	h := Header{Version: version, Command: Proxy, Source: ap(src), Destination: ap(dst)}
	b, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// expectClosed fails the test unless the server closes c: a read returns EOF
// or a reset, without any byte.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	guard(t, c)
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	if n != 0 || err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("client read %d bytes, %v; want the server to close the conn", n, err)
	}
}

// ---- Tests ----

// The accepted conn reports the header's addresses, reads every byte after
// the header, by Read and by io.Copy, and writes and half-closes.
func TestListenerHeader(t *testing.T) {
	for _, version := range []int{1, 2} {
		ln, _ := newListener(t, nil)
		payload := make([]byte, 200<<10)
		rand.Read(payload)
		copy(payload, "hello")
		c := dial(t, ln, append(header(t, version, "203.0.113.7:40000", "[2001:db8::1]:443"), payload...))
		c.CloseWrite()

		conn := accept(t, ln)
		if got := conn.RemoteAddr().String(); got != "203.0.113.7:40000" {
			t.Errorf("v%d: RemoteAddr %s, want the header's source", version, got)
		}
		if _, ok := conn.RemoteAddr().(*net.TCPAddr); !ok {
			t.Errorf("v%d: RemoteAddr is a %T, want *net.TCPAddr", version, conn.RemoteAddr())
		}
		// Mixed families: IPv6 on the wire, the source read back unmapped.
		if got := conn.LocalAddr().String(); got != "[2001:db8::1]:443" {
			t.Errorf("v%d: LocalAddr %s, want the header's destination", version, got)
		}
		if h := conn.Header(); h == nil || h.Version != version || h.Command != Proxy {
			t.Errorf("v%d: Header() = %s", version, describe(h))
		}
		if got := conn.NetConn().RemoteAddr().String(); got != c.LocalAddr().String() {
			t.Errorf("v%d: NetConn().RemoteAddr() %s, want the client's %s", version, got, c.LocalAddr())
		}

		guard(t, conn)
		first := make([]byte, 5)
		if _, err := io.ReadFull(conn, first); err != nil || string(first) != "hello" {
			t.Fatalf("v%d: first read %q, %v", version, first, err)
		}
		var rest bytes.Buffer
		if _, err := io.Copy(&rest, conn); err != nil || !bytes.Equal(rest.Bytes(), payload[5:]) {
			t.Errorf("v%d: the payload after the header arrived altered (%d bytes of %d, %v)", version, rest.Len(), len(payload)-5, err)
		}

		// io.Copy to the conn goes through its ReadFrom.
		if n, err := io.Copy(conn, io.LimitReader(strings.NewReader("world"), 5)); n != 5 || err != nil {
			t.Errorf("v%d: io.Copy to the conn: %d, %v", version, n, err)
		}
		if err := conn.CloseWrite(); err != nil {
			t.Errorf("v%d: CloseWrite: %v", version, err)
		}
		guard(t, c)
		if got, err := io.ReadAll(c); err != nil || string(got) != "world" {
			t.Errorf("v%d: client read %q, %v; want world then EOF", version, got, err)
		}
	}
}

// A client that sends nothing, or part of a header, does not delay another
// client's Accept.
func TestListenerSilentClientDoesNotBlock(t *testing.T) {
	ln, hook := newListener(t, func(l *Listener) { l.Required = true })
	accepted := acceptAsync(ln)
	silent := dial(t, ln, nil)
	partial := dial(t, ln, []byte("PROXY TCP4 192.0.2."))
	// Wait until both are in the Listener's hands.
	for range 2 {
		<-hook.accepted
	}
	dial(t, ln, append(header(t, 2, "192.0.2.99:1234", "192.0.2.1:443"), "hi"...))
	conn := wait(t, accepted)
	if got := conn.RemoteAddr().String(); got != "192.0.2.99:1234" {
		t.Errorf("accepted %s, want the client that sent its header", got)
	}
	ln.Close()
	expectClosed(t, silent)
	expectClosed(t, partial)
}

// recordHandler sends every record it handles on a channel.
type recordHandler struct{ records chan slog.Record }

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.records <- r
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

// record returns the next record from ch, or fails the test if none comes
// within 5 seconds.
func record(t *testing.T, ch <-chan slog.Record) slog.Record {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no record logged")
		return slog.Record{}
	}
}

// Required: conns without a valid header are closed (and logged), never
// returned.
func TestListenerRequired(t *testing.T) {
	records := make(chan slog.Record, 10)
	ln, _ := newListener(t, func(l *Listener) {
		l.Required = true
		l.ReadTimeout = time.Second // the other conns' bytes come within it on a busy machine
		l.Logger = slog.New(recordHandler{records})
	})
	accepted := acceptAsync(ln)
	bad := []struct {
		name  string
		first []byte
		level slog.Level
	}{
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), slog.LevelWarn},
		{"malformed v1", []byte("PROXY TCP4 192.0.2.1 192.0.2.2 1 65536\r\nGET /"), slog.LevelWarn},
		{"malformed v2", v2(0x21, 0x11, 1, 2, 3), slog.LevelWarn},
		{"silent, timed out", nil, slog.LevelDebug},
	}
	for _, b := range bad {
		c := dial(t, ln, b.first)
		expectClosed(t, c)
		r := record(t, records)
		if r.Level != b.level {
			t.Errorf("%s: logged at %v, want %v: %s", b.name, r.Level, b.level, r.Message)
		}
	}
	empty := dial(t, ln, nil)
	empty.CloseWrite()
	expectClosed(t, empty)
	record(t, records)

	dial(t, ln, header(t, 1, "192.0.2.7:1000", "192.0.2.1:443"))
	if got := wait(t, accepted).RemoteAddr().String(); got != "192.0.2.7:1000" {
		t.Errorf("first conn accepted: %s, want the only one with a header", got)
	}
}

// Optional: a conn without a header is returned unchanged, with its own
// address; one with a malformed header is closed.
func TestListenerOptional(t *testing.T) {
	ln, _ := newListener(t, func(l *Listener) { l.ReadTimeout = time.Second }) // the other conns' bytes come within it on a busy machine

	// Plain HTTP: passed through, every byte.
	req := "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"
	c := dial(t, ln, []byte(req))
	c.CloseWrite()
	conn := accept(t, ln)
	if conn.Header() != nil || conn.RemoteAddr().String() != c.LocalAddr().String() || conn.LocalAddr().String() != c.RemoteAddr().String() {
		t.Errorf("plain conn: header %s, addresses %s <- %s; want none, the conn's own",
			describe(conn.Header()), conn.LocalAddr(), conn.RemoteAddr())
	}
	guard(t, conn)
	if got, err := io.ReadAll(conn); err != nil || string(got) != req {
		t.Errorf("plain conn read %q, %v; want %q", got, err, req)
	}

	// A malformed header: closed, never returned.
	accepted := acceptAsync(ln)
	expectClosed(t, dial(t, ln, []byte("PROXY TCP4 192.0.2.1 192.0.2.2 1\r\n")))

	// Cut inside the signature, then closed: passed through, with its bytes.
	c = dial(t, ln, []byte("PRO"))
	c.CloseWrite()
	conn = wait(t, accepted)
	guard(t, conn)
	if got, err := io.ReadAll(conn); err != nil || string(got) != "PRO" || conn.Header() != nil {
		t.Errorf("cut conn read %q, %v, header %s; want PRO, no header", got, err, describe(conn.Header()))
	}

	// Closed before any byte: passed through.
	c = dial(t, ln, nil)
	c.CloseWrite()
	conn = accept(t, ln)
	guard(t, conn)
	if got, err := io.ReadAll(conn); err != nil || len(got) != 0 {
		t.Errorf("empty conn read %q, %v", got, err)
	}

	// A client that waits for the server to speak first: passed through
	// after ReadTimeout, its read deadline cleared.
	c = dial(t, ln, nil)
	conn = accept(t, ln)
	if conn.Header() != nil {
		t.Errorf("silent conn has a header %s", describe(conn.Header()))
	}
	conn.Write([]byte("220 ready\r\n"))
	guard(t, c)
	banner := make([]byte, 11)
	if _, err := io.ReadFull(c, banner); err != nil || string(banner) != "220 ready\r\n" {
		t.Fatalf("client read %q, %v", banner, err)
	}
	c.Write([]byte("QUIT"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "QUIT" {
		t.Errorf("server read %q, %v; want QUIT (is a read deadline left behind?)", got, err)
	}

	// And a conn with a header, all the same.
	dial(t, ln, header(t, 2, "[2001:db8::7]:1000", "[2001:db8::1]:443"))
	if got := accept(t, ln).RemoteAddr().String(); got != "[2001:db8::7]:1000" {
		t.Errorf("conn with a header: RemoteAddr %s", got)
	}
}

// An untrusted peer's header is not read: its conn is returned unchanged if
// the header is optional, closed if it is required.
func TestListenerTrusted(t *testing.T) {
	hdr := header(t, 1, "192.0.2.66:6666", "192.0.2.1:443")
	var seen sync.Map
	untrusted := func(a net.Addr) bool {
		seen.Store(a.String(), true)
		return TrustPrefixes(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128"))(a)
	}

	ln, _ := newListener(t, func(l *Listener) { l.Trusted = untrusted })
	c := dial(t, ln, append(bytes.Clone(hdr), "payload"...))
	c.CloseWrite()
	conn := accept(t, ln)
	if conn.Header() != nil || conn.RemoteAddr().String() != c.LocalAddr().String() {
		t.Errorf("untrusted, optional: header %s, RemoteAddr %s; want none, the real %s",
			describe(conn.Header()), conn.RemoteAddr(), c.LocalAddr())
	}
	guard(t, conn)
	if got, err := io.ReadAll(conn); err != nil || string(got) != string(hdr)+"payload" {
		t.Errorf("untrusted, optional: read %q, %v; want the header as plain bytes, then payload", got, err)
	}
	if _, ok := seen.Load(c.LocalAddr().String()); !ok {
		t.Errorf("Trusted was not called with the peer's address %s", c.LocalAddr())
	}

	ln, _ = newListener(t, func(l *Listener) { l.Trusted = untrusted; l.Required = true })
	acceptAsync(ln) // returns when ln is closed
	expectClosed(t, dial(t, ln, hdr))

	ln, _ = newListener(t, func(l *Listener) {
		l.Trusted = TrustPrefixes(netip.MustParsePrefix("127.0.0.0/8"))
		l.Required = true
	})
	dial(t, ln, hdr)
	if got := accept(t, ln).RemoteAddr().String(); got != "192.0.2.66:6666" {
		t.Errorf("trusted: RemoteAddr %s, want the header's source", got)
	}
}

func TestTrustPrefixes(t *testing.T) {
	trust := TrustPrefixes(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32"))
	tests := []struct {
		addr net.Addr
		want bool
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("11.1.2.3"), Port: 1}, false},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::5"), Port: 1}, true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::5"), Port: 1, Zone: "eth0"}, true},
		{&net.TCPAddr{IP: net.ParseIP("2001:db9::5"), Port: 1}, false},
		{&net.UnixAddr{Name: "/tmp/x", Net: "unix"}, false},
	}
	for _, tt := range tests {
		if got := trust(tt.addr); got != tt.want {
			t.Errorf("trust(%v) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// Close unblocks Accept, closes the conns not yet returned, is idempotent
// and leaves no goroutine behind.
func TestListenerClose(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, hook := newListener(t, nil)
	accepted := acceptAsync(ln)
	silent := dial(t, ln, []byte("PROX"))
	for range 1 {
		<-hook.accepted
	}
	// Accept takes the conn whose header is complete; a second one waits.
	dial(t, ln, header(t, 1, "192.0.2.1:1", "192.0.2.2:2"))
	wait(t, accepted)
	errc := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if c != nil {
			c.Close()
		}
		errc <- err
	}()
	if err := ln.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept during Close: %v, want net.ErrClosed", err)
	}
	if c, err := ln.Accept(); c != nil || !errors.Is(err, net.ErrClosed) || !strings.HasPrefix(err.Error(), "proxyproto: ") {
		t.Errorf("Accept after Close: %v, %v; want a proxyproto: error wrapping net.ErrClosed", c, err)
	}
	if err := ln.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	expectClosed(t, silent)
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Error("the inner listener still accepts after Close")
	}
}

// Many conns in every state when Close is called.
func TestListenerCloseBusy(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, hook := newListener(t, func(l *Listener) { l.MaxPending = 4 })
	var clients []*net.TCPConn
	for i := range 10 {
		var first []byte
		if i%2 == 0 {
			first = header(t, 2, "192.0.2.1:1", "192.0.2.2:2")
		}
		clients = append(clients, dial(t, ln, first))
	}
	accepted := acceptAsync(ln) // the loop starts; the other conns wait
	<-hook.accepted
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if r := <-accepted; r.err == nil {
		r.c.Close()
	}
	for _, c := range clients {
		expectClosed(t, c)
	}
}

// Close before any Accept closes the inner listener and starts nothing.
func TestListenerCloseUnused(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, _ := newListener(t, nil)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}

// The inner listener closed by someone else closes the Listener.
func TestListenerInnerClosed(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, _ := newListener(t, nil)
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	ln.Listener.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept: %v, want net.ErrClosed", err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept again: %v, want net.ErrClosed", err)
	}
	ln.Close()
}

// chanListener returns the conns and errors sent to it.
type chanListener struct {
	conns     chan net.Conn
	errs      chan error
	closeOnce sync.Once
	closed    chan struct{}
	onAccept  func() // called before each Accept returns a conn
}

func newChanListener() *chanListener {
	return &chanListener{conns: make(chan net.Conn), errs: make(chan error), closed: make(chan struct{})}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		if l.onAccept != nil {
			l.onAccept()
		}
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// Errors of the inner Accept are returned, one per Accept, and the Listener
// goes on.
func TestListenerAcceptError(t *testing.T) {
	testwait.NoLeak(t, 0)
	inner := newChanListener()
	ln := &Listener{Listener: inner}
	defer ln.Close()
	errTemp := errors.New("too many open files")
	go func() { inner.errs <- errTemp }()
	if _, err := ln.Accept(); err != errTemp {
		t.Errorf("Accept: %v, want the inner error", err)
	}
	client, server := net.Pipe()
	defer client.Close()
	go func() {
		inner.conns <- server
		client.Write(append(header(t, 2, "192.0.2.5:5", "192.0.2.1:1"), "x"...))
	}()
	c, err := ln.Accept()
	if err != nil || c.RemoteAddr().String() != "192.0.2.5:5" {
		t.Fatalf("Accept after an error: %v, %v", c, err)
	}
	defer c.Close()
	if err := c.(*Conn).CloseWrite(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("CloseWrite over net.Pipe: %v, want errors.ErrUnsupported", err)
	}
}

// countConn counts, in its listener's count, the time from being accepted
// to being closed.
type countConn struct {
	net.Conn
	once  sync.Once
	close func()
}

func (c *countConn) Close() error {
	c.once.Do(c.close)
	return c.Conn.Close()
}

// The Listener never holds more than MaxPending conns: it takes the next one
// from the inner listener only once one is gone.
func TestListenerMaxPending(t *testing.T) {
	testwait.NoLeak(t, 0)
	const maxPending, total = 3, 30
	inner := newChanListener()
	var mu sync.Mutex
	open, peak := 0, 0
	inner.onAccept = func() {
		mu.Lock()
		defer mu.Unlock()
		if open >= maxPending {
			t.Errorf("inner Accept called with %d conns held, MaxPending %d", open, maxPending)
		}
		open++
		peak = max(peak, open)
	}
	ln := &Listener{Listener: inner, MaxPending: maxPending, Required: true}
	go ln.Accept() // starts the loop; returns when ln is closed

	closed := make(chan struct{}, total)
	var clients sync.WaitGroup
	for range total {
		client, server := net.Pipe()
		c := &countConn{Conn: server, close: func() {
			mu.Lock()
			open--
			mu.Unlock()
			closed <- struct{}{}
		}}
		inner.conns <- c
		clients.Add(1)
		go func() { // each sends a first byte that is not a header
			defer clients.Done()
			client.Write([]byte("G"))
			client.Close()
		}()
	}
	for range total {
		<-closed
	}
	ln.Close()
	clients.Wait()
	if peak < 1 || peak > maxPending {
		t.Errorf("peak of %d conns held, want 1 to %d", peak, maxPending)
	}
}

// dialFrom connects to ln from the loopback address from (such as
// 127.0.0.2: another peer than the tests' usual 127.0.0.1), and writes
// first, if any. The conn is closed when the test ends.
func dialFrom(t *testing.T, ln net.Listener, from string, first []byte) *net.TCPConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if len(first) > 0 {
		if _, err := c.Write(first); err != nil {
			t.Fatal(err)
		}
	}
	return c.(*net.TCPConn)
}

// rejection is a call of Listener.Rejected.
type rejection struct {
	remote string
	err    error
}

// mixedListener returns a Listener that trusts 127.0.0.2 alone to send a
// header, requires one from it, and passes every other peer through
// (vetting their first bytes when vet), with what it rejects and logs.
func mixedListener(t *testing.T, vet bool, readTimeout time.Duration) (*Listener, *hookListener, chan rejection, chan slog.Record) {
	rejected, records := make(chan rejection, 10), make(chan slog.Record, 10)
	ln, hook := newListener(t, func(l *Listener) {
		l.Trusted = TrustPrefixes(netip.MustParsePrefix("127.0.0.2/32"))
		l.Required = true
		l.PassUntrusted = true
		l.RejectUntrustedHeaders = vet
		l.ReadTimeout = readTimeout
		l.Rejected = func(remote net.Addr, err error) { rejected <- rejection{remote.String(), err} }
		l.Logger = slog.New(recordHandler{records})
	})
	return ln, hook, rejected, records
}

// rejectionOf returns the next call of Rejected, or fails the test if none
// comes within 5 seconds.
func rejectionOf(t *testing.T, ch <-chan rejection) rejection {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("Rejected was not called")
		return rejection{}
	}
}

// A listener that the proxies and direct clients share: the trusted
// proxy's header sets the address, and the proxy must send one; an
// untrusted peer keeps its own address and bytes, but for a PROXY
// signature, which closes its conn at once, reported to Rejected and
// logged at Debug only.
func TestListenerUntrustedVetted(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, _, rejected, records := mixedListener(t, true, time.Second) // the other conns' bytes come within it on a busy machine

	// The trusted proxy, with a header, then without one.
	dialFrom(t, ln, "127.0.0.2", header(t, 2, "203.0.113.7:4000", "192.0.2.1:443"))
	if got := accept(t, ln).RemoteAddr().String(); got != "203.0.113.7:4000" {
		t.Errorf("trusted proxy's conn: RemoteAddr %s, want its header's source", got)
	}
	c := dialFrom(t, ln, "127.0.0.2", []byte("GET / HTTP/1.1\r\n\r\n"))
	expectClosed(t, c)
	if r := rejectionOf(t, rejected); r.remote != c.LocalAddr().String() || !errors.Is(r.err, ErrNoProxyHeader) {
		t.Errorf("trusted proxy's conn without a header: Rejected(%s, %v), want (%s, ErrNoProxyHeader)", r.remote, r.err, c.LocalAddr())
	}
	if r := record(t, records); r.Level != slog.LevelWarn {
		t.Errorf("trusted proxy's conn without a header logged at %v, want WARN", r.Level)
	}

	// Untrusted peers that forge a header, in every way it starts.
	for _, forged := range []struct {
		name  string
		first []byte
	}{
		{"v1", header(t, 1, "203.0.113.7:4000", "192.0.2.1:443")},
		{"v2", header(t, 2, "203.0.113.7:4000", "192.0.2.1:443")},
		{"v1 signature alone", []byte("PROXY ")},
		{"v2 signature alone", sigV2},
	} {
		c := dial(t, ln, forged.first)
		expectClosed(t, c)
		if r := rejectionOf(t, rejected); r.remote != c.LocalAddr().String() || !errors.Is(r.err, ErrUntrustedHeader) {
			t.Errorf("%s from an untrusted peer: Rejected(%s, %v), want (%s, ErrUntrustedHeader)", forged.name, r.remote, r.err, c.LocalAddr())
		}
		if r := record(t, records); r.Level != slog.LevelDebug {
			t.Errorf("%s from an untrusted peer logged at %v, want DEBUG", forged.name, r.Level)
		}
	}

	// Untrusted peers' own bytes: returned as they are, with their
	// addresses, even when they start like a signature.
	hello := append([]byte{0x16, 0x03, 0x01, 0x00, 0x05}, "hello"...)
	for _, first := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		hello,
		[]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
		[]byte("PROPFIND / HTTP/1.1\r\n\r\n"),
		[]byte("PRO"), // then closed
		[]byte("\r\n\r\nGET / HTTP/1.1\r\n\r\n"),
	} {
		c := dial(t, ln, first)
		c.CloseWrite()
		conn := accept(t, ln)
		guard(t, conn)
		got, err := io.ReadAll(conn)
		if err != nil || !bytes.Equal(got, first) || conn.Header() != nil || conn.RemoteAddr().String() != c.LocalAddr().String() {
			t.Errorf("untrusted %q: read %q, %v, header %s, RemoteAddr %s; want its bytes, no header, %s",
				first, got, err, describe(conn.Header()), conn.RemoteAddr(), c.LocalAddr())
		}
	}

	// An untrusted peer that sends nothing: closed after ReadTimeout,
	// logged at Debug.
	c = dial(t, ln, nil)
	expectClosed(t, c)
	if r := rejectionOf(t, rejected); !errors.Is(r.err, ErrTimeout) {
		t.Errorf("silent untrusted peer: Rejected(%s, %v), want ErrTimeout", r.remote, r.err)
	}
	if r := record(t, records); r.Level != slog.LevelDebug {
		t.Errorf("silent untrusted peer logged at %v, want DEBUG", r.Level)
	}
}

// Without RejectUntrustedHeaders, an untrusted peer's conn is returned at
// once, unread, even when Required is set: a header it sends reaches the
// server as bytes, and a server that speaks first is not kept waiting.
func TestListenerUntrustedPassedUnread(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, _, _, _ := mixedListener(t, false, -1) // no deadline: a read would wait for good

	c := dial(t, ln, nil)
	conn := accept(t, ln)
	if conn.Header() != nil || conn.RemoteAddr().String() != c.LocalAddr().String() {
		t.Fatalf("silent untrusted peer: header %s, RemoteAddr %s; want none, %s", describe(conn.Header()), conn.RemoteAddr(), c.LocalAddr())
	}
	conn.Write([]byte("220 ready\r\n"))
	guard(t, c)
	banner := make([]byte, 11)
	if _, err := io.ReadFull(c, banner); err != nil || string(banner) != "220 ready\r\n" {
		t.Fatalf("client read %q, %v", banner, err)
	}

	forged := append(header(t, 1, "203.0.113.7:4000", "192.0.2.1:443"), "payload"...)
	c = dial(t, ln, forged)
	c.CloseWrite()
	conn = accept(t, ln)
	guard(t, conn)
	if got, err := io.ReadAll(conn); err != nil || !bytes.Equal(got, forged) || conn.RemoteAddr().String() != c.LocalAddr().String() {
		t.Errorf("untrusted header: read %q, %v, RemoteAddr %s; want the header as bytes, then payload, from %s", got, err, conn.RemoteAddr(), c.LocalAddr())
	}
}

// Untrusted peers hold no place: with MaxPending 1, a silent stranger
// being vetted does not keep the trusted proxy's conn waiting. Close ends
// the stranger's read.
func TestListenerUntrustedHoldNoPlace(t *testing.T) {
	testwait.NoLeak(t, 0)
	ln, hook, _, _ := mixedListener(t, true, -1)
	ln.MaxPending = 1
	accepted := acceptAsync(ln)
	silent := dial(t, ln, nil)
	<-hook.accepted
	dialFrom(t, ln, "127.0.0.2", header(t, 1, "203.0.113.7:4000", "192.0.2.1:443"))
	if got := wait(t, accepted).RemoteAddr().String(); got != "203.0.113.7:4000" {
		t.Errorf("accepted %s, want the proxy's client", got)
	}
	ln.Close()
	expectClosed(t, silent)
}
