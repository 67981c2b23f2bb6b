package edge_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// tally is an edge.Observer that keeps every count by name.
type tally struct {
	mu sync.Mutex
	n  map[string]int64
}

func (t *tally) add(k string, d int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = map[string]int64{}
	}
	t.n[k] += d
}

func (t *tally) get(k string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[k]
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var s []string
	for k, v := range t.n {
		s = append(s, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func (t *tally) Session(d int)            { t.add("sessions", int64(d)) }
func (t *tally) Endpoint(p string, d int) { t.add("endpoints/"+p, int64(d)) }
func (t *tally) Stream(d int)             { t.add("streams", int64(d)) }
func (t *tally) Conn(p string)            { t.add("conns/"+p, 1) }
func (t *tally) Bytes(p string, in, out int64) {
	t.add("in/"+p, in)
	t.add("out/"+p, out)
}
func (t *tally) Request(p string, status int, _ time.Duration) {
	t.add(fmt.Sprintf("requests/%s/%dxx", p, status/100), 1)
}
func (t *tally) Refused(reason edge.Reason) { t.add("refused/"+string(reason), 1) }

// TestObserverCounts: the Observer hears of sessions, endpoints, streams,
// connections, bytes, requests by status class and refusals by reason,
// and the gauges come back to zero when everything ends.
func TestObserverCounts(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	e := startHTTPSEdge(t, func(s *edge.Server) {
		s.Observer = obs
		s.Authenticate = func(_ context.Context, token string) (string, error) {
			if token == "bad" {
				return "", fmt.Errorf("bad token")
			}
			return "id-" + token, nil
		}
	})
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "good"}
	l, err := c.Listen(context.Background(), "https://app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 1000))
	}))
	pl, err := c.Listen(context.Background(), "http://plain")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(pl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "nope", http.StatusServiceUnavailable) }))

	for range 3 {
		mustRead(t)(e.client(t, true).Get("https://app.example.test/"))
	}
	mustRead(t)(e.plainClient(t, false).Post("http://plain.example.test/", "text/plain", strings.NewReader("12345")))
	mustRead(t)(e.plainClient(t, false).Get("http://nobody.example.test/"))
	if conn, err := net.Dial("tcp", e.tlsAddr); err == nil { // a TLS name nobody bound
		conn.Write(clientHelloFor(t, "nobody.example.test"))
		conn.Close()
	}
	bad := &agent.Client{Addrs: []string{e.agentAddr}, Token: "bad"}
	bad.Listen(context.Background(), "http://x")
	bad.Close()

	testwait.For(t, func() bool { return obs.get("refused/no_route") == 1 && obs.get("refused/auth") >= 1 })
	for k, want := range map[string]int64{
		"sessions":            1,
		"endpoints/https":     1,
		"endpoints/http":      1,
		"requests/https/2xx":  3,
		"requests/http/5xx":   1,
		"requests/http/4xx":   1,
		"out/https":           3000,
		"in/http":             5,
		"refused/no_endpoint": 1,
		"conns/https":         3,
	} {
		if got := obs.get(k); got != want {
			t.Errorf("%s = %d, want %d\n%s", k, got, want, obs)
		}
	}
	c.Close()
	testwait.For(t, func() bool {
		return obs.get("sessions") == 0 && obs.get("endpoints/https") == 0 && obs.get("endpoints/http") == 0 && obs.get("streams") == 0
	})
}
