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
// https gets the operator's certificates or ACME's. A customer's domain
// is under a public suffix (shop.co.uk, never co.uk or github.io). The
// name is stored as ReservationName spells it. It fails with an error
// wrapping router.ErrNameTaken while another identity holds name, a name
// above or under it; ErrReservationLimit past Limits.Reservations or
// ReservationsPerIdentity; ErrInvalidReservation for Domain, a name above
// it, the operator's (see ECHKeys), a public suffix, a wildcard, or an
// identity CheckIdentity refuses (then wrapping ErrInvalidIdentity too);
// ErrReservationsUnsupported if the Router is not a router.Reserver. The
// in-memory Router keeps reservations in StateDir's record (without it,
// they end with the process); etcdrouter in etcd.
func (s *Server) Reserve(ctx context.Context, name, identity string) error {
	rs, err := s.reserver()
	if err != nil {
		return err
	}
	if err := CheckIdentity(identity); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidReservation, err)
	}
	s.initECH()
	res, err := names.Reservation(name, identity, s.domain(), s.ech.publicNames)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidReservation, err)
	}
	// One Reserve at a time counts and adds, so that racing calls do not
	// pass the bounds together (edges sharing a Router each count alone).
	s.reserveMu.Lock()
	defer s.reserveMu.Unlock()
	if err := s.reservationRoom(ctx, rs, res); err != nil {
		return err
	}
	return rs.AddReservation(ctx, res)
}

// reservationRoom returns ErrReservationLimit, wrapped, when the Router
// holds as many reservations as Limits allows, in all or for res's
// identity, and res would be one more.
func (s *Server) reservationRoom(ctx context.Context, rs router.Reserver, res router.Reservation) error {
	all, perID := s.cfg().reservations, s.cfg().reservationsPerID
	if all == 0 && perID == 0 {
		return nil
	}
	if _, found, err := rs.Reservation(ctx, res.Name); err != nil || found {
		return err // no new one: AddReservation does nothing, or refuses
	}
	held, mine, err := countReservations(ctx, rs, res.Identity)
	if err != nil {
		return err
	}
	switch {
	case all > 0 && held >= all:
		return fmt.Errorf("%w: the edge holds %d, as many as it takes (Limits.Reservations); remove some first", ErrReservationLimit, held)
	case perID > 0 && mine >= perID:
		return fmt.Errorf("%w: %s holds %d, as many as one identity may (Limits.ReservationsPerIdentity); remove some first", ErrReservationLimit, res.Identity, mine)
	}
	return nil
}

// countReservations returns how many reservations rs holds, and how many
// of them are identity's: by its router.ReservationCounter, or else by its
// list.
func countReservations(ctx context.Context, rs router.Reserver, identity string) (all, of int, err error) {
	if rc, ok := rs.(router.ReservationCounter); ok {
		return rc.CountReservations(ctx, identity)
	}
	held, err := rs.Reservations(ctx)
	for _, r := range held {
		if r.Identity == identity {
			of++
		}
	}
	return len(held), of, err
}

// Unreserve ends the reservation of name, spelled in any way that
// ReservationName spells as it; routes bound under it stay until they go.
// It fails with an error wrapping router.ErrNoReservation when name is
// not reserved, or ErrReservationsUnsupported.
func (s *Server) Unreserve(ctx context.Context, name string) error {
	rs, err := s.reserver()
	if err != nil {
		return err
	}
	stored, ok := s.ReservationName(name)
	if !ok {
		return fmt.Errorf("%w: %q", router.ErrNoReservation, name)
	}
	return rs.RemoveReservation(ctx, stored)
}

// ReservationName returns name as Reserve stores it, and as Unreserve and
// Reservations spell it: in lower case, without a trailing dot, one label
// standing for the name under Domain ("Shop" and "shop.example.test." are
// "shop.example.test" under example.test). ok is false when that is no
// host name.
func (s *Server) ReservationName(name string) (stored string, ok bool) {
	return names.ReservationName(name, s.domain())
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
