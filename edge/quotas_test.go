package edge_test

// Quotas of endpoints (issue #19, item 3): one identity, the anonymous
// agents of one address, or everyone together cannot make the edge hold
// endpoints without bound; a well-behaved tenant is served meanwhile.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// TestEndpointQuotaPerIdentity: bob binds over two sessions until his
// identity's quota refuses him, on either session; alice binds and is
// served; an endpoint bob lets go frees a place for him.
func TestEndpointQuotaPerIdentity(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	te, _ := tenantEdge(t, &edge.Server{Observer: obs, Limits: edge.Limits{EndpointsPerIdentity: 6, EndpointsPerSession: 5}})
	first, second := tenant(t, te, "bob"), tenant(t, te, "bob")
	for i := range 4 {
		bind(t, first, fmt.Sprintf("http://first%d", i))
	}
	var last *agent.Listener
	for i := range 2 {
		last = bind(t, second, fmt.Sprintf("http://second%d", i))
	}
	for _, c := range []*agent.Client{first, second} {
		// The agent tries a refusal for now again, until its context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Listen(ctx, "http://one-too-many")
		cancel()
		if !errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "this identity") {
			t.Fatalf("bob's bind past his quota: %v, want ErrUnavailable naming the quota per identity", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonIdentityEndpointLimit)); n < 2 {
		t.Fatalf("%d refusals counted as %s, want 2 or more (one per attempt)", n, edge.ReasonIdentityEndpointLimit)
	}
	al := bind(t, tenant(t, te, "alice"), "http://alice")
	serve(t, al, "alice")
	if resp, body := get(t, te, te.url("alice")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("alice beside bob at his quota: %d %q", resp.StatusCode, body)
	}
	last.Close()
	if _, err := second.Listen(context.Background(), "http://again"); err != nil {
		t.Fatalf("bob's bind once one of his endpoints went: %v", err)
	}
}

// TestEndpointQuotaPerSource: anonymous agents from one address, each an
// identity of its own, bind until their address's quota refuses them; an
// anonymous agent from another address binds and is served.
func TestEndpointQuotaPerSource(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	srv := &edge.Server{Domain: "example.test", Observer: obs, Limits: edge.Limits{EndpointsPerSource: 5}}
	te := edgeOn(t, srv, listen(t), listen(t))
	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	go srv.ServeAgents(ln6)
	var agents []*agent.Client
	t.Cleanup(func() {
		for _, c := range agents {
			c.Close()
		}
	})
	for i := range 6 {
		c := &agent.Client{Addrs: []string{te.agentAddr}}
		agents = append(agents, c)
		// The agent tries a refusal for now again, until its context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Listen(ctx, fmt.Sprintf("http://flood%d", i))
		cancel()
		switch {
		case i < 5 && err != nil:
			t.Fatalf("anonymous agent %d: %v", i, err)
		case i == 5 && (!errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "anonymous agents from 127.0.0.1")):
			t.Fatalf("the sixth anonymous agent from one address: %v, want ErrUnavailable naming the quota per source", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonSourceEndpointLimit)); n < 1 {
		t.Fatalf("%d refusals counted as %s, want 1 or more (one per attempt)", n, edge.ReasonSourceEndpointLimit)
	}
	good := &agent.Client{Addrs: []string{ln6.Addr().String()}}
	defer good.Close()
	l := bind(t, good, "http://good")
	serve(t, l, "good")
	if resp, body := get(t, te, te.url("good")+"/", nil); resp.StatusCode != 200 || body != "good /" {
		t.Fatalf("an agent from another address: %d %q", resp.StatusCode, body)
	}
}

