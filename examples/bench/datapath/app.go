//go:build unix

package main

// The app behind every path, and the baselines' hops: a plain
// httputil.ReverseProxy (with or without TLS) and a plain TCP relay.

import (
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
	"google.golang.org/grpc"
)

// helloBody is the small response of the HTTP app.
const helloBody = "hello"

// runApp serves the app on three loopback listeners: HTTP/1.1 (a tiny
// response at /, N bytes at /bytes?n=N), gRPC over h2c (the bench
// service of grpc.go), and a TCP echo that half-closes after its client
// did.
//
//	role app, no arguments
func runApp(ctx context.Context, ctl *benchproc.Control, args []string) error {
	if len(args) > 0 {
		return errors.New("app: no arguments")
	}
	var lns [3]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range lns[:i] {
				l.Close()
			}
			return err
		}
		lns[i] = ln
	}
	var wg sync.WaitGroup
	hs := &http.Server{Handler: appHandler(), ErrorLog: log.New(io.Discard, "", 0)}
	wg.Go(func() { hs.Serve(lns[0]) })
	gs := newGRPCServer()
	wg.Go(func() { gs.Serve(lns[1]) })
	echo := &connSet{}
	wg.Go(func() { serveConns(lns[2], echo, echoConn) })

	ctl.Ready("http="+lns[0].Addr().String(), "grpc="+lns[1].Addr().String(), "echo="+lns[2].Addr().String())
	<-ctx.Done()
	hs.Close()
	gs.Stop()
	lns[2].Close()
	echo.closeAll()
	wg.Wait()
	return nil
}

// appHandler is the HTTP app: "hello" at /, and /bytes?n=N sends N bytes
// with a Content-Length.
func appHandler() http.Handler {
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, helloBody)
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "n: want a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		for n > 0 {
			k := min(n, int64(len(chunk)))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	return mux
}

// echoConn writes back what c sends, through a 32 KiB buffer, and
// half-closes c once c has.
func echoConn(c net.Conn) {
	relayCopy(c, c, make([]byte, 32<<10))
}

// runReverseProxy is the HTTP baseline: one httputil.ReverseProxy hop to
// -to, as a well-tuned stdlib proxy is written (idle connections for every
// client, X-Forwarded headers set). With -tls DIR it serves TLS with the
// run's certificate, HTTP/2 and HTTP/1.1 by ALPN; with -h2c it speaks
// HTTP/2 without TLS to -to (http.Transport with UnencryptedHTTP2), as
// gRPC apps need.
//
//	role rproxy: -to http://ADDR [-tls DIR] [-h2c]
func runReverseProxy(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("rproxy", flag.ContinueOnError)
	to := fs.String("to", "", "the app's URL, http://ADDR")
	tlsDir := fs.String("tls", "", "serve TLS with the certificate in this directory (empty: plain HTTP)")
	h2c := fs.Bool("h2c", false, "speak HTTP/2 without TLS to the app")
	if err := fs.Parse(args); err != nil {
		return err
	}
	target, err := url.Parse(*to)
	if err != nil {
		return err
	}
	tr := &http.Transport{
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	if *h2c {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = &p
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport: tr,
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: rp, ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan error, 1)
	if *tlsDir != "" {
		cert, err := loadCert(*tlsDir)
		if err != nil {
			ln.Close()
			return err
		}
		srv.TLSConfig = newServerTLS(cert)
		go func() { served <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { served <- srv.Serve(ln) }()
	}
	ctl.Ready("addr=" + ln.Addr().String())
	<-ctx.Done()
	srv.Close()
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// runRelay is a hop of the TCP baseline: a plain user-space relay to -to
// that copies each way through a 32 KiB buffer (never splice(2) or
// sendfile: the conns are wrapped so that io.Copy cannot use
// ReadFrom/WriteTo) and passes half-closes on.
//
//	role relay: -to ADDR
func runRelay(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	to := fs.String("to", "", "the address to relay to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	conns := &connSet{}
	var wg sync.WaitGroup
	wg.Go(func() {
		serveConns(ln, conns, func(c net.Conn) {
			up, err := net.Dial("tcp", *to)
			if err != nil {
				return
			}
			if !conns.add(up) {
				up.Close()
				return
			}
			defer conns.remove(up)
			defer up.Close()
			relayConns(c, up)
		})
	})
	ctl.Ready("addr=" + ln.Addr().String())
	<-ctx.Done()
	ln.Close()
	conns.closeAll()
	wg.Wait()
	return nil
}

// relayConns copies a to b and b to a until both ways ended.
func relayConns(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		relayCopy(b, a, make([]byte, 32<<10))
	}()
	relayCopy(a, b, make([]byte, 32<<10))
	<-done
}

// relayCopy copies src to dst through buf until src ends, then
// half-closes dst (or closes it when src failed).
func relayCopy(dst, src net.Conn, buf []byte) {
	_, err := io.CopyBuffer(writerOnly{dst}, readerOnly{src}, buf)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
		cw.CloseWrite()
		return
	}
	dst.Close()
}

// readerOnly and writerOnly hide a conn's ReadFrom and WriteTo from
// io.CopyBuffer, which would otherwise splice and ignore the buffer.
type readerOnly struct{ io.Reader }
type writerOnly struct{ io.Writer }

// connSet holds a server's open conns, to close them at shutdown.
type connSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // handlers started by serveConns
}

// add registers c, or reports false once the set is closed.
func (s *connSet) add(c net.Conn) bool { return s.addHandler(c, false) }

func (s *connSet) addHandler(c net.Conn, handler bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	if handler {
		s.wg.Add(1)
	}
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// closeAll closes every conn, refuses new ones, and waits for the
// handlers that serveConns started.
func (s *connSet) closeAll() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// serveConns accepts ln's conns until it is closed and runs handle for
// each in its own goroutine, closing the conn after.
func serveConns(ln net.Listener, set *connSet, handle func(net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !set.addHandler(c, true) {
			c.Close()
			return
		}
		go func() {
			defer set.wg.Done()
			defer set.remove(c)
			defer c.Close()
			handle(c)
		}()
	}
}

// newGRPCServer returns a gRPC server of the bench service, without TLS.
func newGRPCServer() *grpc.Server {
	s := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	s.RegisterService(&benchService, struct{}{})
	return s
}
