package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tunnelkit/tunnelkit/router"
)

// Route is an endpoint an agent bound: where public traffic for a name goes.
// It is plain data, so a Router can keep it in a shared store and a Dialer
// can reach an agent held by another edge.
type Route struct {
	Proto     string // "http" (later "tls", "tcp")
	Name      string // the public host name, "abc.example.test"
	TunnelID  string // the endpoint within its session
	SessionID string // the agent session that bound it
	Identity  string // who owns Name: the agent's authenticated identity
	Edge      string // the edge holding the session; empty: this one
}

// Router decides where public traffic goes. An edge calls Bind and Unbind as
// agents bind and release endpoints (and Unbind for each of a session's
// routes when it ends), and Lookup for every public connection or request.
// A control plane implements it against its own store; it must be safe for
// concurrent use.
type Router interface {
	// Bind adds r. It returns an error wrapping ErrNameTaken when another
	// identity holds r.Name for r.Proto. Name ownership must be decided
	// atomically (a compare-and-swap in a shared store).
	Bind(ctx context.Context, r Route) error
	// Unbind removes r; removing an absent route is not an error.
	Unbind(ctx context.Context, r Route) error
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
	owners map[ownerKey]string // (proto, name) to identity
	tables sync.Map            // proto to *router.Table[Route]
}

type ownerKey struct{ proto, name string }

func (m *MemoryRouter) table(proto string) *router.Table[Route] {
	if t, ok := m.tables.Load(proto); ok {
		return t.(*router.Table[Route])
	}
	t, _ := m.tables.LoadOrStore(proto, new(router.Table[Route]))
	return t.(*router.Table[Route])
}

// Bind implements Router.
func (m *MemoryRouter) Bind(_ context.Context, r Route) error {
	name, ok := router.Normalise(r.Name)
	if !ok {
		return fmt.Errorf("edge: %w: %q", router.ErrInvalidName, r.Name)
	}
	r.Name = name
	m.mu.Lock()
	defer m.mu.Unlock()
	k := ownerKey{r.Proto, name}
	if owner, held := m.owners[k]; held && owner != r.Identity {
		return fmt.Errorf("%w: %s", ErrNameTaken, name)
	}
	if err := m.table(r.Proto).Add(name, r); err != nil {
		return err
	}
	if m.owners == nil {
		m.owners = map[ownerKey]string{}
	}
	m.owners[k] = r.Identity
	return nil
}

// Unbind implements Router.
func (m *MemoryRouter) Unbind(_ context.Context, r Route) error {
	name, ok := router.Normalise(r.Name)
	if !ok {
		return nil
	}
	r.Name = name
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.table(r.Proto)
	t.Remove(name, r)
	if len(t.Pool(name)) == 0 {
		delete(m.owners, ownerKey{r.Proto, name})
	}
	return nil
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
