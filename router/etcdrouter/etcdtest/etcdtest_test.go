package etcdtest_test

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter/etcdtest"
)

// TestStartTLS: a server of StartTLS answers a client with a certificate
// of its client CA, over TLS, and refuses one without a certificate and
// one with another CA's.
func TestStartTLS(t *testing.T) {
	ca, other := testpki.New(t), testpki.New(t)
	dir := t.TempDir()
	certPEM, keyPEM := testpki.PEMFiles(t, ca.Issue(t, "127.0.0.1"))
	files := etcdtest.TLS{CertFile: filepath.Join(dir, "etcd.pem"), KeyFile: filepath.Join(dir, "etcd-key.pem"), ClientCAFile: filepath.Join(dir, "ca.pem")}
	for name, b := range map[string][]byte{files.CertFile: certPEM, files.KeyFile: keyPEM, files.ClientCAFile: ca.PEM} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := etcdtest.StartTLS(t, files)
	if !strings.HasPrefix(s.Endpoint, "https://127.0.0.1:") {
		t.Fatalf("Endpoint %q; want https://127.0.0.1:PORT", s.Endpoint)
	}
	put := func(cfg *tls.Config, timeout time.Duration) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, TLS: cfg, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err = cli.Put(ctx, "k", "v")
		return err
	}
	if err := put(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{ca.Issue(t, "edge")}}, 30*time.Second); err != nil {
		t.Fatalf("a client with a certificate of the client CA: %v", err)
	}
	for name, cfg := range map[string]*tls.Config{
		"no certificate": {RootCAs: ca.Pool},
		"another CA's":   {RootCAs: ca.Pool, Certificates: []tls.Certificate{other.Issue(t, "edge")}},
	} {
		// The client retries until its ctx ends: the failure is what
		// counts, not how long it took.
		if err := put(cfg, 3*time.Second); err == nil {
			t.Errorf("a client with %s: its Put went through", name)
		}
	}
}
