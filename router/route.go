package router

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Route is an endpoint an agent bound: where public traffic for a name goes.
// It is plain data, so a Router can keep it in a shared store and a Dialer
// can reach an agent held by another edge.
type Route struct {
	Proto string // "http", "https", "tls" or "tcp"
	// Name is the public host name or wildcard of an HTTP or TLS endpoint
	// ("abc.example.test", "*.abc.example.test"), or the port of a TCP
	// endpoint in decimal ("20001").
	Name      string
	TunnelID  string // the endpoint within its session
	SessionID string // the agent session that bound it
	Identity  string // who owns Name: the agent's authenticated identity
	Edge      string // the edge holding the session; empty: this one
	// Path is the path prefix of an http or https route under Name
	// ("/api", as NormalisePath returns it): the route takes the requests
	// for Name whose cleaned path (CleanPath) is Path or under it, on
	// segment boundaries, unless a route with a longer Path of the name
	// takes them. Empty: the whole name, the fallback. Pools and
	// reservations are per Proto, Name and Path; ownership is per name.
	Path string
	// StripPrefix asks the edge to send the app the request's path
	// without Path (always starting with "/"), with X-Forwarded-Prefix
	// set to Path. A pool's routes agree on it (rule 3).
	StripPrefix bool
	// Pool asks Bind to add r beside the routes the same identity already
	// has for Name, rather than fail with ErrNameTaken.
	Pool bool
	// AppProtocol is what the edge speaks to the app of an http or https
	// route: "" for HTTP/1.1, "h2c" for HTTP/2 with prior knowledge.
	AppProtocol string
	// Policy is the traffic policy the agent declared with the endpoint:
	// the JSON form of a policy.Spec (package policy), as the edge that
	// took the bind wrote it. Empty: none. Every edge that takes public
	// traffic for the route enforces it, so a Router shared between edges
	// stores it with the route. It holds the policy's secrets (passwords,
	// OIDC client secrets, webhook secrets): the store of a shared Router
	// must be protected as the secrets are (for etcd: TLS with client
	// certificates, and its access control). A Route logs without it (see
	// LogValue); do not print it otherwise.
	Policy string
	// VerboseErrors shows the public what went wrong (a dial error, an
	// address) in the error pages of an http or https route, for
	// development; false: the pages say what happened in words, the
	// detail in the edge's log only.
	VerboseErrors bool
	// Admits says that the agent tells, on each stream of the route, that
	// its app took the connection as soon as it did (a pooled endpoint of
	// a session of protocol version 5, wire.AdmitVersion): an edge holds a
	// request's body, or a connection's bytes, until then, and sends them
	// to another route of the pool when the agent rejects the stream.
	Admits bool
}

// LogValue makes a Route log (with log/slog) as its fields, but for its
// Policy, which holds secrets: only its length is logged.
func (r Route) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("proto", r.Proto),
		slog.String("name", r.Name),
		slog.String("tunnel", r.TunnelID),
		slog.String("session", r.SessionID),
		slog.String("identity", r.Identity),
		slog.String("edge", r.Edge),
		slog.Bool("pool", r.Pool),
		slog.String("app_protocol", r.AppProtocol),
	}
	if r.Path != "" {
		attrs = append(attrs, slog.String("path", r.Path), slog.Bool("strip_prefix", r.StripPrefix))
	}
	if r.Policy != "" {
		attrs = append(attrs, slog.Int("policy_bytes", len(r.Policy)))
	}
	if r.VerboseErrors {
		attrs = append(attrs, slog.Bool("verbose_errors", true))
	}
	return slog.GroupValue(attrs...)
}

// RouteKey identifies a route within its Proto and Name: the edge, the
// session and the endpoint of the session it belongs to.
type RouteKey struct{ Edge, Session, Tunnel string }

// Key returns r's RouteKey.
func (r Route) Key() RouteKey { return RouteKey{r.Edge, r.SessionID, r.TunnelID} }

