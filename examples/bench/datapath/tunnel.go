//go:build unix

package main

// The tunnel's processes: the edge, composed by the example edge's own
// code (internal/edgecmd), and the agent, composed as "tunnelkit agent"
// composes it.

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchpki"
	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
	"github.com/tunnelkit/tunnelkit/examples/internal/logbuf"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
)

// domain is the edge's domain: the endpoints are bench.example.test and
// grpc.example.test.
const domain = "example.test"

// runEdge runs the example edge command (the code of "tunnelkit edge" less
// its etcd and Prometheus flags) on free loopback ports, with the run's
// certificate for https endpoints and, with -link tls, for the agents'
// port; its log goes to stderr.
//
//	role edge: -dir DIR [-link tls] [-access-log=false]
func runEdge(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory of the run's certificate")
	link := fs.String("link", "plain", "the agents' link: plain or tls")
	accessLog := fs.Bool("access-log", true, "the edge's access log, as the example edge writes it by default")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cert, key := filepath.Join(*dir, certFileName), filepath.Join(*dir, keyFileName)
	// The ports are chosen here rather than with ":0" so that the ready
	// line need not be read from the edge's log; a port taken meanwhile
	// fails the start, which is tried again on other ports.
	var lastErr error
	for range 5 {
		ports, err := benchproc.FreePorts(6)
		if err != nil {
			return err
		}
		addrs := map[string]string{"agents": benchproc.Loopback(ports[0]), "http": benchproc.Loopback(ports[1]), "tls": benchproc.Loopback(ports[2])}
		edgeArgs := []string{
			"-agents", addrs["agents"], "-http", addrs["http"], "-tls", addrs["tls"],
			"-domain", domain, "-tcp-ports", fmt.Sprintf("%d-%d", ports[3], ports[5]),
			"-cert", cert, "-key", key, "-access-log=" + strconv.FormatBool(*accessLog),
			// The idle row's thousands of anonymous agents share one
			// address: the per-source bounds would refuse them.
			"-max-endpoints-per-source", "-1",
		}
		switch *link {
		case "plain":
		case "tls":
			edgeArgs = append(edgeArgs, "-agent-cert", cert, "-agent-key", key)
		default:
			return fmt.Errorf("-link %q: want plain or tls", *link)
		}
		logw, up := benchproc.WatchFor(os.Stderr, `msg="edge up"`)
		done := make(chan error, 1)
		go func() { done <- edgecmd.Run(ctx, "edge", edgeArgs, io.Discard, logw, nil) }()
		select {
		case <-up:
			ctl.Ready("agents="+addrs["agents"], "http="+addrs["http"], "tls="+addrs["tls"])
			return <-done // after ctx is done: the edge shut down
		case err := <-done:
			if ctx.Err() != nil {
				return nil
			}
			lastErr = err
		}
	}
	return fmt.Errorf("the edge did not start: %w", lastErr)
}

