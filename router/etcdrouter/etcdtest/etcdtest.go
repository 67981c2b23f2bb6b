// Package etcdtest runs a real etcd server inside a test process, on
// loopback ports of its own, for tests of programs that share routes
// through etcd: it can be stopped and started again on the same data and
// ports, as an outage.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is an etcd server for one test.
type Server struct {
	// Endpoint is the client URL, "http://127.0.0.1:PORT" ("https://" for
	// a server of StartTLS).
	Endpoint string

	dir, client, peer string
	tls               *TLS // nil: plain HTTP to clients
	mu                sync.Mutex
	e                 *embed.Etcd
}

// TLS are the files of a server that speaks TLS to its clients: its
// certificate (which etcd also presents as a client, to itself: give it
// the clientAuth extended key usage too) and key, and the CA whose
// certificates clients must present.
type TLS struct {
	CertFile, KeyFile string
	// ClientCAFile is the PEM file of the CA that signs the clients'
	// certificates: a client without one is refused, as etcd's
	// --client-cert-auth --trusted-ca-file do.
	ClientCAFile string
}

// StartTLS is Start for a server that speaks TLS to its clients and
// requires a client certificate (see TLS); Endpoint is
// "https://127.0.0.1:PORT".
func StartTLS(t testing.TB, files TLS) *Server {
	t.Helper()
	s, err := newServer(filepath.Join(t.TempDir(), "etcd"), &files)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Start starts a server with its data in a temporary directory and stops
// it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// New starts a server with its data in dir, on loopback ports it picks,
// for a TestMain; the caller stops it.
func New(dir string) (*Server, error) {
	return newServer(dir, nil)
}

func newServer(dir string, files *TLS) (*Server, error) {
	client, err := freeAddr()
	if err != nil {
		return nil, err
	}
	peer, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, client: client, peer: peer, tls: files, Endpoint: "http://" + client}
	if files != nil {
		s.Endpoint = "https://" + client
	}
	return s, s.start()
}

// Etcd returns the running server (for an in-process client,
// v3client.New(s.Etcd().Server)), or nil while it is stopped.
func (s *Server) Etcd() *embed.Etcd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e
}

// Stop stops the server; its clients see it gone. It refuses new calls at
// once, but waits for open streams (watches, keep-alives) up to its
// request timeout, about 7 s, before it cuts them. Stopping a stopped
// server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	e := s.e
	s.e = nil
	s.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped server again, with the same data on the same
// ports.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Dir = s.dir
	cu := url.URL{Scheme: "http", Host: s.client}
	if s.tls != nil {
		cu.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile:       s.tls.CertFile,
			KeyFile:        s.tls.KeyFile,
			TrustedCAFile:  s.tls.ClientCAFile,
			ClientCertAuth: true,
		}
	}
	pu := url.URL{Scheme: "http", Host: s.peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.UnsafeNoFsync = true // tests stop it cleanly, never crash it
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	var e *embed.Etcd
	var err error
	// The ports were free when picked; a restart may meet them in
	// TIME_WAIT for a moment.
	for try := 0; try < 50; try++ {
		if e, err = embed.StartEtcd(cfg); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("etcdtest: start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
		s.e = e
		return nil
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: start etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return errors.New("etcdtest: etcd not ready after 30s")
	}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
