package router

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Revoker is implemented by Routers that keep, for a while, the identities
// the operator revoked: an edge's Disconnect with free revokes an
// anonymous identity (one its agent proves with a session ticket alone),
// until the latest ticket of it has expired, so that no edge sharing the
// Router gives that identity back to an agent that shows an old ticket (a
// copy of a state file). router.MemoryRouter and router/etcdrouter
// implement it; an edge whose Router does not keeps revocations in memory,
// for itself alone.
type Revoker interface {
	// Revoke revokes identity until until, which may be in the past (then
	// it does nothing). Revoking it again keeps the later time. It fails
	// with an error wrapping ErrInvalidIdentity for an empty identity.
	Revoke(ctx context.Context, identity string, until time.Time) error
	// Revoked reports whether identity is revoked now: whether the latest
	// Revoke of it, through any Router sharing the store, asked for a time
	// still to come (by the Router's clock; a shared store's may keep a
	// revocation a little longer).
	Revoked(ctx context.Context, identity string) (bool, error)
}

// ErrInvalidIdentity is returned, wrapped, by Revoker.Revoke for an empty
// identity.
var ErrInvalidIdentity = errors.New("router: invalid identity")

var _ Revoker = (*MemoryRouter)(nil)

// Revoke implements Revoker, in memory: the revocations lapse by the
// router's Clock, and lapsed ones are dropped as others are added.
func (m *MemoryRouter) Revoke(_ context.Context, identity string, until time.Time) error {
	if identity == "" {
		return fmt.Errorf("%w: empty", ErrInvalidIdentity)
	}
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, t := range m.revoked {
		if !t.After(now) {
			delete(m.revoked, id)
		}
	}
	if !until.After(now) || !until.After(m.revoked[identity]) {
		return nil
	}
	if m.revoked == nil {
		m.revoked = map[string]time.Time{}
	}
	m.revoked[identity] = until
	return nil
}

// Revoked implements Revoker.
func (m *MemoryRouter) Revoked(_ context.Context, identity string) (bool, error) {
	now := m.clock()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.revoked[identity].After(now), nil
}
