//go:build unix

package main

// The Go load generators: each run is a process of its own (role load,
// -kind KIND), which prints one "result {json}" line and exits.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchpki"
	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
	"google.golang.org/grpc"
)

// loadResult is what a load measured. Rates come from Ops or Bytes over
// Elapsed; latencies are of single operations.
type loadResult struct {
	Ops     int64         `json:"ops"`   // requests, calls, round trips, connections
	Bytes   int64         `json:"bytes"` // payload bytes moved one way
	Elapsed time.Duration `json:"elapsed"`
	P50     time.Duration `json:"p50,omitempty"`
	P99     time.Duration `json:"p99,omitempty"`
	IdleP50 time.Duration `json:"idle_p50,omitempty"` // interactive: before the bulk stream started
	IdleP99 time.Duration `json:"idle_p99,omitempty"`

	Tool string        `json:"-"` // what generated the load: wrk, h2load, go
	CPU  time.Duration `json:"-"` // the load process's CPU time
}

// rate returns operations per second.
func (r loadResult) rate() float64 { return float64(r.Ops) / r.Elapsed.Seconds() }

// mbps returns megabytes (10^6) per second.
func (r loadResult) mbps() float64 { return float64(r.Bytes) / 1e6 / r.Elapsed.Seconds() }

// payload is the 64-byte message of the round-trip loads.
var payload = []byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

// warmRoundTrips are the round trips a latency load makes before it
// measures: a fresh connection's first exchanges (its stream's opening,
// TLS records, buffers growing) are not what is measured.
const warmRoundTrips = 10

// runLoad runs one load and prints its result.
//
//	role load: -kind http|download|grpc-unary|grpc-bidi|bulk|rtt|conns|interactive [flags]
func runLoad(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	kind := fs.String("kind", "", "the load")
	target := fs.String("url", "", "http, download: the URL; grpc: the authority (host:port)")
	connect := fs.String("connect", "", "the loopback address to connect to, whatever the URL's host")
	caFile := fs.String("ca", "", "PEM file of the CA to trust for TLS (grpc: TLS only with it)")
	conns := fs.Int("c", 1, "http: connections; conns: concurrent clients")
	d := fs.Duration("d", time.Second, "http, conns: how long")
	h2 := fs.Bool("h2", false, "http: HTTP/2 (over TLS) rather than HTTP/1.1")
	size := fs.Int64("size", 1<<20, "download, bulk: bytes")
	n := fs.Int("n", 100, "grpc, rtt, interactive: round trips")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tlsConfig *tls.Config
	if *caFile != "" {
		roots, err := benchpki.LoadRoots(*caFile)
		if err != nil {
			return err
		}
		tlsConfig = &tls.Config{RootCAs: roots}
	}
	var (
		res loadResult
		err error
	)
	switch *kind {
	case "http":
		res, err = loadHTTP(ctx, *target, *connect, tlsConfig, *conns, *d, *h2)
	case "download":
		res, err = loadDownload(ctx, *target, *connect, tlsConfig, *size)
	case "grpc-unary", "grpc-bidi":
		res, err = loadGRPC(ctx, *kind == "grpc-bidi", *target, *connect, tlsConfig, *n)
	case "bulk":
		res, err = loadBulk(ctx, *connect, *size)
	case "rtt":
		res, err = loadRTT(ctx, *connect, *n)
	case "conns":
		res, err = loadConns(ctx, *connect, *conns, *d)
	case "interactive":
		res, err = loadInteractive(ctx, *connect, *n)
	default:
		return fmt.Errorf("-kind %q: unknown", *kind)
	}
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	ctl.Result(string(b))
	return nil
}

// dialTo returns a DialContext that reaches addr whatever it is asked for.
func dialTo(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
}