// Router decides where public traffic goes, and who owns which name. An
// edge calls Bind and Unbind as agents bind and release endpoints (and
// Unbind for each of a session's routes when it ends), and Lookup for every
// public connection or request. A control plane implements it against its
// own store; it must be safe for concurrent use. The package
// router/routertest checks an implementation against this contract.
//
// Names. A route's Name is a host name pattern for the protocols that route
// by host name (http, https, tls): "abc.example.test", or a wildcard
// "*.abc.example.test" that matches one or more labels in front of
// abc.example.test. For tcp it is the port in decimal. A pattern's base is
// the pattern without its "*." prefix. Names are compared in lower case
// without a trailing dot.
//
// Ownership. Every route and every reservation belongs to an identity (the
// agent's authenticated identity, Route.Identity). Bind must decide these
// rules atomically, against every route and reservation in the store,
// whichever edge bound them:
//
//  1. One namespace for host names. http, https and tls share one
//     namespace: a host name has one owner whatever the protocol, and the
//     owner may hold it over several protocols at once. TCP ports are a
//     namespace of their own.
//  2. A name owns its tree. A pattern stands for its base and every name
//     under it. Bind of r fails with ErrNameTaken when a route or
//     reservation of another identity has a base equal to r's base, above
//     it (a suffix of it at a label boundary) or below it. So while A holds
//     "*.w.example.test", nobody else binds "x.w.example.test",
//     "w.example.test" or "*.x.w.example.test"; while A holds
//     "abc.example.test", nobody else binds "*.abc.example.test" or
//     "x.abc.example.test"; and A cannot bind "*.example.test" while B holds
//     "x.example.test". Within its own trees an identity binds freely. For
//     tcp, only the same port conflicts.
//  3. Pools by consent. When r's identity already has routes for the same
//     Proto, Name and Path, Bind adds r beside them only when those routes
//     and r all have Pool set, and the same Policy (a pool's agents declare
//     one traffic policy, which every edge enforces on the pool as a whole)
//     and StripPrefix; otherwise it fails with ErrNameTaken, with a message
//     saying which side did not ask to share, or what differs. Routes of
//     one Name with different Paths are not a pool: each Path is a pool of
//     its own, held by the name's owner (rule 2 counts names, whatever
//     their paths).
//  4. Reservations. Unbind(r, reserve) with reserve > 0, of the last route
//     of r.Proto, r.Name and r.Path, leaves that name reserved for r.Identity for
//     reserve: it counts as held by r.Identity under rule 2, has no routes
//     (Lookup finds nothing), and r.Identity binds it again with or without
//     Pool, which ends the reservation. A lapsed reservation is gone.
//  5. Atomicity. Of Binds racing for conflicting names on behalf of
//     different identities, exactly one succeeds, every time.
//  6. The operator's reservations. A Router that implements Reserver
//     keeps the names the operator reserves for an identity, whether or
//     not it is connected: a reserved name counts as held by its identity
//     under rule 2, over every protocol of the host names' namespace,
//     with no end, until the operator removes it. It has no routes
//     (Lookup finds nothing); its identity binds it, and names under it,
//     at any time, with or without Pool, and unbinding their routes does
//     not end it. Rule 5 holds between Binds and AddReservation.
//
// Lookup(proto, host) finds the routes of the most specific pattern of proto
// matching host (an exact name before any wildcard, a longer wildcard before
// a shorter one), in the order to try them: round robin over a pool, with
// routes reported as failing last. Of a pattern with Paths, it returns the
// routes of every Path: those without one first, then each Path's in turn.
// A Router that routes by path (PathRouter) chooses among them for a
// request: the edge asks it for a request's routes with LookupPath.
//
// The edge, not the Router, decides which names are valid and may be asked
// for at all (under its domain; catch-all wildcards only when allowed), and
// the limits per session.
//
// A shared store can decide a Bind in one transaction: keep a key per
// namespace and base holding its owner, its labels reversed
// ("test.example.abc.") so that a tree is a key prefix; read the keys of the
// base's ancestors (one per label) and the range of its tree, check the
// rules, and write only if none of the keys read changed since (in etcd, one
// Txn comparing the ModRevision of each ancestor key and of the tree's
// prefix range with the revision read). A reservation is a key with a lease
// of its own, so that it outlives the edge that made it.
type Router interface {
	// Bind adds r, or fails with an error wrapping ErrNameTaken under the
	// ownership rules above. A route is known by its Proto, Name, Path,
	// Edge, SessionID and TunnelID: binding one that is bound already does
	// nothing. A Router that does not implement PathRouter need not
	// take a route with a Path (an edge binds none there).
	Bind(ctx context.Context, r Route) error
	// Unbind removes the route with r's Proto, Name, Path, Edge, SessionID
	// and TunnelID; removing an absent route is not an error. When it was the
	// last route of its Proto, Name and Path and reserve is positive, the name
	// stays reserved for r.Identity for that long (rule 4).
	Unbind(ctx context.Context, r Route, reserve time.Duration) error
	// Lookup returns the routes for proto and host, in the order to try
	// them. No route is an empty slice and a nil error.
	Lookup(ctx context.Context, proto, host string) ([]Route, error)
}

