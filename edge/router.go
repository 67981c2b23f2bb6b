package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// Route is an endpoint an agent bound: where public traffic for a name goes.
// It is plain data, so a Router can keep it in a shared store and a Dialer
// can reach an agent held by another edge.
type Route struct {
	Proto string // "http", "tls" or "tcp"
	// Name is the public host name or wildcard of an HTTP or TLS endpoint
	// ("abc.example.test", "*.abc.example.test"), or the port of a TCP
	// endpoint in decimal ("20001").
	Name      string
	TunnelID  string // the endpoint within its session
	SessionID string // the agent session that bound it
	Identity  string // who owns Name: the agent's authenticated identity
	Edge      string // the edge holding the session; empty: this one
	// Pool asks Bind to add r beside the routes the same identity already
	// has for Name, rather than fail with ErrNameTaken.
	Pool bool
}

// Router decides where public traffic goes. An edge calls Bind and Unbind as
// agents bind and release endpoints (and Unbind for each of a session's
// routes when it ends), and Lookup for every public connection or request.
// A control plane implements it against its own store; it must be safe for
// concurrent use.
type Router interface {
	// Bind adds r. It returns an error wrapping ErrNameTaken when another
	// identity holds r.Name for r.Proto, or when r's identity does and
	// r.Pool is false. Name ownership must be decided atomically (a
	// compare-and-swap in a shared store).
	Bind(ctx context.Context, r Route) error
	// Unbind removes r; removing an absent route is not an error. When
	// reserve is positive and r was the last route of r.Name, the name stays
	// owned by r.Identity for that long: only the same identity can bind it
	// meanwhile (a reconnecting agent gets its name back). With a shared
	// store, that is a lease on the name.
	Unbind(ctx context.Context, r Route, reserve time.Duration) error
	// Lookup returns the routes for proto and host, in the order to try
	// them. No route is an empty slice and a nil error.
	Lookup(ctx context.Context, proto, host string) ([]Route, error)
}

// Errors of the edge.
var (
	ErrNameTaken    = errors.New("edge: name taken")
	ErrNoSession    = errors.New("edge: agent session not found")
	ErrServerClosed = errors.New("edge: server closed")
)

// failReporter is implemented by Routers that want to hear about routes
// whose agent could not be reached, to try them later than the others.
type failReporter interface {
	Fail(Route)
}

// MemoryRouter is the in-memory Router an edge uses when none is set: a
// router.Table per protocol, with name ownership by identity. Its zero value
// is ready to use.
type MemoryRouter struct {
	mu     sync.Mutex
	owners map[ownerKey]owner
	tables sync.Map // proto to *router.Table[Route]
}

type ownerKey struct{ proto, name string }

// owner is who holds a name: while it has routes (until is zero), or
// reserved after its last route went.
type owner struct {
	identity string
	until    time.Time
}

func (m *MemoryRouter) table(proto string) *router.Table[Route] {
	if t, ok := m.tables.Load(proto); ok {
		return t.(*router.Table[Route])
	}
	t, _ := m.tables.LoadOrStore(proto, new(router.Table[Route]))
	return t.(*router.Table[Route])
}

// Bind implements Router.
func (m *MemoryRouter) Bind(_ context.Context, r Route) error {
	name, ok := router.NormalisePattern(r.Name)
	if !ok {
		return fmt.Errorf("edge: %w: %q", router.ErrInvalidName, r.Name)
	}
	r.Name = name
	m.mu.Lock()
	defer m.mu.Unlock()
	k := ownerKey{r.Proto, name}
	if o, held := m.owners[k]; held {
		reserved := !o.until.IsZero()
		switch {
		case reserved && time.Now().After(o.until):
			// The reservation lapsed: the name is free.
		case o.identity != r.Identity:
			return fmt.Errorf("%w: %s", ErrNameTaken, name)
		case !reserved && !r.Pool:
			return fmt.Errorf("%w: %s (bound already; join its pool to share it)", ErrNameTaken, name)
		}
	}
	if err := m.table(r.Proto).Add(name, r); err != nil {
		return err
	}
	if m.owners == nil {
		m.owners = map[ownerKey]owner{}
	}
	m.owners[k] = owner{identity: r.Identity}
	return nil
}

// Unbind implements Router.
func (m *MemoryRouter) Unbind(_ context.Context, r Route, reserve time.Duration) error {
	name, ok := router.NormalisePattern(r.Name)
	if !ok {
		return nil
	}
	r.Name = name
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.table(r.Proto)
	if !t.Remove(name, r) || len(t.Pool(name)) > 0 {
		return nil
	}
	k := ownerKey{r.Proto, name}
	if reserve > 0 {
		m.owners[k] = owner{identity: r.Identity, until: time.Now().Add(reserve)}
	} else {
		delete(m.owners, k)
	}
	m.sweepLocked()
	return nil
}

// sweepLocked forgets lapsed reservations.
func (m *MemoryRouter) sweepLocked() {
	now := time.Now()
	for k, o := range m.owners {
		if !o.until.IsZero() && now.After(o.until) {
			delete(m.owners, k)
		}
	}
}

// Lookup implements Router.
func (m *MemoryRouter) Lookup(_ context.Context, proto, host string) ([]Route, error) {
	var out []Route
	for r := range m.table(proto).Backends(host) {
		out = append(out, r)
	}
	return out, nil
}

// Fail marks r as failing: later lookups try it after the others.
func (m *MemoryRouter) Fail(r Route) { m.table(r.Proto).Fail(r) }
