//go:build !race

// The race detector allows 8128 live goroutines; this test needs more.
// .ci/run runs it without -race.

package edge_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/router"
)

// TestThousandSessionsThousandClients serves 1,000 agent sessions on one
// edge and 1,000 client connections at once, one per agent, all held open
// until every one has arrived; then everything is closed and released.
func TestThousandSessionsThousandClients(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 sessions")
	}
	const n = 1000
	base := runtime.NumGoroutine()
	rt := &router.MemoryRouter{}
	srv := &edge.Server{Domain: "example.test", Router: rt}
	te := edgeOn(t, srv, listen(t), listen(t))

	var arrived atomic.Int32
	allIn := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == n {
			close(allIn)
		}
		select {
		case <-allIn:
		case <-time.After(60 * time.Second):
		}
		io.WriteString(w, r.Host)
	})
	clients := make([]*agent.Client, n)
	served := make(chan struct{}, n)
	var setup sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		setup.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c := &agent.Client{Addrs: []string{te.agentAddr}}
			clients[i] = c
			l, err := c.Listen(context.Background(), fmt.Sprintf("s%d", i))
			if err != nil {
				t.Error(err)
				return
			}
			go func() { http.Serve(l, handler); served <- struct{}{} }()
		})
	}
	setup.Wait()
	if t.Failed() {
		t.FailNow()
	}

	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, te.httpAddr)
	}}
	hc := &http.Client{Transport: tr, Timeout: 90 * time.Second}
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := range n {
		wg.Go(func() {
			host := fmt.Sprintf("s%d.example.test", i)
			resp, err := hc.Get("http://" + host + "/")
			if err != nil {
				t.Errorf("%s: %v", host, err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(body) == host {
				ok.Add(1)
			} else {
				t.Errorf("%s: %d %q", host, resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	if ok.Load() != n || arrived.Load() != n {
		t.Fatalf("%d of %d served (%d arrived at once)", ok.Load(), n, arrived.Load())
	}

	for _, c := range clients {
		c.Close()
	}
	for range n {
		<-served
	}
	tr.CloseIdleConnections()
	testwait.For(t, func() bool {
		routes, _ := rt.Lookup(context.Background(), "http", "s0.example.test")
		return len(routes) == 0
	})
	testwait.Goroutines(t, base+10) // the edge itself still runs
}
