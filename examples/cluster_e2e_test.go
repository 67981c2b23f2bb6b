package examples_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter/etcdtest"
)

// clusterEdge is an edge process of a cluster test.
type clusterEdge struct {
	name                     string
	cmd                      *exec.Cmd
	agents, http, tls, relay string
	stderr                   *strings.Builder
}

// startClusterFiles writes into a new directory what the edges of a
// cluster share (the CA of their relay certificates as ca.pem, the ticket
// key, the client certificate etcd takes, etcd-client.pem and its key)
// and starts an etcd that takes only that certificate.
func startClusterFiles(t *testing.T) (dir string, ca *testpki.CA, etcd *etcdtest.Server) {
	t.Helper()
	dir = t.TempDir()
	ca, etcdCA := testpki.New(t), testpki.New(t)
	etcdCert, etcdKey := testpki.PEMFiles(t, etcdCA.Issue(t, "127.0.0.1"))
	clientCert, clientKey := testpki.PEMFiles(t, etcdCA.Issue(t, "edges"))
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	writeFiles(t, dir, map[string][]byte{
		"ca.pem": ca.PEM, "ticket.key": []byte(hex.EncodeToString(key)),
		"etcd-ca.pem": etcdCA.PEM, "etcd.pem": etcdCert, "etcd-key.pem": etcdKey,
		"etcd-client.pem": clientCert, "etcd-client-key.pem": clientKey,
	})
	etcd = etcdtest.StartTLS(t, etcdtest.TLS{
		CertFile: filepath.Join(dir, "etcd.pem"), KeyFile: filepath.Join(dir, "etcd-key.pem"), ClientCAFile: filepath.Join(dir, "etcd-ca.pem"),
	})
	return dir, ca, etcd
}

// startClusterEdge starts "tunnelkit edge" (bin is tunnelkit) sharing routes through etcd, a
// client of it by the certificate in dir, with its public listeners on
// host (127.0.0.1 or ::1; TCP endpoints listen there too), and a relay
// certificate of ca naming it.
func startClusterEdge(t *testing.T, bin, name, host, etcd, tcpPort, dir string, ca *testpki.CA) *clusterEdge {
	t.Helper()
	free := func() string {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	e := &clusterEdge{name: name, agents: freePort(t), http: free(), tls: free(), relay: freePort(t), stderr: new(strings.Builder)}
	certPEM, keyPEM := testpki.PEMFiles(t, ca.IssueEdge(t, []string{e.relay}, "127.0.0.1", "::1"))
	writeFiles(t, dir, map[string][]byte{"relay-" + name + ".pem": certPEM, "relay-" + name + "-key.pem": keyPEM})
	e.cmd = exec.Command(bin, "edge", "-domain", "example.test", "-agents", e.agents, "-http", e.http, "-tls", e.tls,
		"-tcp-ports", tcpPort, "-ticket-key", filepath.Join(dir, "ticket.key"),
		"-etcd", etcd, "-etcd-ttl", "3s",
		"-etcd-cert", filepath.Join(dir, "etcd-client.pem"), "-etcd-key", filepath.Join(dir, "etcd-client-key.pem"), "-etcd-ca", filepath.Join(dir, "etcd-ca.pem"),
		"-relay", e.relay, "-relay-cert", filepath.Join(dir, "relay-"+name+".pem"), "-relay-key", filepath.Join(dir, "relay-"+name+"-key.pem"), "-relay-ca", filepath.Join(dir, "ca.pem"))
	e.cmd.Stderr = e.stderr
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { e.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			e.cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("edge %s:\n%s", e.name, e.stderr.String())
		}
	})
	waitListening(t, e.agents)
	waitListening(t, e.http)
	return e
}