// runAgent exposes -to at -url through the edge at -edge, as
// "tunnelkit agent" does: an agent.Client, its listener, and a forward.HTTP
// that forwards request by request for http and https URLs
// (-log-requests, the example's default), or a forward.Bytes that copies
// bytes.
//
//	role agent: -edge ADDR -url URL -to ADDR [-app-protocol h2c] [-log-requests=false] [-edge-ca FILE] [-quiet]
func runAgent(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	edgeAddr := fs.String("edge", "", "the edge's agent address")
	url := fs.String("url", "", "the endpoint's URL")
	to := fs.String("to", "", "the app's address")
	appProto := fs.String("app-protocol", "", "http1 or h2c")
	logRequests := fs.Bool("log-requests", true, "for http and https URLs, forward request by request; false: copy bytes")
	edgeCA := fs.String("edge-ca", "", "PEM file of the CA of the edge's certificate: TLS to the edge (empty: plaintext, as to any loopback edge)")
	quiet := fs.Bool("quiet", false, "log warnings only (not a line per request or connection)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, logs := childLogger(*quiet)
	defer logs.Close()
	c := &agent.Client{Addrs: []string{*edgeAddr}, Logger: log}
	if *edgeCA != "" {
		roots, err := benchpki.LoadRoots(*edgeCA)
		if err != nil {
			return err
		}
		c.TLSConfig = &tls.Config{RootCAs: roots}
	}
	defer c.Close()
	setup, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l, err := c.ListenEndpoint(setup, agent.Endpoint{URL: *url, AppProtocol: *appProto})
	if err != nil {
		return err
	}
	scheme := urlScheme(*url)
	httpMode := (scheme == "http" || scheme == "https") && *logRequests
	var fwd interface{ Serve(net.Listener) error } = forward.Bytes{To: *to, Logger: log}
	if httpMode {
		fwd = forward.HTTP{To: *to, Logger: log}
	}
	served := make(chan error, 1)
	go func() { served <- fwd.Serve(l) }()
	ctl.Ready("url=" + l.URL())
	select {
	case <-ctx.Done():
		l.Close()
		return <-served
	case err := <-served:
		return fmt.Errorf("the forwarder stopped: %v", err)
	}
}

// runAgents opens -n idle agent sessions to the edge, each binding one
// http endpoint, and reports what they cost this process: the first
// session alone, as an app's agent has (fields one_heap, one_stack,
// one_goroutines), and each of the others (per_heap, per_stack,
// per_goroutines, averaged). Each session is an agent.Client and its
// listener, with no forwarder: nothing reaches them.
//
//	role agents: -edge ADDR -n N [-edge-ca FILE]
func runAgents(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("agents", flag.ContinueOnError)
	edgeAddr := fs.String("edge", "", "the edge's agent address")
	n := fs.Int("n", 100, "sessions")
	edgeCA := fs.String("edge-ca", "", "PEM file of the CA of the edge's certificate: TLS to the edge (empty: plaintext)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 2 {
		return errors.New("-n: want 2 or more")
	}
	var tlsConfig *tls.Config
	if *edgeCA != "" {
		roots, err := benchpki.LoadRoots(*edgeCA)
		if err != nil {
			return err
		}
		tlsConfig = &tls.Config{RootCAs: roots}
	}
	clients := make([]*agent.Client, *n)
	defer func() {
		var wg sync.WaitGroup
		for _, c := range clients {
			if c != nil {
				wg.Go(func() { c.Close() })
			}
		}
		wg.Wait()
	}()
	open := func(i int) error {
		c := &agent.Client{Addrs: []string{*edgeAddr}, TLSConfig: tlsConfig}
		setup, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := c.Listen(setup, fmt.Sprintf("http://idle%d", i)); err != nil {
			c.Close()
			return fmt.Errorf("session %d: %w", i, err)
		}
		clients[i] = c
		return nil
	}
	heapProfile := func(name string) error {
		if ctl.MemDir == "" {
			return nil
		}
		return benchproc.WriteProfile("heap", filepath.Join(ctl.MemDir, name))
	}
	m0 := benchproc.ReadMem()
	if err := heapProfile(fmt.Sprintf("agents-%d-0.heap.pprof", os.Getpid())); err != nil {
		return err
	}
	if err := open(0); err != nil {
		return err
	}
	m1 := benchproc.ReadMem()
	if err := heapProfile(fmt.Sprintf("agents-%d-1.heap.pprof", os.Getpid())); err != nil {
		return err
	}
	// The others, a few at a time as agents would connect.
	var (
		next     = 1
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := firstErr != nil
				mu.Unlock()
				if i >= *n || stop {
					return
				}
				if err := open(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	m2 := benchproc.ReadMem()
	if err := heapProfile(fmt.Sprintf("agents-%d-2.heap.pprof", os.Getpid())); err != nil {
		return err
	}
	one, rest := m1.Sub(m0), m2.Sub(m1)
	others := int64(*n - 1)
	ctl.Ready(
		fmt.Sprintf("one_heap=%d", one.Heap), fmt.Sprintf("one_stack=%d", one.Stack), fmt.Sprintf("one_goroutines=%d", one.Goroutines),
		// Per session, in thousandths, so that integers carry fractions.
		fmt.Sprintf("per_heap=%d", rest.Heap/others), fmt.Sprintf("per_stack=%d", rest.Stack/others),
		fmt.Sprintf("per_milligoroutines=%d", int64(rest.Goroutines)*1000/others))
	<-ctx.Done()
	return nil
}

// childLogger is the text logger to stderr that the example binaries
// use; quiet keeps warnings and errors only.
func childLogger(quiet bool) (*slog.Logger, *logbuf.Writer) {
	opts := &slog.HandlerOptions{}
	if quiet {
		opts.Level = slog.LevelWarn
	}
	// As "tunnelkit agent" batches its lines.
	w := logbuf.New(os.Stderr, 50*time.Millisecond)
	return slog.New(slog.NewTextHandler(w, opts)), w
}

// urlScheme returns the scheme of an endpoint URL, "http" for a bare name,
// as "tunnelkit agent" reads it.
func urlScheme(u string) string {
	scheme, _, ok := strings.Cut(u, "://")
	if u == "" || !ok {
		return "http"
	}
	return strings.ToLower(scheme)
}