// httpClient returns a client whose every connection goes to connect,
// keeping conns of them alive, speaking HTTP/2 (over TLS) when h2, else
// HTTP/1.1.
func httpClient(connect string, tlsConfig *tls.Config, conns int, h2 bool) *http.Client {
	var p http.Protocols
	if h2 {
		p.SetHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{
		DialContext:         dialTo(connect),
		TLSClientConfig:     tlsConfig,
		Protocols:           &p,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// loadHTTP sends GET requests for target from conns concurrent keep-alive
// clients for d; every response must be 200 with helloBody. It stands in
// for wrk and h2load where they are missing.
func loadHTTP(ctx context.Context, target, connect string, tlsConfig *tls.Config, conns int, d time.Duration, h2 bool) (loadResult, error) {
	client := httpClient(connect, tlsConfig, conns, h2)
	defer client.CloseIdleConnections()
	var (
		ops      atomic.Int64
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range conns {
		wg.Go(func() {
			buf := make([]byte, 512)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := getHello(ctx, client, target, buf); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	return loadResult{Ops: ops.Load(), Elapsed: time.Since(start)}, ctx.Err()
}

// getHello gets target and checks that the answer is 200 helloBody.
func getHello(ctx context.Context, client *http.Client, target string, buf []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	n, err := io.ReadFull(resp.Body, buf)
	resp.Body.Close()
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("GET %s: body: %w", target, err)
	}
	if resp.StatusCode != http.StatusOK || string(buf[:n]) != helloBody {
		return fmt.Errorf("GET %s: %d %q, want 200 %q", target, resp.StatusCode, buf[:n], helloBody)
	}
	return nil
}

// loadDownload gets target?n=size over HTTP/1.1 once and reads the body
// through a 256 KiB buffer: Bytes over Elapsed is the download rate, from
// the request's start to the body's end.
func loadDownload(ctx context.Context, target, connect string, tlsConfig *tls.Config, size int64) (loadResult, error) {
	client := httpClient(connect, tlsConfig, 1, false)
	defer client.CloseIdleConnections()
	client.Timeout = 0 // a gigabyte may take a while: ctx bounds it
	u, err := url.Parse(target)
	if err != nil {
		return loadResult{}, err
	}
	q := u.Query()
	q.Set("n", strconv.FormatInt(size, 10))
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return loadResult{}, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return loadResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return loadResult{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	got, err := readAll(resp.Body, make([]byte, 256<<10))
	if err != nil {
		return loadResult{}, fmt.Errorf("GET %s: after %d bytes: %w", u, got, err)
	}
	if got != size {
		return loadResult{}, fmt.Errorf("GET %s: %d bytes, want %d", u, got, size)
	}
	return loadResult{Ops: 1, Bytes: got, Elapsed: time.Since(start)}, nil
}

// readAll reads r to its end through buf and returns how many bytes came.
func readAll(r io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, err := r.Read(buf)
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// loadGRPC makes n unary calls one after another, or n ping-pongs on one
// bidi stream, each with a 64-byte message, and reports their latency.
func loadGRPC(ctx context.Context, bidi bool, authority, connect string, tlsConfig *tls.Config, n int) (loadResult, error) {
	cc, err := dialGRPC(authority, connect, tlsConfig)
	if err != nil {
		return loadResult{}, err
	}
	defer cc.Close()
	var roundTrip func() error
	var finish func() error
	if bidi {
		stream, err := cc.NewStream(ctx, &pingPongDesc, pingPongMethod)
		if err != nil {
			return loadResult{}, err
		}
		roundTrip = func() error {
			msg := payload
			if err := stream.SendMsg(&msg); err != nil {
				return err
			}
			var resp []byte
			if err := stream.RecvMsg(&resp); err != nil {
				return err
			}
			return checkEcho(resp)
		}
		finish = func() error {
			if err := stream.CloseSend(); err != nil {
				return err
			}
			var resp []byte
			if err := stream.RecvMsg(&resp); err != io.EOF {
				return fmt.Errorf("end of stream: %v, want EOF", err)
			}
			return nil
		}
	} else {
		roundTrip = func() error {
			msg, resp := payload, []byte(nil)
			if err := cc.Invoke(ctx, unaryMethod, &msg, &resp, grpc.WaitForReady(true)); err != nil {
				return err
			}
			return checkEcho(resp)
		}
		finish = func() error { return nil }
	}
	res, err := measureRoundTrips(ctx, n, roundTrip)
	if err != nil {
		return res, err
	}
	return res, finish()
}

func checkEcho(b []byte) error {
	if string(b) != string(payload) {
		return fmt.Errorf("answer %q, want the 64 bytes sent", b)
	}
	return nil
}

// measureRoundTrips runs warmRoundTrips unmeasured round trips, then n
// measured ones, and returns their count, time and percentiles.
func measureRoundTrips(ctx context.Context, n int, roundTrip func() error) (loadResult, error) {
	for range warmRoundTrips {
		if err := roundTrip(); err != nil {
			return loadResult{}, err
		}
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		if err := ctx.Err(); err != nil {
			return loadResult{}, err
		}
		t := time.Now()
		if err := roundTrip(); err != nil {
			return loadResult{}, err
		}
		lat = append(lat, time.Since(t))
	}
	res := loadResult{Ops: int64(n), Elapsed: time.Since(start)}
	res.P50, res.P99 = percentiles(lat)
	return res, nil
}

// percentiles returns the 50th and 99th percentiles of d (nearest rank);
// it sorts d.
func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(d))+0.999999) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	return rank(0.50), rank(0.99)
}

// loadBulk sends size bytes to the echo at connect, half-closes, and reads
// every byte back until the echo's end: the half-closed echo. Bytes over
// Elapsed is the one-way rate, from the dial to the echo's end.
func loadBulk(ctx context.Context, connect string, size int64) (loadResult, error) {
	start := time.Now()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", connect)
	if err != nil {
		return loadResult{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	wrote := make(chan error, 1)
	go func() { wrote <- writeBulk(c, size) }()
	got, err := readAll(c, make([]byte, 32<<10))
	if werr := <-wrote; err == nil && werr != nil {
		err = fmt.Errorf("write: %w", werr)
	}
	if err != nil {
		return loadResult{}, err
	}
	if got != size {
		return loadResult{}, fmt.Errorf("echo: %d bytes back, want %d", got, size)
	}
	return loadResult{Ops: 1, Bytes: size, Elapsed: time.Since(start)}, nil
}

// writeBulk writes size bytes to c in 32 KiB writes, then half-closes it.
func writeBulk(c net.Conn, size int64) error {
	buf := make([]byte, 32<<10)
	for size > 0 {
		k := min(size, int64(len(buf)))
		if _, err := c.Write(buf[:k]); err != nil {
			return err
		}
		size -= k
	}
	return c.(interface{ CloseWrite() error }).CloseWrite()
}

// echoRoundTrip writes the 64-byte payload to c and reads it back.
func echoRoundTrip(c net.Conn, buf []byte) error {
	if _, err := c.Write(payload); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, buf[:len(payload)]); err != nil {
		return err
	}
	return checkEcho(buf[:len(payload)])
}

// loadRTT makes n 64-byte round trips on one open connection to the echo
// at connect.
func loadRTT(ctx context.Context, connect string, n int) (loadResult, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", connect)
	if err != nil {
		return loadResult{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	buf := make([]byte, len(payload))
	return measureRoundTrips(ctx, n, func() error { return echoRoundTrip(c, buf) })
}

// loadConns has workers clients each open a connection to the echo at
// connect, make one 64-byte round trip and close it, again and again for
// d. P50 and P99 are of one such connection's whole life.
func loadConns(ctx context.Context, connect string, workers int, d time.Duration) (loadResult, error) {
	var (
		mu       sync.Mutex
		lat      []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for range workers {
		wg.Go(func() {
			buf := make([]byte, len(payload))
			var mine []time.Duration
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				err := oneConn(ctx, connect, buf)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					break
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	res := loadResult{Ops: int64(len(lat)), Elapsed: time.Since(start)}
	res.P50, res.P99 = percentiles(lat)
	return res, ctx.Err()
}

// oneConn dials connect, makes one 64-byte round trip and closes.
func oneConn(ctx context.Context, connect string, buf []byte) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", connect)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return echoRoundTrip(c, buf)
}

// loadInteractive measures 64-byte round trips on one connection to the
// echo at connect, first alone (IdleP50, IdleP99), then while a second
// connection to the same address moves bulk data both ways as fast as it
// can (P50, P99; Bytes over Elapsed is that bulk's rate meanwhile).
// Through the tunnel, both connections are streams of one agent session.
func loadInteractive(ctx context.Context, connect string, n int) (loadResult, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", connect)
	if err != nil {
		return loadResult{}, err
	}
	defer c.Close()
	stopC := context.AfterFunc(ctx, func() { c.Close() })
	defer stopC()
	buf := make([]byte, len(payload))
	roundTrip := func() error { return echoRoundTrip(c, buf) }
	idle, err := measureRoundTrips(ctx, n, roundTrip)
	if err != nil {
		return loadResult{}, err
	}

	bulk, err := (&net.Dialer{}).DialContext(ctx, "tcp", connect)
	if err != nil {
		return loadResult{}, err
	}
	defer bulk.Close()
	stopB := context.AfterFunc(ctx, func() { bulk.Close() })
	defer stopB()
	var (
		stop     atomic.Bool
		received atomic.Int64
		running  = make(chan struct{}) // closed once 4 MiB came back: the bulk is up to speed
		wrote    = make(chan error, 1)
		read     = make(chan error, 1)
	)
	go func() { wrote <- writeUntil(bulk, &stop) }()
	go func() { read <- readCounting(bulk, &received, 4<<20, running) }()
	select {
	case <-running:
	case err := <-read:
		return loadResult{}, fmt.Errorf("bulk stream: %v", err)
	case <-ctx.Done():
		return loadResult{}, ctx.Err()
	}
	b0 := received.Load()
	loaded, err := measureRoundTrips(ctx, n, roundTrip)
	b1 := received.Load()
	stop.Store(true)
	if werr := <-wrote; err == nil && werr != nil {
		err = fmt.Errorf("bulk stream: write: %w", werr)
	}
	if rerr := <-read; err == nil && rerr != nil {
		err = fmt.Errorf("bulk stream: read: %w", rerr)
	}
	if err != nil {
		return loadResult{}, err
	}
	return loadResult{
		Ops: loaded.Ops, Bytes: b1 - b0, Elapsed: loaded.Elapsed,
		P50: loaded.P50, P99: loaded.P99, IdleP50: idle.P50, IdleP99: idle.P99,
	}, nil
}

// writeUntil writes 32 KiB at a time to c until stop is set, then
// half-closes it.
func writeUntil(c net.Conn, stop *atomic.Bool) error {
	buf := make([]byte, 32<<10)
	for !stop.Load() {
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
	return c.(interface{ CloseWrite() error }).CloseWrite()
}

// readCounting reads c to its end, counting into n, and closes running
// once threshold bytes came.
func readCounting(c net.Conn, n *atomic.Int64, threshold int64, running chan struct{}) error {
	buf := make([]byte, 32<<10)
	signaled := false
	for {
		k, err := c.Read(buf)
		if n.Add(int64(k)) >= threshold && !signaled {
			close(running)
			signaled = true
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
