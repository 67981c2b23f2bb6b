// Command demo runs a whole tunnel in one process: an edge on loopback, an
// app exposed through it with agent.Listen, and the curl line to try. It
// runs until Ctrl-C.
//
//	go run ./examples/demo
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage is printed
		}
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "127.0.0.1:0", "address of the edge's public HTTP (port 0: any free port)")
	name := fs.String("name", "demo", "the app's name under example.test")
	verbose := fs.Bool("v", false, "log the edge's and the agent's events to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}

	// The edge: agents on one loopback port, public HTTP on another.
	srv := &edge.Server{Domain: "example.test", Logger: logger.With("side", "edge")}
	agentLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	httpLn, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		agentLn.Close()
		return err
	}
	served := make(chan struct{}, 2)
	go func() { srv.ServeAgents(agentLn); served <- struct{}{} }()
	go func() { srv.ServeHTTPListener(httpLn); served <- struct{}{} }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		<-served
		<-served
	}()

	// The app: an HTTP server whose listener is the tunnel.
	c := &agent.Client{Addr: agentLn.Addr().String(), Logger: logger.With("side", "agent")}
	defer c.Close()
	l, err := c.Listen(ctx, "http://"+*name)
	if err != nil {
		return err
	}
	app := &http.Server{Handler: http.HandlerFunc(hello)}
	appDone := make(chan error, 1)
	go func() { appDone <- app.Serve(l) }()

	_, port, _ := net.SplitHostPort(httpLn.Addr().String())
	host := *name + ".example.test"
	fmt.Fprintf(stdout, "An edge serves *.example.test on %s; an app is exposed through it at %s\n", httpLn.Addr(), l.URL())
	fmt.Fprintf(stdout, "Try:\n  curl --resolve %s:%s:127.0.0.1 %s/\n", host, port, l.URL())
	fmt.Fprintln(stdout, "Ctrl-C to stop.")

	select {
	case <-ctx.Done():
		app.Close()
		<-appDone
		return nil
	case err := <-appDone:
		if errors.Is(err, net.ErrClosed) {
			return errors.New("the tunnel closed")
		}
		return err
	}
}

func hello(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "Hello from behind the tunnel!\nYou are %s, asking for %s%s\nX-Forwarded-For: %s\n",
		r.RemoteAddr, r.Host, r.URL.Path, r.Header.Get("X-Forwarded-For"))
}
