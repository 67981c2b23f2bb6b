package routertest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tunnelkit/tunnelkit/router"
)

// rounds is how many times each race of testAtomicity is run.
const rounds = 200

// testAtomicity checks rule 5: of Binds racing for conflicting names on
// behalf of different identities, exactly one succeeds, every time; and
// racing Binds of one identity into a pool all succeed.
func testAtomicity(t *testing.T, newRouter makeRouter) {
	races := []struct {
		name string
		rule string
		// routes returns the racing routes of round i, one per identity,
		// on names no earlier round used.
		routes func(i int) []router.Route
	}{
		{"SameName", rule2, func(i int) []router.Route {
			n := fmt.Sprintf("r%d.example.test", i)
			return []router.Route{route("id0", "http", n), route("id1", "http", n), route("id2", "http", n), route("id3", "http", n)}
		}},
		{"SameNameAllPooling", rule3, func(i int) []router.Route {
			n := fmt.Sprintf("r%d.example.test", i)
			return []router.Route{pooled("id0", "http", n), pooled("id1", "http", n), pooled("id2", "http", n), pooled("id3", "http", n)}
		}},
		{"AcrossProtocols", rule1, func(i int) []router.Route {
			n := fmt.Sprintf("r%d.example.test", i)
			return []router.Route{route("id0", "http", n), route("id1", "tls", n), route("id2", "https", n), pooled("id3", "tls", n)}
		}},
		{"WildcardAndNameUnder", rule2, func(i int) []router.Route {
			return []router.Route{
				route("id0", "http", fmt.Sprintf("*.r%d.example.test", i)),
				route("id1", "http", fmt.Sprintf("x.r%d.example.test", i)),
			}
		}},
		{"Tree", rule1 + " and " + rule2, func(i int) []router.Route {
			return []router.Route{
				route("id0", "http", fmt.Sprintf("*.r%d.example.test", i)),
				route("id1", "tls", fmt.Sprintf("x.r%d.example.test", i)),
				route("id2", "https", fmt.Sprintf("r%d.example.test", i)),
				route("id3", "http", fmt.Sprintf("*.a.x.r%d.example.test", i)),
			}
		}},
		{"TCPPort", ruleTCP, func(i int) []router.Route {
			n := fmt.Sprint(20001 + i)
			return []router.Route{route("id0", "tcp", n), route("id1", "tcp", n), route("id2", "tcp", n)}
		}},
	}
	for _, race := range races {
		t.Run(race.name, func(t *testing.T) {
			h := newHarness(t, newRouter)
			rule := rule5 + " with " + race.rule
			for i := range rounds {
				routes := race.routes(i)
				errs := bindAtOnce(h, routes)
				var won []router.Route
				for j, err := range errs {
					switch {
					case err == nil:
						won = append(won, routes[j])
					case !errors.Is(err, router.ErrNameTaken):
						t.Fatalf("%s: round %d: Bind(%s) = %v; want success or an error wrapping router.ErrNameTaken", rule, i, desc(routes[j]), err)
					}
				}
				if len(won) != 1 {
					t.Fatalf("%s: round %d: of racing Binds of conflicting names by different identities %s, %d succeeded: %s; want exactly one",
						rule, i, descAll(routes), len(won), descAll(won))
				}
				// Only the winner's route is visible, wherever a loser
				// would have been.
				for _, r := range routes {
					host := hostOf(normalise(r.Name))
					for _, got := range h.lookup(r.Proto, host) {
						if got.Identity != won[0].Identity {
							t.Fatalf("%s: round %d: after %s won, Lookup(%q, %q) returned %s, whose Bind failed",
								rule, i, desc(won[0]), r.Proto, host, desc(got))
						}
					}
				}
			}
		})
	}
	t.Run("SameIdentityPool", func(t *testing.T) {
		h := newHarness(t, newRouter)
		for i := range rounds / 4 {
			name := fmt.Sprintf("p%d.example.test", i)
			routes := make([]router.Route, 8)
			for j := range routes {
				routes[j] = pooled(alice, "http", name)
			}
			for j, err := range bindAtOnce(h, routes) {
				if err != nil {
					t.Fatalf("%s with %s: round %d: racing Binds of one identity into a pool: Bind(%s) = %v; want success",
						rule5, rule3, i, desc(routes[j]), err)
				}
			}
			h.expect(rule5+" with "+rule3+": every racing Bind into the pool", "http", name, routes...)
		}
	})
}

