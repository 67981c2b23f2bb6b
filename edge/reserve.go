package edge

import (
	"context"

	"github.com/tunnelkit/tunnelkit/router"
)

// The operator's reservations (rule 6 of router.Router), kept by the
// Router, and customers' own domains.

// Reserve reserves name for identity, whether or not identity is
// connected: nobody else binds name, or a name in its tree (rules 2 and 6
// of router.Router), and identity binds it at any time, over http, https
// or tls.
//
// name is a full host name, in any case, with or without a trailing dot:
// under Domain ("shop.example.test"), or outside it, a customer's own
// domain ("shop.customer.example", whose DNS points at the edge). An
// agent binds a name outside Domain only when it is reserved for its
// identity, and then that name exactly: its routes are found by Host and
// by TLS server name, and over https it gets the operator's certificate
// (Certificates, GetCertificate) or one from ACME, within ACME's budgets.
// It may not be Domain, a name above it, or a name of the operator's (a
// public name of ECHKeys, or a name above or under one).
//
// It fails with an error wrapping router.ErrNameTaken while another
// identity holds name, a name above it or a name under it (unbind or
// Disconnect it first), ErrInvalidReservation for a name or identity
// that cannot be reserved, and ErrReservationsUnsupported when the Router
// is not a router.Reserver. The reservation lives in the Router: for the
// in-memory one, in StateDir's record (so that it outlives a restart; it
// is lost with the process without StateDir); for router/etcdrouter, in
// etcd, shared by the cluster.
func (s *Server) Reserve(ctx context.Context, name, identity string) error {
	s.init()
	return ErrReservationsUnsupported
}

// Unreserve ends the reservation of name. Routes its identity bound under
// it stay until they go (then the name is kept for Timeouts.Grace, as any
// name is). It fails with an error wrapping router.ErrNoReservation when
// name is not reserved, and ErrReservationsUnsupported when the Router is
// not a router.Reserver.
func (s *Server) Unreserve(ctx context.Context, name string) error {
	s.init()
	return ErrReservationsUnsupported
}

// Reservations returns the names reserved, ordered by name. It fails with
// ErrReservationsUnsupported when the Router is not a router.Reserver.
func (s *Server) Reservations(ctx context.Context) ([]router.Reservation, error) {
	s.init()
	return nil, ErrReservationsUnsupported
}