// TestEndpointQuotaPerEdge: past the edge's quota every bind is refused,
// whoever asks; the endpoints held are served, and one that goes frees a
// place.
func TestEndpointQuotaPerEdge(t *testing.T) {
	t.Parallel()
	obs := &tally{}
	te, _ := tenantEdge(t, &edge.Server{Observer: obs, Limits: edge.Limits{Endpoints: 4}})
	alice, bob := tenant(t, te, "alice"), tenant(t, te, "bob")
	al := bind(t, alice, "http://alice")
	serve(t, al, "alice")
	var last *agent.Listener
	for i := range 3 {
		last = bind(t, bob, fmt.Sprintf("http://bob%d", i))
	}
	for _, c := range []*agent.Client{alice, bob} {
		// The agent tries a refusal for now again, until its context ends.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := c.Listen(ctx, "http://more")
		cancel()
		if !errors.Is(err, agent.ErrUnavailable) || !strings.Contains(err.Error(), "every agent's together") {
			t.Fatalf("a bind past the edge's quota: %v, want ErrUnavailable naming it", err)
		}
	}
	if n := obs.get("refused/" + string(edge.ReasonEdgeEndpointLimit)); n < 2 {
		t.Fatalf("%d refusals counted as %s, want 2 or more (one per attempt)", n, edge.ReasonEdgeEndpointLimit)
	}
	if resp, body := get(t, te, te.url("alice")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("alice with the edge at its quota: %d %q", resp.StatusCode, body)
	}
	last.Close()
	if _, err := alice.Listen(context.Background(), "http://more"); err != nil {
		t.Fatalf("a bind once an endpoint went: %v", err)
	}
}

// BenchmarkEndpointsAtQuota binds endpoints by hand (no agent-side
// state) until the edge's quotas refuse: one identity up to its own
// (Limits.EndpointsPerIdentity), or identity after identity up to the
// edge's (Limits.Endpoints), with the default quotas. It reports the
// endpoints bound and the edge's heap growth, in all and per endpoint, and
// on Linux the process's resident memory growth (the hand-written agents'
// few sessions included).
// Give it 1x:
//
//	go test ./edge -run '^$' -bench EndpointsAtQuota -benchtime 1x
func BenchmarkEndpointsAtQuota(b *testing.B) {
	for _, c := range []struct {
		name       string
		identities int
	}{{"identity", 1}, {"edge", 1 << 20}} {
		b.Run(c.name, func(b *testing.B) {
			var endpoints, heap, rss float64
			for range b.N {
				rss0 := residentBytes()
				n, grew := bindToQuota(b, c.identities)
				rss += float64(residentBytes() - rss0)
				endpoints += float64(n)
				heap += float64(grew)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(endpoints/float64(b.N), "endpoints")
			b.ReportMetric(heap/float64(b.N)/(1<<20), "heap-MiB")
			b.ReportMetric(heap/endpoints, "heap-B/endpoint")
			if rss != 0 {
				b.ReportMetric(rss/float64(b.N)/(1<<20), "rss-MiB")
			}
		})
	}
}

// bindToQuota binds http endpoints on a new edge, for up to identities
// identities each up to its quota, until the edge's quota refuses, and
// returns how many it bound and how much the heap grew.
func bindToQuota(b *testing.B, identities int) (endpoints int, heapGrowth uint64) {
	srv := &edge.Server{Domain: "example.test", Authenticate: identityIsToken}
	te := edgeOn(b, srv, listen(b), listen(b))
	before := heapAlloc()
	for id := range identities {
		for {
			a, _ := dialRaw(b, te.agentAddr, fmt.Sprint("id", id), "")
			resp := wire.Response{}
			for resp.Error == nil {
				resp = a.bind(fmt.Sprintf("e%d", endpoints), "")
				if resp.Error == nil {
					endpoints++
				}
			}
			switch msg := resp.Error.Message; {
			case strings.Contains(msg, "every agent's together"):
				return endpoints, heapAlloc() - before
			case strings.Contains(msg, "this identity"):
			case strings.Contains(msg, "this session"):
				continue // another session of the identity
			default:
				b.Fatalf("bind %d: %v", endpoints, resp.Error)
			}
			break
		}
	}
	return endpoints, heapAlloc() - before
}

// residentBytes returns the process's resident memory on Linux, and 0
// elsewhere.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, resident int64
	if _, err := fmt.Sscan(string(b), &size, &resident); err != nil {
		return 0
	}
	return resident * int64(os.Getpagesize())
}

// heapAlloc returns the bytes of live heap objects after a collection.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
