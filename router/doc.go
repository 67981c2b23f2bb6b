// Package router decides where public traffic goes, and who owns which
// name: the routing domain of a tunnel edge, apart from the edge itself so
// that a Router over a shared store (router/etcdrouter) builds without the
// edge's server.
//
// It holds:
//
//   - [Route] and [Router]: an endpoint an agent bound, as plain data, and
//     the contract a routing store implements: Bind and Unbind under the
//     ownership rules (one namespace for host names, a name owns its tree,
//     pools by consent, reservations, atomicity, the operator's
//     reservations), Lookup in the order to try. [HealthReporter],
//     [RouteWatcher], [MemberChecker], [Reserver] (the operator's
//     reservations) and [Revoker] (identities revoked) are its optional
//     extensions; package
//     router/routertest checks an implementation against the contract.
//   - [MemoryRouter]: the in-memory Router an edge uses by default.
//   - [Table]: a lock-free routing table from host names and wildcards to
//     pools of backends, round robin with failover, usable alone (an L4
//     proxy's SNI table) and under MemoryRouter.
//   - [RouteFeed]: delivers route changes to a RouteWatcher's callback.
//
// # Tables
//
// A [Table] maps exact names ("app.example.test") and wildcards
// ("*.example.test") to one or more backends of any comparable type: an
// address string for an L4 proxy, a session for a tunnel edge. Lookups are
// case-insensitive, ignore one trailing dot, prefer an exact name to a
// wildcard and a longer wildcard to a shorter one. Backends of a name are
// handed out round robin; a backend the caller reports as failed is skipped
// for [Table.Cooldown] and then tried again, for twice as long after each
// outage in a row (up to [MaxCooldownFactor] times), until it succeeds.
//
// Typical use, with failover past a backend that refuses:
//
//	var t router.Table[string]
//	t.Add("app.example.test", "127.0.0.1:9001")
//	t.Add("app.example.test", "127.0.0.1:9002")
//	for addr := range t.Backends("APP.example.test.") {
//		c, err := net.Dial("tcp", addr)
//		if err != nil {
//			t.Fail(addr) // skipped by later lookups for a while
//			continue
//		}
//		// use c
//		break
//	}
//
// A name may also hold pools under path prefixes ([Table.AddAt]): a
// request's backends ([Table.BackendsAt]) are those of the longest prefix
// its path is under, on segment boundaries, in CleanPath's form, else the
// name's own; a lookup costs the same however many paths the name has.
//
// Reads take no lock: each name's pool of backends is immutable, replaced as
// a whole by writers, which are serialised. A write costs the size of the one
// pool it changes (and of the name's list of paths), not the size of the
// table.
package router