// writeFiles writes files, by name, into dir.
func writeFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClusterOnEtcd runs three edge processes sharing routes through a real
// etcd, which requires TLS client certificates (-etcd-cert, -etcd-key,
// -etcd-ca), each edge with a relay certificate naming it, and agents
// connected to the first: clients of every edge reach them (http, tls,
// tcp), with one X-Forwarded-For hop. Then the first edge is killed
// (SIGKILL): the agents move to the next edge, and the same URLs answer on
// the two left. Then etcd stops for 10 s: cached routes keep answering;
// once it is back, a new endpoint is seen by every edge.
func TestClusterOnEtcd(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	dir, ca, etcd := startClusterFiles(t)
	_, tcpPort, _ := net.SplitHostPort(freePort(t))
	// A and C listen on 127.0.0.1, B on ::1: only one process can have a
	// TCP endpoint's port on one address, so C gets it once A is gone.
	a := startClusterEdge(t, filepath.Join(bin, "tunnelkit"), "A", "127.0.0.1", etcd.Endpoint, tcpPort, dir, ca)
	b := startClusterEdge(t, filepath.Join(bin, "tunnelkit"), "B", "::1", etcd.Endpoint, tcpPort, dir, ca)
	c := startClusterEdge(t, filepath.Join(bin, "tunnelkit"), "C", "127.0.0.1", etcd.Endpoint, tcpPort, dir, ca)
	edgeList := strings.Join([]string{a.agents, b.agents, c.agents}, ",")

	// The apps, and agents that connect to A first.
	httpApp := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "app xff=%s", r.Header.Get("X-Forwarded-For"))
	})}
	httpLn, _ := net.Listen("tcp", "127.0.0.1:0")
	go httpApp.Serve(httpLn)
	t.Cleanup(func() { httpApp.Close() })
	appCA := testpki.New(t)
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{appCA.Issue(t, "pass.example.test")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close() })
	echo, _ := net.Listen("tcp", "127.0.0.1:0")
	t.Cleanup(func() { echo.Close() })
	for _, ln := range []net.Listener{tl, echo} {
		serveConns(ln, func(conn net.Conn) {
			line, _ := bufio.NewReader(conn).ReadString('\n')
			io.WriteString(conn, "echo "+line)
		})
	}
	agent := func(url, to string) {
		readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", edgeList, "-url", url, "-to", to))
	}
	agent("http://app.example.test", httpLn.Addr().String())
	agent("tls://pass.example.test", tl.Addr().String())
	agent("tcp://:"+tcpPort, echo.Addr().String())

	httpVia := func(e *clusterEdge) error {
		tr := &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, e.http)
		}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://app.example.test/")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		host, _, _ := net.SplitHostPort(e.http)
		if want := "app xff=" + host; resp.StatusCode != 200 || string(body) != want {
			return fmt.Errorf("via %s: %d %q, want %q", e.name, resp.StatusCode, body, want)
		}
		return nil
	}
	tlsVia := func(e *clusterEdge) error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", e.tls, &tls.Config{ServerName: "pass.example.test", RootCAs: appCA.Pool})
		if err != nil {
			return fmt.Errorf("via %s: %w", e.name, err)
		}
		defer conn.Close()
		io.WriteString(conn, "hello\n")
		got, _ := io.ReadAll(conn)
		if string(got) != "echo hello\n" {
			return fmt.Errorf("via %s: %q", e.name, got)
		}
		return nil
	}
	tcpVia := func(host string) error {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, tcpPort), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		io.WriteString(conn, "hi\n")
		got, _ := io.ReadAll(conn)
		if string(got) != "echo hi\n" {
			return fmt.Errorf("tcp via %s: %q", host, got)
		}
		return nil
	}

	for _, e := range []*clusterEdge{a, b, c} {
		testwait.Until(t, 30*time.Second, "http via "+e.name, func() error { return httpVia(e) })
		testwait.Until(t, 30*time.Second, "tls via "+e.name, func() error { return tlsVia(e) })
	}
	testwait.Until(t, 30*time.Second, "tcp via B", func() error { return tcpVia("::1") })

	// kill -9 A: the agents move to B, and the URLs answer on B and C.
	a.cmd.Process.Kill()
	killed := time.Now()
	for _, e := range []*clusterEdge{b, c} {
		testwait.Until(t, 30*time.Second, "http via "+e.name+" after A died", func() error { return httpVia(e) })
		testwait.Until(t, 30*time.Second, "tls via "+e.name+" after A died", func() error { return tlsVia(e) })
	}
	testwait.Until(t, 30*time.Second, "tcp via B after A died", func() error { return tcpVia("::1") })
	testwait.Until(t, 30*time.Second, "tcp via C after A died", func() error { return tcpVia("127.0.0.1") })
	t.Logf("after A was killed, every endpoint answered on B and C within %v", time.Since(killed).Round(100*time.Millisecond))

	// etcd stops for 10 s: what the edges cached keeps answering.
	etcd.Stop()
	outage := time.Now()
	for time.Since(outage) < 10*time.Second {
		for _, e := range []*clusterEdge{b, c} {
			if err := httpVia(e); err != nil {
				t.Fatalf("during the etcd outage: %v", err)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	etcd.Restart(t)
	// Afterwards the edges agree: a new endpoint bound on one (the agent
	// connects to C first) is reached through the other.
	readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", c.agents+","+b.agents, "-url", "http://late.example.test", "-to", httpLn.Addr().String()))
	testwait.Until(t, 30*time.Second, "a new endpoint via B", func() error {
		tr := &http.Transport{DialContext: func(ctx context.Context, n, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, n, b.http)
		}}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("http://late.example.test/")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	// The old endpoints answer through both. An edge whose lease ran out
	// while etcd was down (its TTL, 10 s, is about the outage's length:
	// on a busy machine etcd comes back too late) binds its routes again
	// under a new lease, and its endpoints answer once it has.
	for _, e := range []*clusterEdge{b, c} {
		testwait.Until(t, 30*time.Second, "http via "+e.name+" after the outage", func() error { return httpVia(e) })
	}
}

// TestClusterEdgeRefusesBadSetups: the edge binary exits at once, saying
// what to fix, with a relay certificate that does not name its ID (every
// other edge would refuse it), and with etcd TLS flags that would not
// apply (-etcd-cert without -etcd-key; TLS files for http:// endpoints).
func TestClusterEdgeRefusesBadSetups(t *testing.T) {
	bin := filepath.Join(build(t, "tunnelkit"), "tunnelkit")
	dir := t.TempDir()
	ca := testpki.New(t)
	oldCert, oldKey := testpki.PEMFiles(t, ca.Issue(t, "127.0.0.1")) // no tunnelkit-edge:// URI
	writeFiles(t, dir, map[string][]byte{"ca.pem": ca.PEM, "old.pem": oldCert, "old-key.pem": oldKey})
	relay := freePort(t)
	base := []string{"-agents", freePort(t), "-http", freePort(t), "-relay", relay,
		"-relay-cert", filepath.Join(dir, "old.pem"), "-relay-key", filepath.Join(dir, "old-key.pem"), "-relay-ca", filepath.Join(dir, "ca.pem")}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a relay certificate without the edge's ID", nil, "tunnelkit-edge://" + relay},
		{"-etcd-cert without -etcd-key", []string{"-etcd", "https://127.0.0.1:1", "-etcd-cert", filepath.Join(dir, "old.pem")}, "-etcd-cert and -etcd-key go together"},
		{"-etcd-ca with an http:// endpoint", []string{"-etcd", "http://127.0.0.1:1", "-etcd-ca", filepath.Join(dir, "ca.pem")}, "every endpoint must be https://"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second) // a safety net: it exits at once
		cmd := exec.CommandContext(ctx, bin, append(append([]string{"edge"}, base...), tc.args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		if err == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%s: %v, exit code %d; want exit code 2 and %q in:\n%s", tc.name, err, cmd.ProcessState.ExitCode(), tc.want, stderr.String())
		}
	}
}
