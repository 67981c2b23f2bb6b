// Package testproxy runs real proxies on loopback for one test: Debian's
// tinyproxy (HTTP CONNECT) and dante-server's danted (SOCKS5). Each listens
// on 127.0.0.1 and makes its outgoing connections from 127.0.0.2 (Out), so
// that a server under test tells a connection that came through the proxy
// by its peer's address.
//
//	p := testproxy.Tinyproxy(t, testproxy.TinyproxyConfig{User: "u", Password: "p", ConnectPorts: []int{port}})
//	c := &agent.Client{Addrs: []string{edgeAddr}, Proxy: agent.ProxyURL(p.URL)}
//
// Both skip the test when their command is missing, or fail it under
// TUNNELKIT_REQUIRE_TOOLS=1 (see testtools.Need).
package testproxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// Out is the address the proxies' outgoing connections come from: a
// loopback address other than 127.0.0.1, which Linux has without setup.
var Out = netip.MustParseAddr("127.0.0.2")

// SOCKSUser and SOCKSPassword are the system user, and its password, that
// danted checks the username method against (it reads the system's
// password file). .ci/run creates the user with this password; keep both
// in step.
const (
	SOCKSUser     = "tunnelkit-socks"
	SOCKSPassword = "tunnelkit-socks-test"
)

// Proxy is a proxy running for one test.
type Proxy struct {
	// URL is the proxy's URL, with its credentials if it takes any:
	// http://user:password@127.0.0.1:P, socks5://127.0.0.1:P.
	URL *url.URL
	// Addr is the address it listens on, 127.0.0.1:P.
	Addr string

	proc *testtools.Proc
}

// Log returns what the proxy logged so far.
func (p *Proxy) Log() string { return p.proc.Output() }

// WaitLog waits until the proxy's log holds s, within 30 s.
func (p *Proxy) WaitLog(s string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.proc.WaitOutput(ctx, s)
}

// startTimeout bounds a proxy's start.
const startTimeout = 20 * time.Second

// TinyproxyConfig is the setup of a tinyproxy.
type TinyproxyConfig struct {
	// User and Password, if User is set, are the credentials it takes
	// (BasicAuth), and the others it refuses with 407.
	User, Password string
	// ConnectPorts are the ports CONNECT may reach. Empty: any.
	ConnectPorts []int
	// Timeout closes connections idle for longer, tunnels too; it is
	// rounded up to whole seconds. Zero: tinyproxy's default, 600 s.
	Timeout time.Duration
}

// Tinyproxy starts tinyproxy in the foreground with cfg, and stops it at
// the test's cleanup. Its log (LogLevel Info) notes each CONNECT
// ("Established connection to host") and each connection it closed for
// idling ("Idle Timeout").
func Tinyproxy(t testing.TB, cfg TinyproxyConfig) *Proxy {
	t.Helper()
	testtools.Need(t, "tinyproxy")
	dir := t.TempDir()
	return start(t, "tinyproxy", "Starting main loop", "Could not create listening sockets", func(port int) []string {
		var b strings.Builder
		fmt.Fprintf(&b, "Port %d\nListen 127.0.0.1\nBind %s\nAllow 127.0.0.1\nLogLevel Info\nMaxClients 100\n", port, Out)
		for _, p := range cfg.ConnectPorts {
			fmt.Fprintf(&b, "ConnectPort %d\n", p)
		}
		if cfg.User != "" {
			fmt.Fprintf(&b, "BasicAuth %s %s\n", cfg.User, cfg.Password)
		}
		if cfg.Timeout > 0 {
			fmt.Fprintf(&b, "Timeout %d\n", int((cfg.Timeout+time.Second-1)/time.Second))
		}
		conf := filepath.Join(dir, "tinyproxy.conf")
		write(t, conf, b.String())
		return []string{"-d", "-c", conf}
	}, func(addr string) *url.URL {
		u := &url.URL{Scheme: "http", Host: addr}
		if cfg.User != "" {
			u.User = url.UserPassword(cfg.User, cfg.Password)
		}
		return u
	})
}

// DanteConfig is the setup of a danted.
type DanteConfig struct {
	// Username makes it take the username method alone, with SOCKSUser
	// and SOCKSPassword. danted checks them against the system's password
	// file, so the test needs root and the user (.ci/run creates it):
	// without them it is skipped, or failed under
	// TUNNELKIT_REQUIRE_TOOLS=1. False: no authentication.
	Username bool
}

// Dante starts danted in the foreground with cfg, and stops it at the
// test's cleanup. Its log notes each tunnel ("tcp/connect [") and each
// refused password ("password authentication failed").
func Dante(t testing.TB, cfg DanteConfig) *Proxy {
	t.Helper()
	testtools.Need(t, "danted")
	root := os.Geteuid() == 0
	if cfg.Username {
		if !root {
			testtools.Missing(t, "danted checks SOCKS passwords against the system's password file: the test must run as root")
		}
		if _, err := user.Lookup(SOCKSUser); err != nil {
			testtools.Missing(t, fmt.Sprintf("no system user %s for danted's username method (.ci/run creates it: useradd --system --no-create-home --shell /usr/sbin/nologin %s, and chpasswd with testproxy.SOCKSPassword)", SOCKSUser, SOCKSUser))
		}
	}
	dir := t.TempDir()
	return start(t, "danted", "running", "failed to bind internal addresses", func(port int) []string {
		var b strings.Builder
		fmt.Fprintf(&b, "logoutput: stderr\ninternal: 127.0.0.1 port = %d\nexternal: %s\n", port, Out)
		method := "none"
		if cfg.Username {
			method = "username"
		}
		fmt.Fprintf(&b, "clientmethod: none\nsocksmethod: %s\n", method)
		if root {
			// The password check needs root; the rest runs as nobody.
			b.WriteString("user.privileged: root\nuser.unprivileged: nobody\n")
		}
		b.WriteString("client pass {\n\tfrom: 127.0.0.1/32 to: 0.0.0.0/0\n\tlog: error connect disconnect\n}\n")
		b.WriteString("socks pass {\n\tfrom: 127.0.0.1/32 to: 0.0.0.0/0\n\tcommand: connect\n\tlog: error connect disconnect\n}\n")
		conf := filepath.Join(dir, "danted.conf")
		write(t, conf, b.String())
		return []string{"-f", conf, "-p", filepath.Join(dir, "danted.pid")}
	}, func(addr string) *url.URL {
		u := &url.URL{Scheme: "socks5", Host: addr}
		if cfg.Username {
			u.User = url.UserPassword(SOCKSUser, SOCKSPassword)
		}
		return u
	})
}

// start runs name with the arguments args gives for a free port, until it
// prints ready; a port taken meanwhile (it prints busy and exits) is
// replaced, twice at most.
func start(t testing.TB, name, ready, busy string, args func(port int) []string, proxyURL func(addr string) *url.URL) *Proxy {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		proc := testtools.Start(t, "", name, args(port)...)
		err := proc.WaitOutput(ctx, ready)
		if err == nil {
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			return &Proxy{URL: proxyURL(addr), Addr: addr, proc: proc}
		}
		proc.Stop()
		if attempt < 3 && strings.Contains(proc.Output(), busy) {
			continue
		}
		t.Fatalf("testproxy: %v\n%s", err, proc.Output())
	}
}

// freePort returns a loopback port free now (testtools.FreePort).
func freePort(t testing.TB) int {
	t.Helper()
	p, err := testtools.FreePort(false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t testing.TB, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