// HealthReporter is implemented by Routers that want to hear how reaching
// a route's agent went, to try failing routes after the others: the edge
// calls Fail when its Dialer could not reach a route's agent, and Succeed
// each time it did. Both must be cheap (they are called on the request
// path, so a shared store's Router keeps this state locally) and safe for
// concurrent use.
type HealthReporter interface {
	Fail(Route)
	Succeed(Route)
}

// RouteWatcher is implemented by Routers shared between edges. WatchRoutes
// calls f with every route that exists when it is called (bound true), then
// with each route bound or unbound anywhere in the cluster afterwards, in
// order, from one goroutine at a time, until stop is called. An edge uses
// it to listen on the ports of TCP endpoints whose agents are held by other
// edges.
type RouteWatcher interface {
	WatchRoutes(f func(r Route, bound bool)) (stop func())
}

// Reservation is a name the operator keeps for an identity (rule 6 of
// Router): nobody else binds it, or a name in its tree, whether or not its
// identity is connected.
type Reservation struct {
	// Name is a host name, without "*." (a name's tree is the same with or
	// without it, rule 2), in lower case without a trailing dot as
	// Reserver's methods return it. It is in the namespace of host names:
	// http, https and tls.
	Name string
	// Identity is who the name is kept for.
	Identity string
}

// Reserver is implemented by Routers that keep the operator's
// reservations (rule 6 of Router): router.MemoryRouter and
// router/etcdrouter. An edge.Server's Reserve, Unreserve and Reservations
// use it. The edge decides which names may be reserved at all (valid
// names, under its domain or a customer's own); the Router decides who
// holds them.
type Reserver interface {
	// AddReservation reserves r.Name for r.Identity. It fails with an
	// error wrapping ErrNameTaken when another identity holds the name, a
	// name above it or a name under it (a route, a reservation of rule 4
	// or one of these), and with one wrapping ErrInvalidName for a name
	// that is not a host name. Reserving a name again for the identity
	// that has it does nothing; for another, it fails with ErrNameTaken:
	// remove the reservation first. Routes bound under the name meanwhile
	// are not touched.
	AddReservation(ctx context.Context, r Reservation) error
	// RemoveReservation ends the reservation of name, or fails with an
	// error wrapping ErrNoReservation when there is none. The routes its
	// identity bound under the name stay, and hold it while they last
	// (rule 2), with a reservation of rule 4 after them.
	RemoveReservation(ctx context.Context, name string) error
	// Reservation returns the reservation of name, if there is one.
	Reservation(ctx context.Context, name string) (Reservation, bool, error)
	// Reservations returns every reservation, ordered by name.
	Reservations(ctx context.Context) ([]Reservation, error)
}

// ErrNoReservation is returned, wrapped, by Reserver.RemoveReservation for
// a name that is not reserved.
var ErrNoReservation = errors.New("router: no such reservation")

// MemberChecker is implemented by Routers shared between edges that know
// which edges are in the cluster now (etcdrouter: those whose lease is
// alive). An edge's Relay asks it, before it accepts a relay session,
// whether the edge the peer's certificate names is one of them: so the
// certificate of an edge that left the cluster, or of one that never
// joined it, opens no session. Without one, the certificate alone decides.
type MemberChecker interface {
	// IsMember reports whether the edge with ID id is in the cluster
	// now. It may ask a shared store, within ctx; a nil error and false
	// mean it is not.
	IsMember(ctx context.Context, id string) (bool, error)
}

// Mover is implemented by Routers that move an agent's endpoints from one
// of its sessions to another in one step, so that a name never goes
// unrouted while its agent changes edges: an edge that drains asks its
// agents to move (edge.Server.Drain), and an agent's session on another
// edge binds its names there, its session ticket naming the session it
// leaves. Without a Mover, that edge unbinds the old session's routes and
// then binds its own, and a lookup in between finds nothing.
type Mover interface {
	// Move binds r as Bind does, in the place of the routes of r.Identity
	// for r.Proto, r.Name and r.Path that the session from holds (whichever edge
	// holds it): it adds r, then removes those routes, in one step, so
	// that Lookup finds them, then r (and, from a Router whose lookups
	// see the two changes apart, both at once), never neither. Those
	// routes do not count under rule 3: r goes in their place whatever
	// their Pool and Policy; any other route of the name must share with
	// r as rule 3 says. With no such route, Move is Bind. It fails with
	// an error wrapping ErrNameTaken where Bind would, once those routes
	// are set aside, and then changes nothing.
	Move(ctx context.Context, r Route, from string) error
}

// ErrNameTaken is returned, wrapped, by Router.Bind for a route that breaks
// the ownership rules.
var ErrNameTaken = errors.New("router: name taken")
