// Command edge runs a tunnel edge: agents connect on -agents; public HTTP
// requests on -http reach them by name under -domain, public TLS on -tls by
// server name (passed through, never terminated), and TCP endpoints are
// opened on ports of -tcp-ports.
//
//	edge -agents 127.0.0.1:7000 -http 127.0.0.1:8080 -domain example.test \
//	     -tls 127.0.0.1:8443 -tcp-ports 20000-20100 \
//	     -token "$SECRET" -agent-cert edge.pem -agent-key edge-key.pem
package main

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
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
	tlsAddr := fs.String("tls", "", "address of public TLS, routed by SNI (empty: none)")
	tcpPorts := fs.String("tcp-ports", "", "range of ports for TCP endpoints, e.g. 20000-20100 (empty: none)")
	token := fs.String("token", "", "shared secret agents must present (empty: any agent is accepted)")
	agentCert := fs.String("agent-cert", "", "PEM certificate for TLS on -agents (with -agent-key; empty: plaintext)")
	agentKey := fs.String("agent-key", "", "PEM private key of -agent-cert")
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
	if *token != "" {
		secret := []byte(*token)
		srv.Authenticate = func(_ context.Context, got string) (string, error) {
			if subtle.ConstantTimeCompare([]byte(got), secret) != 1 {
				return "", errors.New("wrong token")
			}
			return "token", nil
		}
	}
	if (*agentCert == "") != (*agentKey == "") {
		return errors.New("-agent-cert and -agent-key go together")
	}
	if *agentCert != "" {
		cert, err := tls.LoadX509KeyPair(*agentCert, *agentKey)
		if err != nil {
			return fmt.Errorf("-agent-cert: %w", err)
		}
		srv.AgentTLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if *tcpPorts != "" {
		r, err := edge.ParsePortRange(*tcpPorts)
		if err != nil {
			return err
		}
		srv.TCPPorts = r
		if host, _, err := net.SplitHostPort(*httpAddr); err == nil {
			srv.TCPListenHost = host
		}
	}
	var lns []net.Listener
	listen := func(addr string) (net.Listener, error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
		return ln, nil
	}
	agentLn, err := listen(*agents)
	if err != nil {
		return err
	}
	httpLn, err := listen(*httpAddr)
	if err != nil {
		return err
	}
	var tlsLn net.Listener
	if *tlsAddr != "" {
		if tlsLn, err = listen(*tlsAddr); err != nil {
			return err
		}
	}
	log.Info("edge up", "agents", agentLn.Addr().String(), "http", httpLn.Addr().String(), "tls", *tlsAddr, "tcp_ports", *tcpPorts, "domain", *domain)
	errc := make(chan error, 3)
	go func() { errc <- srv.ServeAgents(agentLn) }()
	go func() { errc <- srv.ServeHTTPListener(httpLn) }()
	if tlsLn != nil {
		go func() { errc <- srv.ServeSNI(tlsLn) }()
	}
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
