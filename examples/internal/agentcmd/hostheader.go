package agentcmd

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
)

// hostForwarder forwards an endpoint's requests to its app with the Host
// header its rule says (-host-header): an http.Server reads the requests
// the listener's conns carry (HTTP/1.1, or HTTP/2 with prior knowledge for
// h2c) and an httputil.ReverseProxy hop sends each to the app with that
// Host, the client's in X-Forwarded-Host as the edge set it; a line per
// request. forward.HTTP, which passes each conn's bytes through as they
// come, keeps the client's Host: it serves every endpoint without a rule.
type hostForwarder struct {
	to     target
	tls    *tls.Config // nil: plaintext
	host   string      // the Host the app gets
	logger *slog.Logger
}

// forwardingHeaders are the headers the edge set, which the app must get
// as the edge sent them: ReverseProxy's Rewrite mode takes them out.
var forwardingHeaders = [...]string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// Serve serves l until it is closed; it returns nil then.
func (f hostForwarder) Serve(l net.Listener) error {
	h2c := false
	if ap, ok := l.(interface{ AppProtocol() string }); ok {
		h2c = ap.AppProtocol() == "h2c"
	}
	verbose := false // the endpoint's verbose_errors
	if v, ok := l.(interface{ VerboseErrors() bool }); ok {
		verbose = v.VerboseErrors()
	}
	var protos http.Protocols
	if h2c {
		protos.SetUnencryptedHTTP2(true) // over TLS too: the dial makes it
	} else {
		protos.SetHTTP1(true)
	}
	tlsCfg := f.tls
	if tlsCfg != nil {
		tlsCfg = tlsCfg.Clone()
		if tlsCfg.ServerName == "" {
			tlsCfg.ServerName, _, _ = net.SplitHostPort(f.to.addr)
		}
		tlsCfg.NextProtos = []string{"http/1.1"}
		if h2c {
			tlsCfg.NextProtos = []string{"h2"}
		}
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, f.to.network, f.to.addr)
			if err != nil || tlsCfg == nil {
				return c, err
			}
			tc := tls.Client(c, tlsCfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, fmt.Errorf("TLS to the app at %s: %w", f.to.addr, err)
			}
			return tc, nil
		},
		Protocols:             &protos,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // the app gets the client's Accept-Encoding, the client the app's bytes
	}
	defer transport.CloseIdleConnections()
	urlHost := f.to.addr
	if f.to.network == "unix" {
		urlHost = "localhost"
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", urlHost
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			pr.Out.Host = f.host
			for _, k := range forwardingHeaders {
				if v, ok := pr.In.Header[k]; ok {
					pr.Out.Header[k] = v
				}
			}
		},
		Transport: transport,
		ErrorLog:  slog.NewLogLogger(f.logger.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// As forward.HTTP answers: the detail in the log, under the
			// request ID that the client gets.
			id := newRequestID()
			f.logger.Warn("http error", "code", "app_unreachable", "request_id", id, "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr, "to", f.to.String(), "err", err)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Tunnelkit-Error", "app_unreachable")
			w.Header().Set("Tunnelkit-Request-Id", id)
			w.WriteHeader(http.StatusBadGateway)
			body := "app_unreachable: the app behind the tunnel cannot be reached\nrequest id: " + id + "\n"
			if verbose {
				body += "detail: " + err.Error() + "\n"
			}
			io.WriteString(w, body)
		},
	}
	var sprotos http.Protocols
	sprotos.SetHTTP1(true)
	sprotos.SetUnencryptedHTTP2(h2c)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			lw := &countingWriter{ResponseWriter: w, status: http.StatusOK}
			start := time.Now()
			rp.ServeHTTP(lw, r)
			f.logger.Info("http", "method", r.Method, "path", r.URL.Path, "status", lw.status, "bytes", lw.bytes.Load(), "duration", time.Since(start).Round(time.Millisecond), "client", r.RemoteAddr)
		}),
		Protocols: &sprotos,
		ErrorLog:  slog.NewLogLogger(f.logger.Handler(), slog.LevelDebug),
	}
	gate := gatePooled(l, func(ctx context.Context) error {
		c, err := transport.DialContext(ctx, "", "")
		if err == nil {
			c.Close()
		}
		return err
	})
	defer gate.stop()
	err := srv.Serve(gate)
	if errors.Is(err, forward.ErrHandedOver) {
		// Another forwarder takes the next conns: the requests under way
		// end as they would have, the idle conns close.
		srv.Shutdown(context.Background())
		return nil
	}
	srv.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// newRequestID returns a new random request ID: 16 hex digits.
func newRequestID() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// countingWriter counts a response's status and body bytes for its line.
type countingWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
	bytes  atomic.Int64
}

func (w *countingWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.wrote = true
	n, err := w.ResponseWriter.Write(b)
	w.bytes.Add(int64(n))
	return n, err
}

// Unwrap lets http.ResponseController reach the server's writer (flushes,
// full duplex, upgrades).
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// pooledGate is a listener whose pooled conns (agent.Conn.Pooled) come out
// of Accept only once a connection to the app could be made: a conn whose
// app cannot be reached is rejected before anything reads it, so that the
// edge sends its request to another member of the pool, as forward.HTTP
// does. The probe's connection is closed: the requests go over the
// transport's own. Other conns come out as they come.
type pooledGate struct {
	net.Listener
	probe  func(context.Context) error
	ready  chan net.Conn
	failed chan struct{} // closed once the listener failed, and no probe is under way
	err    error         // the listener's, once failed is closed
	done   chan struct{} // closed by stop
	once   sync.Once
	wg     sync.WaitGroup
}

// pooledProbeTimeout bounds a probe of the app for a pooled conn.
const pooledProbeTimeout = 10 * time.Second

func gatePooled(l net.Listener, probe func(context.Context) error) *pooledGate {
	g := &pooledGate{Listener: l, probe: probe, ready: make(chan net.Conn), failed: make(chan struct{}), done: make(chan struct{})}
	go g.loop()
	return g
}

func (g *pooledGate) loop() {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			g.wg.Wait() // the conns under probe come out first
			g.err = err
			close(g.failed)
			return
		}
		p, ok := c.(interface {
			Pooled() bool
			Reject(error) error
		})
		if !ok || !p.Pooled() {
			g.hand(c)
			continue
		}
		g.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), pooledProbeTimeout)
			defer cancel()
			if err := g.probe(ctx); err != nil {
				p.Reject(err)
				return
			}
			g.hand(c)
		})
	}
}

// hand passes c to Accept, or closes it once the gate is stopped.
func (g *pooledGate) hand(c net.Conn) {
	select {
	case g.ready <- c:
	case <-g.done:
		c.Close()
	}
}

// Accept returns the next conn let through, or the listener's error once
// it failed.
func (g *pooledGate) Accept() (net.Conn, error) {
	select {
	case c := <-g.ready:
		return c, nil
	case <-g.failed:
		return nil, g.err
	}
}

// stop closes the conns that nobody accepts any more, once the server is
// done with the gate.
func (g *pooledGate) stop() { g.once.Do(func() { close(g.done) }) }
