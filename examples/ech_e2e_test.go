package examples_test

import (
	"crypto/tls"
	"encoding/base64"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// TestECHWithTheBinaries: edge -ech-keygen makes a key file and prints the
// ECHConfigList; the edge run with -ech-key routes a client using ECH to
// the agent's TLS app by the inner name, without terminating it.
func TestECHWithTheBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	keyFile := filepath.Join(t.TempDir(), "ech.pem")
	out, err := exec.Command(filepath.Join(bin, "tunnelkit"), "edge", "-ech-keygen", keyFile, "-public-name", "public.example.test").Output()
	if err != nil {
		t.Fatalf("-ech-keygen: %v", err)
	}
	list, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("-ech-keygen printed %q: %v", out, err)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}

	pki := testpki.New(t)
	certPEM, keyPEM := testpki.PEMFiles(t, pki.Issue(t, "*.example.test"))
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600)
	os.WriteFile(filepath.Join(dir, "key.pem"), keyPEM, 0o600)
	agents, pub, tlsAddr := freePort(t), freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-tls", tlsAddr, "-domain", "example.test",
		"-cert", filepath.Join(dir, "cert.pem"), "-key", filepath.Join(dir, "key.pem"), "-ech-key", keyFile)
	waitListening(t, agents)
	waitListening(t, tlsAddr)

	// The app terminates TLS for the inner name and holds no ECH key.
	appCA := testpki.New(t)
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{appCA.Issue(t, "secret.example.test")}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	serveConns(tl, func(c net.Conn) {
		buf := make([]byte, 16)
		n, _ := c.Read(buf)
		io.WriteString(c, "secret: "+string(buf[:n]))
	})
	readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "tls://secret.example.test", "-to", tl.Addr().String()))

	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", tlsAddr, &tls.Config{
		ServerName:                     "secret.example.test",
		RootCAs:                        appCA.Pool,
		EncryptedClientHelloConfigList: list,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping")
	b, _ := io.ReadAll(conn)
	if string(b) != "secret: ping" || !conn.ConnectionState().ECHAccepted {
		t.Fatalf("got %q, ECHAccepted %v", b, conn.ConnectionState().ECHAccepted)
	}
}
