package edge_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
)

// countingListener counts the conns its Accept returns.
type countingListener struct {
	*agent.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// freshClient is a client of the edge's HTTP port that opens a connection
// for each request: a new stream, so a new choice of a pool's member.
func freshClient(te *testEdge) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
		},
	}}
}

// poolMember binds url as a pool's member with a client of alice's, and
// serves it with f; it returns the listener, which counts its conns.
func poolMember(t *testing.T, te *testEdge, url string, f interface{ Serve(net.Listener) error }) *countingListener {
	t.Helper()
	c := tenant(t, te, "alice")
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: url, Pool: true})
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l}
	done := make(chan struct{})
	go func() { defer close(done); f.Serve(cl) }()
	t.Cleanup(func() { l.Close(); <-done })
	return cl
}

// TestPoolSkipsADeadApp: a pool of two members, one whose app is down:
// not one request fails (GETs, and POSTs of 1 MB whose digest the app
// checks, each on a connection of its own), and the dead member, tried
// once, is then left out; the same for a tcp pool's connections, whose
// first bytes reach the live app intact.
func TestPoolSkipsADeadApp(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{TCPPorts: edge.PortRange{Min: 1024, Max: 65535}})
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		if want := r.Header.Get("Body-Sha256"); want != "" && want != hex.EncodeToString(h.Sum(nil)) {
			http.Error(w, "the body is not whole", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "live %d", n)
	})}
	appLn := listen(t)
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })
	live := poolMember(t, te, "http://p", forward.HTTP{To: appLn.Addr().String()})
	dead := poolMember(t, te, "http://p", forward.HTTP{To: deadAddr(t)})

	client := freshClient(te)
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	sum := sha256.Sum256(body)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			var req *http.Request
			if i%4 == 0 {
				req, _ = http.NewRequest("POST", te.url("p")+"/", bytes.NewReader(body))
				req.Header.Set("Body-Sha256", hex.EncodeToString(sum[:]))
			} else {
				req, _ = http.NewRequest("GET", te.url("p")+"/", nil)
			}
			resp, err := client.Do(req)
			if err != nil {
				failed.Add(1)
				t.Errorf("request %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := "live 0"
			if i%4 == 0 {
				want = fmt.Sprintf("live %d", len(body))
			}
			if resp.StatusCode != 200 || string(b) != want {
				failed.Add(1)
				t.Errorf("request %d: %d %q, want 200 %q", i, resp.StatusCode, b, want)
			}
		})
		if i < 4 {
			wg.Wait() // the first, one by one: round robin tries the dead member among them
		}
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of 200 requests failed", failed.Load())
	}
	// The dead member was tried, and then left out: its conns are the
	// first tries before it was, and at most one probe a cooldown.
	if n := dead.n.Load(); n == 0 || n > 10 {
		t.Errorf("the dead member took %d conns of 200 requests: want it tried, then left out", n)
	}
	t.Logf("live member: %d conns; dead member: %d", live.n.Load(), dead.n.Load())

	// A tcp pool: an echo app, and a dead one.
	echoLn := listen(t)
	go func() {
		for {
			c, err := echoLn.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	port := freePort(t)
	poolMember(t, te, "tcp://:"+port, forward.Bytes{To: echoLn.Addr().String()})
	deadTCP := poolMember(t, te, "tcp://:"+port, forward.Bytes{To: deadAddr(t)})
	for i := range 50 {
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("hello %d\n", i)
		io.WriteString(c, msg) // before the edge chose a member: it waits
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
		c.Close()
		if err != nil || string(got) != msg {
			t.Fatalf("tcp conn %d: %q, %v; want its bytes echoed", i, got, err)
		}
	}
	if n := deadTCP.n.Load(); n == 0 || n > 10 {
		t.Errorf("the dead tcp member took %d conns of 50: want it tried, then left out", n)
	}
}

// TestPoolAllDead: when every member's app is down, the client gets the
// refusal of the last one tried: 502 app_unreachable.
func TestPoolAllDead(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	a := poolMember(t, te, "http://gone", forward.HTTP{To: deadAddr(t)})
	b := poolMember(t, te, "http://gone", forward.HTTP{To: deadAddr(t)})
	resp, body := get(t, te, te.url("gone")+"/", nil)
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != string(edge.ReasonAppUnreachable) || !strings.Contains(body, "app_unreachable") {
		t.Errorf("every member down: %d %q, want 502 app_unreachable", resp.StatusCode, body)
	}
	if a.n.Load() != 1 || b.n.Load() != 1 {
		t.Errorf("the members took %d and %d conns, want one each", a.n.Load(), b.n.Load())
	}
}

// holdConns accepts conns and holds them, reading nothing: an app that
// hangs, whose agent never says whether it took a conn.
type holdConns struct{}

func (holdConns) Serve(l net.Listener) error {
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		held = append(held, c)
	}
}

// TestPoolMemberThatNeverAnswers: a pool's member whose agent never says
// whether its app took a conn holds a request with a body no longer than
// the handshake timeout: the client gets an answer then, not when the
// exchange's idle timeout (an hour here) ends it.
func TestPoolMemberThatNeverAnswers(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{Timeouts: edge.Timeouts{Handshake: time.Second, HTTPIdle: time.Hour}}
	te, _ := tenantEdge(t, srv)
	appLn := listen(t)
	go http.Serve(appLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%d", n)
	}))
	hung := poolMember(t, te, "http://hangs", holdConns{})
	poolMember(t, te, "http://hangs", forward.HTTP{To: appLn.Addr().String()})
	client := freshClient(te)
	client.Timeout = 5 * time.Minute // a hang, not a slow machine, runs into it
	body := strings.Repeat("x", 1000)
	statuses := map[int]int{}
	for range 6 {
		resp, err := client.Post(te.url("hangs")+"/", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatalf("a POST got no answer: %v", err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && string(got) != "1000" {
			t.Errorf("the app got %s bytes of 1000", got)
		}
		statuses[resp.StatusCode]++
	}
	if hung.n.Load() == 0 || statuses[200] == 0 {
		t.Errorf("the hung member took %d conns; statuses %v: want both members tried", hung.n.Load(), statuses)
	}
}
