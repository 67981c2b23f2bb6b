package examples_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// TestOnePort runs the edge with -tls, -cert and -key and no agent port
// (-agents ""), and the agent with -edge on that TLS port and -edge-ca,
// as docs/edge.md's one-port setup does: the agent connects on the public TLS
// port, and its https endpoint is served on that same port.
func TestOnePort(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	pki := testpki.New(t)
	// The edge's names, and its address for agents that dial it.
	certPEM, keyPEM := testpki.PEMFiles(t, pki.Issue(t, "*.example.test", "example.test", "127.0.0.1"))
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem")
	for name, b := range map[string][]byte{certFile: certPEM, keyFile: keyPEM, caFile: pki.PEM} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pub, tlsAddr := freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", "", "-http", pub, "-tls", tlsAddr, "-domain", "example.test",
		"-cert", certFile, "-key", keyFile)
	waitListening(t, tlsAddr)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)

	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", tlsAddr, "-edge-ca", caFile, "-wait", "2m",
		"-url", "https://abc.example.test", "-to", localApp(t)))
	if want := "https://abc.example.test:" + tlsPort; url != want {
		t.Fatalf("agent printed %q, want %q", url, want)
	}
	body, proto := getTLS(t, tlsAddr, url+"/", pki.Pool)
	if want := "local app saw abc.example.test:" + tlsPort + " over https from 127.0.0.1"; body != want || proto != "HTTP/2.0" {
		t.Fatalf("got %q over %s, want %q over HTTP/2.0", body, proto, want)
	}
}
