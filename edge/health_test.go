package edge_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// healthWatch keeps the health events of an edge.
type healthWatch struct {
	mu     sync.Mutex
	events []view.Event
}

func (w *healthWatch) see(e view.Event) {
	if e.Kind == view.Health {
		w.mu.Lock()
		w.events = append(w.events, e)
		w.mu.Unlock()
	}
}

// count returns how many health events of url said what starts with msg.
func (w *healthWatch) count(url, msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.events {
		if e.URL == url && strings.HasPrefix(e.Message, msg) {
			n++
		}
	}
	return n
}

// downCounter is an Observer that counts the endpoints down (a
// HealthObserver).
type downCounter struct {
	tally
	down atomic.Int64
}

func (d *downCounter) EndpointDown(_ string, down bool) {
	if down {
		d.down.Add(1)
	} else {
		d.down.Add(-1)
	}
}

// healthOf returns the health the edge shows of the endpoint of tunnel.
func healthOf(srv *edge.Server, tunnel string) string {
	for _, e := range srv.Endpoints() {
		if e.Tunnel == tunnel {
			return e.Health
		}
	}
	return "gone"
}

// TestHealthChecks: two members of a pool whose agents check their apps.
// A member is routed to only once its first check passed; one whose app
// goes down is left out, and its requests go to the other, none failing;
// when both are down, clients get 503 app_unhealthy with Retry-After (the
// interval times healthy_after); an app back up is served again. The
// edge's view, events and Observer show each change.
func TestHealthChecks(t *testing.T) {
	t.Parallel()
	obs := &downCounter{}
	srv := &edge.Server{Observer: obs}
	te, _ := tenantEdge(t, srv)
	watch := &healthWatch{}
	defer srv.Watch(watch.see)()
	var healthy [2]atomic.Bool
	var checks [2]atomic.Int64
	var tunnels [2]string
	var url string
	for i := range 2 {
		healthy[i].Store(true)
		c := tenant(t, te, "alice")
		l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://h", Pool: true, HealthCheck: &agent.HealthCheck{
			Check: func(context.Context) error {
				checks[i].Add(1)
				if !healthy[i].Load() {
					return errors.New("the app says it is sick")
				}
				return nil
			},
			Interval: time.Second, Timeout: 500 * time.Millisecond, UnhealthyAfter: 2, HealthyAfter: 2,
		}})
		if err != nil {
			t.Fatal(err)
		}
		url = l.URL()
		for _, e := range srv.Endpoints() {
			if e.URL == url && (i == 0 || e.Tunnel != tunnels[0]) {
				tunnels[i] = e.Tunnel
			}
		}
		serve(t, l, string(rune('a'+i)))
	}
	for i := range 2 {
		testwait.Within(t, 30*time.Second, "member up", func() bool { return healthOf(srv, tunnels[i]) == view.HealthUp })
	}
	client := freshClient(te)
	answers := func(n int) map[string]int {
		got := map[string]int{}
		for range n {
			resp, err := client.Get(url + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got[resp.Status+" "+string(body)]++
		}
		return got
	}
	if got := answers(20); got["200 OK a /"] == 0 || got["200 OK b /"] == 0 || len(got) != 2 {
		t.Fatalf("both up: %v, want both members", got)
	}

	// Member a's app goes down: a is left out, no request fails.
	healthy[0].Store(false)
	testwait.Within(t, 30*time.Second, "member a down", func() bool { return healthOf(srv, tunnels[0]) == view.HealthDown })
	if got := answers(20); got["200 OK b /"] != 20 {
		t.Errorf("a down: %v, want all from b", got)
	}
	if n := obs.down.Load(); n != 1 {
		t.Errorf("the Observer counts %d endpoints down, want 1", n)
	}

	// Both down: 503 app_unhealthy with Retry-After.
	healthy[1].Store(false)
	testwait.Within(t, 30*time.Second, "member b down", func() bool { return healthOf(srv, tunnels[1]) == view.HealthDown })
	resp, body := get(t, te, url+"/", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Tunnelkit-Error") != "app_unhealthy" || resp.Header.Get("Retry-After") != "2" || !strings.Contains(body, "app_unhealthy: the app behind the tunnel is down") {
		t.Errorf("both down: %d %q Retry-After %q, want 503 app_unhealthy, Retry-After 2", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}

	// a comes back: served again, after healthy_after checks.
	healthy[0].Store(true)
	testwait.Within(t, 30*time.Second, "member a up again", func() bool { return healthOf(srv, tunnels[0]) == view.HealthUp })
	if got := answers(10); got["200 OK a /"] != 10 {
		t.Errorf("a up again, b down: %v, want all from a", got)
	}
	if watch.count(url, "down") < 2 || watch.count(url, "up") < 3 {
		t.Errorf("health events: %d down, %d up; want 2 and 3 at least", watch.count(url, "down"), watch.count(url, "up"))
	}
	healthy[1].Store(true)
	testwait.Within(t, 30*time.Second, "member b up again", func() bool { return healthOf(srv, tunnels[1]) == view.HealthUp })
	if n := obs.down.Load(); n != 0 {
		t.Errorf("the Observer counts %d endpoints down, want 0", n)
	}
}

// TestHealthCheckFlaps: a check that fails, passes, fails... never fails
// unhealthy_after (2) times in a row: the member stays up.
func TestHealthCheckFlaps(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{}
	te, _ := tenantEdge(t, srv)
	watch := &healthWatch{}
	defer srv.Watch(watch.see)()
	var n atomic.Int64
	c := tenant(t, te, "alice")
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://flaps", HealthCheck: &agent.HealthCheck{
		Check: func(context.Context) error {
			if n.Add(1)%2 == 0 {
				return errors.New("a hiccup")
			}
			return nil
		},
		Interval: time.Second, UnhealthyAfter: 2, HealthyAfter: 2, Timeout: 500 * time.Millisecond,
	}})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, "flaps")
	testwait.Within(t, 30*time.Second, "six checks", func() bool { return n.Load() >= 6 })
	if watch.count(l.URL(), "down") != 0 || healthOf(srv, tunnelOf(t, srv, l.URL())) != view.HealthUp {
		t.Errorf("a flapping check: %d down events, health %q; want none, and up", watch.count(l.URL(), "down"), healthOf(srv, tunnelOf(t, srv, l.URL())))
	}
	if resp, body := get(t, te, l.URL()+"/", nil); resp.StatusCode != 200 || body != "flaps /" {
		t.Errorf("the flapping member: %d %q", resp.StatusCode, body)
	}
}

