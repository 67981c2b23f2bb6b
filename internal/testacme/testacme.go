// Package testacme runs a real ACME server for one test: Debian's pebble,
// with pebble-challtestsrv as its DNS server answering every A query with
// 127.0.0.1, so that pebble really validates challenges against the server
// under test on loopback.
//
//	p := testacme.Start(t, httpPort, tlsPort)
//	m := &autocert.Manager{
//		Client: &acme.Client{DirectoryURL: p.DirectoryURL, HTTPClient: p.HTTPClient},
//		...
//	}
//	... tls.Config{RootCAs: p.Roots(t)} verifies what m issued.
package testacme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// Pebble is a running pebble ACME server for one test.
type Pebble struct {
	// DirectoryURL is the ACME directory, https://127.0.0.1:P/dir.
	DirectoryURL string
	// HTTPClient trusts pebble's own HTTPS listeners (the ACME API and the
	// management API), whose certificate comes from a throwaway CA.
	HTTPClient *http.Client
	// CAPEM is the throwaway CA of pebble's own HTTPS listeners,
	// PEM-encoded: what a client of the ACME API (an edge's -acme-ca)
	// trusts.
	CAPEM []byte

	mgmtURL string // https://127.0.0.1:M, the management API
}

// startTimeout bounds Start: both processes must answer within it.
const startTimeout = 20 * time.Second

// Start starts pebble-challtestsrv and pebble; pebble validates HTTP-01
// challenges on 127.0.0.1:httpPort and TLS-ALPN-01 on 127.0.0.1:tlsPort (the
// ports of the server under test), at once (PEBBLE_VA_NOSLEEP=1). Pebble
// keeps its default of rejecting 5% of nonces at random: ACME clients must
// retry (x/crypto/acme does, after a backoff of about a second). Start
// returns once pebble answers its directory, and stops both processes at
// the test's cleanup; their output is logged only when the test failed. It
// skips the test when the commands are missing (see testtools.Need).
//
// Options change pebble's settings: CertValidity.
func Start(t testing.TB, httpPort, tlsPort int, opts ...Option) *Pebble {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	testtools.Need(t, "pebble", "pebble-challtestsrv")
	dir := t.TempDir()
	ca := testpki.New(t)
	certPEM, keyPEM := testpki.PEMFiles(t, ca.Issue(t, "127.0.0.1"))
	certFile, keyFile := filepath.Join(dir, "pebble.pem"), filepath.Join(dir, "pebble-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}
	p := &Pebble{HTTPClient: &http.Client{Transport: tr, Timeout: 30 * time.Second}, CAPEM: ca.PEM}

	var procs []*proc
	logged := false
	t.Cleanup(func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
		tr.CloseIdleConnections()
		if t.Failed() && !logged {
			t.Log(output(procs))
		}
	})
	deadline := time.Now().Add(startTimeout)
	for attempt := 1; ; attempt++ {
		err := p.launch(dir, certFile, keyFile, httpPort, tlsPort, o, deadline, &procs)
		if err == nil {
			return p
		}
		for _, pr := range procs {
			pr.stop()
		}
		// A port picked free was taken before the process bound it: try
		// other ports.
		if errors.Is(err, errPortTaken) && attempt < 3 && time.Now().Before(deadline) {
			continue
		}
		logged = true
		t.Fatalf("testacme: %v\n%s", err, output(procs))
	}
}

var errPortTaken = errors.New("a port was taken")

