package edge

import (
	"context"
	"fmt"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The operator's reservations (rule 6 of router.Router), kept by the
// Router, and customers' own domains.

// Reserve reserves name for identity, connected or not: nobody else binds
// name or a name in its tree, and identity binds it at any time, over
// http, https or tls. name is a host name under Domain (one label is a
// name under it), or a customer's own domain outside it, pointed at the
// edge by DNS, which an agent binds (exactly) only while it is reserved
// for its identity: it is routed by Host and by TLS server name, and over
// https gets the operator's certificates or ACME's. It fails with an
// error wrapping router.ErrNameTaken while another identity holds name,
// a name above or under it; ErrInvalidReservation for Domain, a name
// above it, the operator's (see ECHKeys), a wildcard or no identity;
// ErrReservationsUnsupported if the Router is not a router.Reserver. The
// in-memory Router keeps reservations in StateDir's record (without it,
// they end with the process); etcdrouter in etcd.
func (s *Server) Reserve(ctx context.Context, name, identity string) error {
	rs, err := s.reserver()
	if err != nil {
		return err
	}
	s.initECH()
	res, err := names.Reservation(name, identity, s.domain(), s.ech.publicNames)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidReservation, err)
	}
	return rs.AddReservation(ctx, res)
}

// Unreserve ends the reservation of name; routes bound under it stay
// until they go. It fails with an error wrapping router.ErrNoReservation
// when name is not reserved, or ErrReservationsUnsupported.
func (s *Server) Unreserve(ctx context.Context, name string) error {
	rs, err := s.reserver()
	if err != nil {
		return err
	}
	return rs.RemoveReservation(ctx, name)
}

// Reservations returns the names reserved, ordered by name, or
// ErrReservationsUnsupported.
func (s *Server) Reservations(ctx context.Context) ([]router.Reservation, error) {
	rs, err := s.reserver()
	if err != nil {
		return nil, err
	}
	return rs.Reservations(ctx)
}

func (s *Server) reserver() (router.Reserver, error) {
	s.init()
	if rs, ok := s.router().(router.Reserver); ok {
		return rs, nil
	}
	return nil, ErrReservationsUnsupported
}

// ownDomain reports whether h, outside domain, may be a customer's own
// domain, reserved in the Router (see Reserve), and so looked up.
func (s *Server) ownDomain(h, domain string) bool {
	_, ok := names.Outside(h, domain)
	_, err := s.reserver()
	return ok && err == nil
}

// customerName answers a bind by identity of name outside Domain that is
// not reserved for identity (see names.Customer).
func (s *Server) customerName(ctx context.Context, name, identity string) *wire.Error {
	rs, _ := s.reserver()
	return names.Customer(ctx, rs, name, s.domain(), identity)
}