// TestHealthCheckRefusals: what a HealthCheck may not be, refused before
// the bind, naming what is wrong.
func TestHealthCheckRefusals(t *testing.T) {
	t.Parallel()
	te, _ := tenantEdge(t, &edge.Server{})
	c := tenant(t, te, "alice")
	ok := func(context.Context) error { return nil }
	for _, hc := range []agent.HealthCheck{
		{},
		{Check: ok, Interval: 500 * time.Millisecond},
		{Check: ok, Interval: 2 * time.Second, Timeout: 2 * time.Second},
		{Check: ok, UnhealthyAfter: -1},
	} {
		_, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://x", HealthCheck: &hc})
		if !errors.Is(err, agent.ErrHealthCheck) {
			t.Errorf("%+v: %v, want ErrHealthCheck", hc, err)
		}
	}
}

// TestHealthDownThenUnchecked: an endpoint whose app is down, changed in
// place (Listener.Update) into one without a check, is no longer counted
// down by the Observer, and is routed to again.
func TestHealthDownThenUnchecked(t *testing.T) {
	t.Parallel()
	obs := &downCounter{}
	srv := &edge.Server{Observer: obs}
	te, _ := tenantEdge(t, srv)
	c := tenant(t, te, "alice")
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://sick", HealthCheck: &agent.HealthCheck{
		Check:    func(context.Context) error { return errors.New("down for good") },
		Interval: time.Second, Timeout: 500 * time.Millisecond, UnhealthyAfter: 1, HealthyAfter: 1,
	}})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, "sick")
	testwait.Within(t, 30*time.Second, "the endpoint down", func() bool { return obs.down.Load() == 1 })
	if resp, _ := get(t, te, l.URL()+"/", nil); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("down: %d, want 503", resp.StatusCode)
	}
	if err := l.Update(context.Background(), agent.Endpoint{URL: "http://sick"}); err != nil {
		t.Fatal(err)
	}
	if n := obs.down.Load(); n != 0 {
		t.Errorf("changed into an endpoint without a check, the Observer counts %d endpoints down, want 0", n)
	}
	if resp, body := get(t, te, l.URL()+"/", nil); resp.StatusCode != 200 || body != "sick /" {
		t.Errorf("without a check: %d %q, want the app", resp.StatusCode, body)
	}
}
