package etcdrouter

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"

	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/router/etcdrouter/etcdtest"
)

// The etcd server most tests share, started by TestMain, and a client of it.
var (
	sharedEndpoint string
	sharedClient   *clientv3.Client
)

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdrouter-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	srv, err := etcdtest.New(filepath.Join(dir, "etcd"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Stop()
	sharedEndpoint = srv.Endpoint
	// An in-process client: the server's own handlers, called without
	// sockets. Under the race detector, each wake-up of a goroutine by the
	// network poller can wait for a busy P (the contract's lookup loops
	// keep both busy on two cores): a Bind through sockets took ten times
	// longer.
	sharedClient = v3client.New(srv.Etcd().Server)
	defer sharedClient.Close()

	code := m.Run()
	closeBenchRouter()
	if leaked := routerGoroutines(); code == 0 && leaked != "" {
		fmt.Fprintf(os.Stderr, "goroutines of closed Routers are still running:\n%s\n", leaked)
		code = 1
	}
	return code
}

// routerGoroutines returns the stacks of the goroutines running code of a
// Router, or "".
func routerGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "etcdrouter.(*Router)") && !strings.Contains(g, "routerGoroutines") {
			leaked = append(leaked, g)
		}
	}
	return strings.Join(leaked, "\n\n")
}

// newClient returns a client of the etcd server at endpoint, closed when
// the test ends.
func newClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var prefixes atomic.Uint64

// uniquePrefix returns a key prefix no other router of the test run uses.
func uniquePrefix(t testing.TB) string {
	return fmt.Sprintf("/test/%d-%s/", prefixes.Add(1), t.Name())
}

// newRouter returns a Router of cfg, closed when the test ends. Zero fields
// of cfg get the shared client, a prefix of the test's own, the edge ID
// "edge-a" and a logger to t.Log.
func newRouter(t testing.TB, cfg Config) *Router {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = sharedClient
	}
	if cfg.Prefix == "" {
		cfg.Prefix = uniquePrefix(t)
	}
	if cfg.Edge == "" {
		cfg.Edge = "edge-a"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// testLogger logs to t.Log, and to also if it is not nil.
func testLogger(t testing.TB, also *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t, also}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct {
	t    testing.TB
	also *logBuffer
}

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	if w.also != nil {
		w.also.Write(p)
	}
	return len(p), nil
}

// logBuffer is a goroutine-safe log.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Calls of a Router's methods with a timeout, failing the test on an error.

const callTimeout = 10 * time.Second

func bind(t testing.TB, r *Router, rt router.Route) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := r.Bind(ctx, rt); err != nil {
		t.Fatalf("Bind(%+v) through %s = %v", rt, r.edge, err)
	}
}

func tryBind(r *Router, rt router.Route) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return r.Bind(ctx, rt)
}

func unbind(t testing.TB, r *Router, rt router.Route, reserve time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := r.Unbind(ctx, rt, reserve); err != nil {
		t.Fatalf("Unbind(%+v) through %s = %v", rt, r.edge, err)
	}
}

func lookup(t testing.TB, r *Router, proto, host string) []router.Route {
	t.Helper()
	routes, err := r.Lookup(context.Background(), proto, host)
	if err != nil {
		t.Fatalf("Lookup(%q, %q) through %s = %v", proto, host, r.edge, err)
	}
	return routes
}

// sees reports whether r's Lookup(proto, host) returns exactly want.
func sees(t testing.TB, r *Router, proto, host string, want ...router.Route) func() bool {
	return func() bool {
		got := lookup(t, r, proto, host)
		if len(got) != len(want) {
			return false
		}
		for i := range got {
			if got[i] != want[i] {
				return false
			}
		}
		return true
	}
}

// at returns rt as Lookup returns it from edge id: its Edge set.
func at(rt router.Route, id string) router.Route {
	rt.Edge = id
	return rt
}

// cutProxy forwards TCP connections to an address until cut, which closes
// them all and refuses new ones until restore.
type cutProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	cutOff   bool
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

// newCutProxy starts a proxy to upstream ("host:port"), stopped when the
// test ends.
func newCutProxy(t testing.TB, upstream string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) endpoint() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, up) {
			continue
		}
		p.wg.Go(func() { io.Copy(up, c); up.Close() })
		p.wg.Go(func() { io.Copy(c, up); c.Close() })
	}
}

// track records a proxied pair, or closes it while the proxy is cut.
func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if p.cutOff {
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
	}
	return !p.cutOff
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutOff = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

func (p *cutProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutOff = false
}
