package router

import "context"

// ReservationCounter is implemented by Reservers that count their
// reservations without listing them: an edge bounds the operator's
// reservations (edge.Limits.Reservations) with it, or else with
// Reservations, whose cost grows with their number. router.MemoryRouter
// and router/etcdrouter implement it.
type ReservationCounter interface {
	// CountReservations returns how many reservations there are, as
	// Reservations would list them, and how many of them are identity's.
	CountReservations(ctx context.Context, identity string) (all, of int, err error)
}

var _ ReservationCounter = (*MemoryRouter)(nil)

// CountReservations implements ReservationCounter.
func (m *MemoryRouter) CountReservations(_ context.Context, identity string) (all, of int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.reserved), m.reservedN[identity], nil
}