// launch starts pebble-challtestsrv and pebble on free ports and waits until
// both answer.
func (p *Pebble) launch(dir, certFile, keyFile string, httpPort, tlsPort int, o options, deadline time.Time, procs *[]*proc) error {
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	addr := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	dnsAddr := addr(ports[0])
	// An empty -management would make it listen on port 80 of every
	// interface: give it a loopback port of its own.
	dns, err := startProc(dir, nil, "pebble-challtestsrv",
		"-dns01", dnsAddr, "-http01", "", "-https01", "", "-tlsalpn01", "",
		"-management", addr(ports[1]), "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "")
	if err != nil {
		return err
	}
	*procs = append(*procs, dns)
	if err := dns.waitFor(deadline, func(ctx context.Context) error { return lookup(ctx, dnsAddr) }); err != nil {
		return err
	}

	settings := map[string]any{
		"listenAddress":                  addr(ports[2]),
		"managementListenAddress":        addr(ports[3]),
		"certificate":                    certFile,
		"privateKey":                     keyFile,
		"httpPort":                       httpPort,
		"tlsPort":                        tlsPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
	}
	if o.validity > 0 {
		settings["certificateValidityPeriod"] = uint64(o.validity / time.Second)
	}
	conf, err := json.Marshal(map[string]any{"pebble": settings})
	if err != nil {
		return err
	}
	confFile := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(confFile, conf, 0o600); err != nil {
		return err
	}
	peb, err := startProc(dir, []string{"PEBBLE_VA_NOSLEEP=1"}, "pebble", "-config", confFile, "-dnsserver", dnsAddr)
	if err != nil {
		return err
	}
	*procs = append(*procs, peb)
	p.DirectoryURL = "https://" + addr(ports[2]) + "/dir"
	p.mgmtURL = "https://" + addr(ports[3])
	return peb.waitFor(deadline, func(ctx context.Context) error {
		_, err := p.get(ctx, p.DirectoryURL)
		return err
	})
}

// RootPEM returns pebble's issuing root certificate, PEM-encoded, from its
// management API (GET /roots/0). The root is new at every start.
func (p *Pebble) RootPEM(t testing.TB) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := p.get(ctx, p.mgmtURL+"/roots/0")
	if err != nil {
		t.Fatalf("testacme: pebble's root: %v", err)
	}
	return b
}

// Roots returns a pool with pebble's issuing root (see RootPEM), to verify
// the certificates it issued; the intermediate comes in the chain the
// server under test sends.
func (p *Pebble) Roots(t testing.TB) *x509.CertPool {
	t.Helper()
	pem := p.RootPEM(t)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("testacme: pebble's root: no PEM certificate in %q", pem)
	}
	return pool
}

// get returns the body of a 200 answer to GET url.
func (p *Pebble) get(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := p.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, res.Status)
	}
	return b, nil
}

// lookup asks the DNS server at addr for a name's A record, which must be
// 127.0.0.1.
func lookup(ctx context.Context, addr string) error {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	ips, err := r.LookupIP(ctx, "ip4", "testacme.example.test")
	if err != nil {
		return err
	}
	if len(ips) != 1 || !ips[0].Equal(net.IPv4(127, 0, 0, 1)) {
		return fmt.Errorf("DNS server %s answered %v, want 127.0.0.1", addr, ips)
	}
	return nil
}

// freePorts returns n distinct loopback ports free for TCP and UDP now
// (testtools.FreePort).
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := testtools.FreePort(true) // the DNS server needs the same port for UDP; so may anything
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	return ports, nil
}

// proc is a child process whose output goes to a buffer.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  testtools.Buffer
	done chan struct{} // closed once the process has exited
	err  error         // Wait's error, set before done is closed
}

func startProc(dir string, env []string, name string, args ...string) (*proc, error) {
	pr := &proc{name: name, done: make(chan struct{})}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = &pr.out
	cmd.Stderr = &pr.out
	cmd.WaitDelay = 5 * time.Second
	killWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pr.cmd = cmd
	go func() {
		pr.err = cmd.Wait()
		close(pr.done)
	}()
	return pr, nil
}

// waitFor calls ready until it succeeds, the process exits or the deadline
// passes.
func (pr *proc) waitFor(deadline time.Time, ready func(context.Context) error) error {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := ready(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-pr.done:
			if strings.Contains(pr.out.String(), "address already in use") {
				return fmt.Errorf("%s exited (%v): %w", pr.name, pr.err, errPortTaken)
			}
			return fmt.Errorf("%s exited: %v", pr.name, pr.err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %v", pr.name, startTimeout, err)
		}
	}
}

// stop kills the process and waits for it; it may be called more than once.
func (pr *proc) stop() {
	pr.cmd.Process.Kill()
	<-pr.done
}

// output returns the processes' output, each under a heading.
func output(procs []*proc) string {
	var b strings.Builder
	for _, pr := range procs {
		fmt.Fprintf(&b, "--- %s (pid %d) output:\n%s", pr.name, pr.cmd.Process.Pid, pr.out.String())
	}
	return b.String()
}

// An Option changes a setting of pebble.
type Option func(*options)

type options struct {
	validity time.Duration
}

// CertValidity makes pebble issue certificates valid for d (whole seconds)
// rather than 5 years: short enough for a test to see them renewed.
func CertValidity(d time.Duration) Option {
	return func(o *options) { o.validity = d }
}
