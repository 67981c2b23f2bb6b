package etcdrouter

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// benchRoutes is how many routes the benchmarks' cache holds: one in ten a
// wildcard, the others exact names, of 1,000 identities.
const benchRoutes = 100_000

// benchCache is a Router whose cache holds benchRoutes routes, made once
// for the benchmarks that share it, and the heap the cache took.
var benchCache struct {
	once          sync.Once
	r             *Router
	err           error
	bytesPerRoute float64
	load          time.Duration
}

// benchRoute is the i-th route of the benchmarks' cache.
func benchRoute(i int) router.Route {
	name := fmt.Sprintf("h%d.example.test", i)
	if i%10 == 0 {
		name = fmt.Sprintf("*.w%d.example.test", i)
	}
	return router.Route{
		Proto:     "http",
		Name:      name,
		Identity:  fmt.Sprintf("identity-%d", i%1000),
		Edge:      fmt.Sprintf("edge-%d", i%4),
		SessionID: fmt.Sprintf("session-%d", i/2),
		TunnelID:  fmt.Sprintf("tunnel-%d", i),
	}
}

// loadBenchCache writes benchRoutes routes directly into etcd, in
// transactions of 128 puts (etcd's default limit), then starts a Router
// that loads them, measuring the heap its cache takes.
func loadBenchCache() (*Router, float64, time.Duration, error) {
	const prefix = "/bench/lookup/"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := sharedClient.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		return nil, 0, 0, err
	}
	keyer := &Router{prefix: prefix}
	ops := make([]clientv3.Op, 0, 128)
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := sharedClient.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	for i := range benchRoutes {
		rt := benchRoute(i)
		ops = append(ops, clientv3.OpPut(keyer.keysOf(rt).route, encode(rt)))
		if len(ops) == cap(ops) {
			if err := flush(); err != nil {
				return nil, 0, 0, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, 0, 0, err
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	r, err := New(ctx, Config{Client: sharedClient, Prefix: prefix, Edge: "bench"})
	if err != nil {
		return nil, 0, 0, err
	}
	took := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	r.mu.Lock()
	n := len(r.allLocked())
	r.mu.Unlock()
	if n != benchRoutes {
		r.Close()
		return nil, 0, 0, fmt.Errorf("the cache holds %d routes; want %d", n, benchRoutes)
	}
	return r, float64(after.HeapAlloc-before.HeapAlloc) / benchRoutes, took, nil
}

func benchRouter(b *testing.B) *Router {
	benchCache.once.Do(func() {
		benchCache.r, benchCache.bytesPerRoute, benchCache.load, benchCache.err = loadBenchCache()
	})
	if benchCache.err != nil {
		b.Fatal(benchCache.err)
	}
	return benchCache.r
}

// closeBenchRouter closes the benchmarks' Router, if they made one.
func closeBenchRouter() {
	if benchCache.r != nil {
		benchCache.r.Close()
	}
}

// benchMemory is an router.MemoryRouter holding the routes of benchCache,
// to compare with.
var benchMemory struct {
	once          sync.Once
	m             *router.MemoryRouter
	bytesPerRoute float64
}

func benchMemoryRouter(b *testing.B) *router.MemoryRouter {
	benchMemory.once.Do(func() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m := new(router.MemoryRouter)
		for i := range benchRoutes {
			if err := m.Bind(context.Background(), benchRoute(i)); err != nil {
				panic(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		benchMemory.m = m
		benchMemory.bytesPerRoute = float64(after.HeapAlloc-before.HeapAlloc) / benchRoutes
	})
	return benchMemory.m
}

// BenchmarkLookup looks names up in a cache of 100,000 routes: an exact
// name, a name under a wildcard, a name no route matches; and the same in
// an router.MemoryRouter holding the same routes, which uses the same table.
func BenchmarkLookup(b *testing.B) {
	r := benchRouter(b)
	m := benchMemoryRouter(b)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		host  func(i int) string
		found bool
	}{
		{"Exact", func(i int) string { return fmt.Sprintf("h%d.example.test", 10*i+1) }, true},
		{"Wildcard", func(i int) string { return fmt.Sprintf("x.w%d.example.test", 10*i) }, true},
		{"Miss", func(i int) string { return fmt.Sprintf("nobody%d.example.test", i) }, false},
	} {
		hosts := make([]string, benchRoutes/10)
		for i := range hosts {
			hosts[i] = c.host(i)
		}
		for _, rt := range []struct {
			name string
			r    router.Router
		}{{"etcd", r}, {"MemoryRouter", m}} {
			b.Run(rt.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					routes, _ := rt.r.Lookup(ctx, "http", hosts[i%len(hosts)])
					if (len(routes) == 1) != c.found {
						b.Fatalf("Lookup(%q) = %v", hosts[i%len(hosts)], routes)
					}
					i++
				}
			})
		}
	}
}

// BenchmarkCacheMemory reports the heap the cache takes per route, with
// 100,000 routes in it, and how long New took to load them; and, to
// compare, the heap an router.MemoryRouter takes per route for the same
// routes (its tables and its ownership index).
func BenchmarkCacheMemory(b *testing.B) {
	benchRouter(b)
	benchMemoryRouter(b)
	for b.Loop() {
	}
	b.ReportMetric(benchCache.bytesPerRoute, "B/route")
	b.ReportMetric(benchMemory.bytesPerRoute, "B/route-MemoryRouter")
	b.ReportMetric(benchCache.load.Seconds(), "s-load")
}

// BenchmarkBind binds routes of new names through etcd, one at a time.
func BenchmarkBind(b *testing.B) {
	r := newRouter(b, Config{})
	i := 0
	for b.Loop() {
		bind(b, r, router.Route{Proto: "http", Name: fmt.Sprintf("b%d.example.test", i), Identity: "alice", SessionID: "s", TunnelID: fmt.Sprint(i)})
		i++
	}
}