// bindAtOnce binds routes from a goroutine each, released together, and
// returns their errors.
func bindAtOnce(h *harness, routes []router.Route) []error {
	errs := make([]error, len(routes))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range routes {
		wg.Go(func() {
			<-start
			errs[i] = h.Bind(r)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// testConcurrentLookups runs lookups against binds and unbinds of several
// identities, some in their own trees, some contending for the same tree,
// and checks that every lookup is consistent: routes of one pattern, one
// proto and one identity, each bound by that identity, and never one whose
// Bind failed. Run it with -race.
func testConcurrentLookups(t *testing.T, newRouter makeRouter) {
	h := newHarness(t, newRouter)
	identities := []string{alice, bob, carol}
	// Each identity binds in a tree of its own; all contend for the
	// shared tree.
	patterns := func(id string) []string {
		return []string{
			id + ".example.test", "*." + id + ".example.test", "x." + id + ".example.test",
			"shared.example.test", "*.shared.example.test", "x.shared.example.test",
		}
	}
	hosts := []string{"shared.example.test", "x.shared.example.test", "y.shared.example.test", "a.x.shared.example.test"}
	for _, id := range identities {
		hosts = append(hosts, id+".example.test", "x."+id+".example.test", "y."+id+".example.test")
	}
	protos := []string{"http", "tls"}

	var (
		attempted sync.Map // TunnelID to the route a writer tried to bind
		refused   sync.Map // TunnelID of a route whose Bind failed
		seen      sync.Map // TunnelID of a route a lookup returned
		stop      atomic.Bool
		failed    atomic.Bool
		writers   sync.WaitGroup
		readers   sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
		}
	}
	bound := make([][]router.Route, len(identities))
	for w, id := range identities {
		writers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			mine := patterns(id)
			for range 300 {
				if failed.Load() {
					return
				}
				if len(bound[w]) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(bound[w]))
					r := bound[w][i]
					bound[w] = append(bound[w][:i], bound[w][i+1:]...)
					if err := h.Unbind(r, 0); err != nil {
						fail("Unbind(%s) = %v", desc(r), err)
						return
					}
					continue
				}
				r := route(id, protos[rng.IntN(len(protos))], mine[rng.IntN(len(mine))])
				r.Pool = rng.IntN(4) != 0
				attempted.Store(r.TunnelID, r)
				switch err := h.Bind(r); {
				case err == nil:
					bound[w] = append(bound[w], r)
				case errors.Is(err, router.ErrNameTaken):
					refused.Store(r.TunnelID, true)
				default:
					fail("Bind(%s) = %v; want success or an error wrapping router.ErrNameTaken", desc(r), err)
					return
				}
			}
		})
	}
	// Two readers: on a machine of two cores, more take turns rather
	// than run beside the writers, and only burn what they slow down.
	for i := range 2 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			for !stop.Load() && !failed.Load() {
				proto, host := protos[rng.IntN(len(protos))], hosts[rng.IntN(len(hosts))]
				routes, err := h.Lookup(proto, host)
				if err != nil {
					fail("Lookup(%q, %q) = %v", proto, host, err)
					return
				}
				if msg := inconsistent(&attempted, proto, host, routes); msg != "" {
					fail("%s: Lookup(%q, %q) during concurrent Binds and Unbinds = %s", msg, proto, host, descAll(routes))
					return
				}
				for _, r := range routes {
					seen.Store(r.TunnelID, true)
				}
			}
		})
	}
	writers.Wait()
	stop.Store(true)
	readers.Wait()
	if failed.Load() {
		return
	}
	seen.Range(func(id, _ any) bool {
		if _, ok := refused.Load(id); ok {
			r, _ := attempted.Load(id)
			t.Errorf("%s: a concurrent Lookup returned %s, whose Bind failed", rule5, desc(r.(router.Route)))
		}
		return true
	})

	// Every route unbound, every lookup finds nothing.
	for w := range identities {
		for _, r := range bound[w] {
			h.unbind(r, 0)
		}
	}
	for _, proto := range protos {
		for _, host := range hosts {
			h.expect(ruleUnbind+": every route went", proto, host)
		}
	}
}

// inconsistent returns what is wrong with routes as a result of
// Lookup(proto, host), naming the rule broken, or "": they must be of
// proto, of one pattern matching host and of one identity, each as its
// identity bound it.
func inconsistent(attempted *sync.Map, proto, host string, routes []router.Route) string {
	for _, r := range routes {
		a, ok := attempted.Load(r.TunnelID)
		switch {
		case !ok:
			return fmt.Sprintf("Lookup: %s was never bound", desc(r))
		case !sameRoute(r, a.(router.Route)):
			return fmt.Sprintf("Lookup: %s is not the route bound, %s", desc(r), desc(a.(router.Route)))
		case r.Proto != proto:
			return fmt.Sprintf("Lookup (routes of proto only): %s is of another proto", desc(r))
		case !covers(r.Name, host):
			return fmt.Sprintf("Lookup (a pattern matching host): %s does not match %q", desc(r), host)
		case r.Name != routes[0].Name:
			return "Lookup (the routes of one pattern): routes of several patterns"
		case r.Identity != routes[0].Identity:
			return rule2 + " and " + rule3 + ": a pool of several identities"
		}
	}
	return ""
}
