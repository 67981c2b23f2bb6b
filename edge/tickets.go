package edge

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tunnelkit/tunnelkit/edge/internal/names"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Session tickets (docs/PROTOCOL.md, Tickets): how long one is good for, its
// renewal by a connected agent, and the revocation of an anonymous
// identity, whose agents prove it with their session tickets alone.

// sessionTicket returns what the session ticket of a hello says, when it
// is one: signed under TicketKey, issued within
// Timeouts.SessionTicketLifetime, and, when it would give an anonymous
// agent its identity back, of an identity not revoked (see Disconnect).
// Any other ticket is ignored (nil), and so is none. It fails only when
// the revocations cannot be read now.
func (s *Server) sessionTicket(ctx context.Context, ticket string, log *slog.Logger) (*names.Ticket, error) {
	if ticket == "" {
		return nil, nil
	}
	t, err := s.signer.Open(ticket)
	switch {
	case err != nil:
	case t.Kind != names.TicketSession:
		err = fmt.Errorf("a ticket of kind %d, not a session ticket", t.Kind)
	case s.now().Sub(t.Issued) > s.cfg().sessionTickets:
		err = fmt.Errorf("a session ticket issued %s, more than %v ago (Timeouts.SessionTicketLifetime)", t.Issued.UTC().Format(time.RFC3339), s.cfg().sessionTickets)
	case s.Authenticate == nil && strings.HasPrefix(t.Identity, anonymousPrefix):
		revoked, rerr := s.revoker().Revoked(ctx, t.Identity)
		if rerr != nil {
			log.Warn("the revocations of identities cannot be read", "err", rerr)
			return nil, fmt.Errorf("the revocations of identities cannot be read now; try again later")
		}
		if revoked {
			err = fmt.Errorf("a session ticket of %s, whose tickets the operator revoked", t.Identity)
		}
	}
	if err != nil {
		log.Debug("hello ticket ignored", "err", err)
		return nil, nil
	}
	return &t, nil
}

// renewSessionTicket answers an agent's renew of its session ticket
// (protocol version 5): a fresh ticket of the session, so that the one the
// agent keeps never expires while it stays connected.
func (ss *session) renewSessionTicket() wire.Response {
	ss.mu.Lock()
	identity := ss.identity
	ss.mu.Unlock()
	t, err := ss.srv.signer.Sign(names.Ticket{Kind: names.TicketSession, Issued: ss.srv.now(), Identity: identity, Session: ss.id})
	if err != nil {
		ss.log.Warn("session ticket", "err", err)
		return fail(wire.CodeUnavailable, "no ticket")
	}
	return wire.Response{RenewResp: &wire.RenewResp{Ticket: t}}
}

// revoker keeps the identities revoked: the Router, when it is a
// router.Revoker (the in-memory one, its record in StateDir, etcdrouter),
// or else the Server's own MemoryRouter, for this edge alone and until it
// stops.
func (s *Server) revoker() router.Revoker {
	s.init()
	if rv, ok := s.router().(router.Revoker); ok {
		return rv
	}
	return s.mem
}

// revoke makes the tickets of identity, an anonymous agent's, void: its
// session tickets, and so the identity, which no agent gets back, and its
// endpoint tickets, which decide nothing anyway. It lasts as long as the
// latest of them would have (Timeouts.SessionTicketLifetime), and, with
// StateDir, past a restart; in a cluster, on every edge sharing a Router
// that is a router.Revoker.
func (s *Server) revoke(identity string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	until := s.now().Add(s.cfg().sessionTickets)
	if err := s.revoker().Revoke(ctx, identity, until); err != nil {
		s.log().Error("the revocation of an identity's tickets failed, or does not outlive the process", "identity", identity, "err", err)
		return
	}
	s.log().Info("tickets revoked: the identity's agents, showing them, are new identities", "identity", identity, "until", until.UTC().Format(time.RFC3339))
}
