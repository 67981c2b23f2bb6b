// Command edge runs a tunnel edge: agents connect on -agents, and public
// HTTP requests on -http reach them by name under -domain.
//
//	edge -agents 127.0.0.1:7000 -http 127.0.0.1:8080 -domain example.test
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
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "edge:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agents := fs.String("agents", "127.0.0.1:7000", "address agents connect to")
	httpAddr := fs.String("http", "127.0.0.1:8080", "address of public HTTP")
	domain := fs.String("domain", "example.test", "domain HTTP endpoints are named under")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *domain == "" {
		return errors.New("-domain is required")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv := &edge.Server{Domain: *domain, Logger: log}
	agentLn, err := net.Listen("tcp", *agents)
	if err != nil {
		return err
	}
	httpLn, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		agentLn.Close()
		return err
	}
	log.Info("edge up", "agents", agentLn.Addr().String(), "http", httpLn.Addr().String(), "domain", *domain)
	errc := make(chan error, 2)
	go func() { errc <- srv.ServeAgents(agentLn) }()
	go func() { errc <- srv.ServeHTTPListener(httpLn) }()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
