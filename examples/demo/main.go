// Command demo runs a whole tunnel in one process: an edge on loopback, an
// app exposed through it with agent.Listen at an http:// and an https://
// URL (TLS terminated at the edge with a certificate from a throwaway CA,
// whose certificate it writes to a temporary file for curl's --cacert),
// and the curl lines to try. It runs until Ctrl-C.
//
//	go run ./examples/demo
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
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
		// The agent's and the edge's errors carry their package's name,
		// which the demo's would double.
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "agent: "), "edge: ")
		fmt.Fprintln(os.Stderr, "demo:", msg)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "127.0.0.1:0", "address of the edge's public HTTP (port 0: any free port)")
	tlsAddr := fs.String("tls", "127.0.0.1:0", "address of the edge's public TLS, for the https URL (port 0: any free port)")
	name := fs.String("name", "demo", "the app's name under example.test")
	verbose := fs.Bool("v", false, "log the edge's and the agent's events to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}

	// A certificate for *.example.test from a CA made for this run, whose
	// certificate curl is told to trust.
	cert, caPEM, err := throwawayCA("*.example.test")
	if err != nil {
		return err
	}
	caDir, err := os.MkdirTemp("", "tunnelkit-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(caDir)
	caFile := filepath.Join(caDir, "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		return err
	}

	// The edge: agents on one loopback port, public HTTP on another, and
	// public TLS (https endpoints terminated, tls ones passed through) on
	// a third.
	srv := &edge.Server{Domain: "example.test", Certificates: []tls.Certificate{cert}, Logger: logger.With("side", "edge")}
	var lns []net.Listener
	for _, addr := range []string{"127.0.0.1:0", *httpAddr, *tlsAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return err
		}
		lns = append(lns, ln)
	}
	agentLn, httpLn, tlsLn := lns[0], lns[1], lns[2]
	_, srv.HTTPPort, _ = net.SplitHostPort(httpLn.Addr().String())
	_, srv.TLSPort, _ = net.SplitHostPort(tlsLn.Addr().String())
	served := make(chan struct{}, 3)
	go func() { srv.ServeAgents(agentLn); served <- struct{}{} }()
	go func() { srv.ServeHTTPListener(httpLn); served <- struct{}{} }()
	go func() { srv.ServeSNI(tlsLn); served <- struct{}{} }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		<-served
		<-served
		<-served
	}()

	// The app: an HTTP server whose listener is the tunnel.
	c := &agent.Client{Addrs: []string{agentLn.Addr().String()}, Logger: logger.With("side", "agent")}
	defer c.Close()
	l, err := c.Listen(ctx, "http://"+*name)
	if err != nil {
		return err
	}
	ls, err := c.Listen(ctx, "https://"+*name)
	if err != nil {
		return err
	}
	app := &http.Server{Handler: http.HandlerFunc(hello)}
	appDone := make(chan error, 2)
	go func() { appDone <- app.Serve(l) }()
	go func() { appDone <- app.Serve(ls) }()

	host := *name + ".example.test"
	fmt.Fprintf(stdout, "An edge serves *.example.test on %s (http) and %s (https); an app is exposed through it at %s and %s\n", httpLn.Addr(), tlsLn.Addr(), l.URL(), ls.URL())
	fmt.Fprintf(stdout, "Try:\n  curl --resolve %s:%s:127.0.0.1 %s/\n", host, srv.HTTPPort, l.URL())
	fmt.Fprintf(stdout, "  curl --http2 --cacert %s --resolve %s:%s:127.0.0.1 %s/\n", caFile, host, srv.TLSPort, ls.URL())
	fmt.Fprintln(stdout, "Ctrl-C to stop.")

	select {
	case <-ctx.Done():
		app.Close()
		<-appDone
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
	fmt.Fprintf(w, "Hello from behind the tunnel!\nYou are %s, asking for %s%s over %s\nX-Forwarded-For: %s\n",
		r.RemoteAddr, r.Host, r.URL.Path, r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-For"))
}

// throwawayCA makes a CA valid for a day and a certificate it signs for
// name, and returns the certificate and the CA's, PEM-encoded.
func throwawayCA(name string) (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tunnelkit demo CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}
