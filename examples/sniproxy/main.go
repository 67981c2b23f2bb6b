// Command sniproxy is an L4 router for TLS: it reads the server name of each
// connection's ClientHello with sni.Peek, without terminating TLS, and passes
// the untouched bytes to a backend of that name.
//
//	sniproxy -listen 127.0.0.1:8443 \
//	         -route 'app.example.test=127.0.0.1:9001,127.0.0.1:9002' \
//	         -route '*.example.test=127.0.0.1:9003' -default 127.0.0.1:9004
//
// Backends of a name are used round robin; a backend that refuses is skipped
// for a while and the next one of the name is tried. Connections that are
// not TLS, carry no server name or match no route go to -default at once
// (they are closed when there is none); malformed TLS is closed. Half-closes
// are kept both ways. One log line per connection goes to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/pipe"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/sni"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage is printed
		}
		fmt.Fprintln(os.Stderr, "sniproxy:", err)
		os.Exit(2)
	}
}

// routeFlags collects repeated -route name=addr[,addr...] flags.
type routeFlags []string

func (r *routeFlags) String() string     { return strings.Join(*r, " ") }
func (r *routeFlags) Set(v string) error { *r = append(*r, v); return nil }

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("sniproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8443", "address to accept connections on")
	def := fs.String("default", "", "backend for connections that are not TLS or match no route (closed when empty)")
	dialTimeout := fs.Duration("dial-timeout", 5*time.Second, "timeout for connecting to a backend")
	peekTimeout := fs.Duration("peek-timeout", 10*time.Second, "how long a client may take to send its ClientHello")
	var routes routeFlags
	fs.Var(&routes, "route", "`name=addr[,addr...]`: route a server name (or *.wildcard) to backends; repeatable")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	p := &proxy{
		Default:     *def,
		DialTimeout: *dialTimeout,
		Peeker:      sni.Peeker{Timeout: *peekTimeout},
		Logger:      newLogger(stderr),
	}
	for _, r := range routes {
		if err := p.addRoute(r); err != nil {
			return err
		}
	}
	if *def != "" {
		if _, _, err := net.SplitHostPort(*def); err != nil {
			return fmt.Errorf("-default %q: %v", *def, err)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	p.Logger.Info("listening", "addr", ln.Addr().String(), "routes", strings.Join(p.routes.Names(), " "), "default", *def)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		p.Close()
	}()
	err = p.Serve(ln)
	p.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// proxy routes connections by SNI. Its zero value closes every connection.
type proxy struct {
	// Default receives connections that are not TLS, have no server name or
	// match no route. Empty: they are closed.
	Default string
	// DialTimeout bounds each backend dial. Zero: 5 s.
	DialTimeout time.Duration
	// Peeker reads the ClientHello; its zero value uses sni's defaults.
	Peeker sni.Peeker
	// Logger gets one line per connection. Nil: silent.
	Logger *slog.Logger

	routes router.Table[string]

	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// addRoute parses "name=addr[,addr...]" and adds it to the table.
func (p *proxy) addRoute(spec string) error {
	name, addrs, ok := strings.Cut(spec, "=")
	if !ok || addrs == "" {
		return fmt.Errorf("-route %q: want name=addr[,addr...]", spec)
	}
	for _, a := range strings.Split(addrs, ",") {
		a = strings.TrimSpace(a)
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("-route %q: backend %q: %v", spec, a, err)
		}
		if err := p.routes.Add(strings.TrimSpace(name), a); err != nil {
			return fmt.Errorf("-route %q: %w", spec, err)
		}
	}
	return nil
}

// Serve accepts connections on ln until ln or the proxy is closed. It
// returns an error wrapping net.ErrClosed after Close.
func (p *proxy) Serve(ln net.Listener) error {
	if !p.track(ln, nil) {
		ln.Close()
		return fmt.Errorf("sniproxy: %w", net.ErrClosed)
	}
	defer p.untrack(ln, nil)
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: back off and go on.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				p.log().Warn("accept", "err", err, "retry_in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		if !p.track(nil, c) {
			c.Close()
			continue
		}
		go p.handle(c)
	}
}

// Close stops every listener and connection and waits for their goroutines.
// It is safe to call more than once.
func (p *proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for ln := range p.lns {
		ln.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

func (p *proxy) track(ln net.Listener, c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if ln != nil {
		if p.lns == nil {
			p.lns = map[net.Listener]struct{}{}
		}
		p.lns[ln] = struct{}{}
	}
	if c != nil {
		if p.conns == nil {
			p.conns = map[net.Conn]struct{}{}
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
	}
	return true
}

func (p *proxy) untrack(ln net.Listener, c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ln != nil {
		delete(p.lns, ln)
	}
	if c != nil {
		delete(p.conns, c)
		p.wg.Done()
	}
}

func (p *proxy) log() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}

// handle routes one client connection and copies until both sides are done.
func (p *proxy) handle(c net.Conn) {
	defer p.untrack(nil, c)
	start := time.Now()
	attrs := []any{"client", c.RemoteAddr().String()}
	hello, pc, err := p.Peeker.Peek(c)
	var backends []string
	switch {
	case errors.Is(err, sni.ErrNotTLS):
		attrs = append(attrs, "tls", false)
	case err != nil:
		pc.Close()
		p.log().Info("conn", append(attrs, "result", "rejected", "err", err)...)
		return
	default:
		attrs = append(attrs, "sni", hello.ServerName)
		for b := range p.routes.Backends(hello.ServerName) {
			backends = append(backends, b)
		}
	}
	fellBack := len(backends) == 0
	if fellBack && p.Default != "" {
		backends = []string{p.Default}
	}
	var up net.Conn
	for _, b := range backends {
		up, err = net.DialTimeout("tcp", b, cmp(p.DialTimeout, 5*time.Second))
		if err == nil {
			p.routes.Succeed(b)
			attrs = append(attrs, "backend", b)
			break
		}
		p.log().Warn("dial", "backend", b, "err", err)
		if !fellBack {
			p.routes.Fail(b)
		}
	}
	if up == nil {
		pc.Close()
		if err == nil {
			err = errors.New("no route and no default")
		}
		p.log().Info("conn", append(attrs, "result", "closed", "err", err)...)
		return
	}
	// Close the backend too when the proxy is closed.
	if !p.track(nil, up) {
		up.Close()
		pc.Close()
		return
	}
	defer p.untrack(nil, up)
	in, out, err := pipe.Join(pc, up)
	attrs = append(attrs, "bytes_in", in, "bytes_out", out, "duration", time.Since(start).Round(time.Millisecond))
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	p.log().Info("conn", attrs...)
}

// newLogger logs text lines to w.
func newLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func cmp(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
