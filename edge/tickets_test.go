package edge_test

// Session tickets expire, a connected agent renews its own, and the
// operator keeps an anonymous identity out (issue #39, item 9); the
// identities Authenticate answers are checked (item 6).

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// ticketKey is the TicketKey of these tests' edges.
var ticketKey = []byte(strings.Repeat("k", 32))

// testClock is an edge's Clock that the test moves.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// identityOf returns the identity of the session id on srv, or "".
func identityOf(srv *edge.Server, id string) string {
	for _, s := range srv.Sessions() {
		if s.ID == id {
			return s.Identity
		}
	}
	return ""
}

// onlyIdentity returns the identity of srv's one session, or fails the
// test.
func onlyIdentity(t testing.TB, srv *edge.Server) string {
	t.Helper()
	s := srv.Sessions()
	if len(s) != 1 {
		t.Fatalf("%d sessions, want 1: %+v", len(s), s)
	}
	return s[0].Identity
}

// anonymousGone binds app with an anonymous agent of te that then
// loses its network for good (its later dials wait on a gate the test
// never opens), as a killed agent would: the edge keeps app for its
// identity. It returns the agent's saved session ticket (its state
// file's) and identity.
func anonymousGone(t *testing.T, te *testEdge) (ticket, identity string) {
	t.Helper()
	c, _, conn := gatedClient(t, te.agentAddr, "")
	serve(t, bind(t, c, "http://app"), "first")
	ticket, identity = c.Ticket(), onlyIdentity(t, te.srv)
	if !strings.HasPrefix(identity, "anonymous-") || ticket == "" {
		t.Fatalf("the first agent: identity %q, ticket %q", identity, ticket)
	}
	(*conn.Load()).Close()
	testwait.For(t, func() bool { return len(te.srv.Sessions()) == 0 })
	return ticket, identity
}

// thiefGetsNothing checks that an agent presenting ticket, the first
// agent's (of identity), as a copy of its state file would, is not given
// app, which the edge keeps for identity, nor identity.
func thiefGetsNothing(t *testing.T, te *testEdge, ticket, identity string) {
	t.Helper()
	thief := &agent.Client{Addrs: []string{te.agentAddr}, ResumeTicket: ticket, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	t.Cleanup(func() { thief.Close() })
	if _, err := thief.Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("an agent showing the revoked identity's ticket, binding its name: %v, want ErrNameTaken", err)
	}
	bind(t, thief, "http://elsewhere")
	if got := onlyIdentity(t, te.srv); got == identity || !strings.HasPrefix(got, "anonymous-") {
		t.Fatalf("an agent showing the revoked identity's ticket is %q, want a new anonymous identity (not %q)", got, identity)
	}
}

// TestDisconnectRevokesAnonymousTickets: an anonymous agent binds app and
// is gone; the operator disconnects its identity with free. An agent
// showing its saved session ticket is a new identity, which app, kept for
// the old one, is refused to.
func TestDisconnectRevokesAnonymousTickets(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", TicketKey: ticketKey, Timeouts: edge.Timeouts{Grace: time.Hour}}, listen(t), listen(t))
	ticket, identity := anonymousGone(t, te)
	if n := te.srv.Disconnect(identity, true); n != 0 {
		t.Fatalf("Disconnect of an identity with no session: %d, want 0", n)
	}
	thiefGetsNothing(t, te, ticket, identity)
}

// TestDisconnectedAgentComesBackNew: an anonymous agent disconnected with
// free, which reconnects at once with its ticket, is a new identity; one
// disconnected without free is the same.
func TestDisconnectedAgentComesBackNew(t *testing.T) {
	t.Parallel()
	te := edgeOn(t, &edge.Server{Domain: "example.test", TicketKey: ticketKey}, listen(t), listen(t))
	c := &agent.Client{Addrs: []string{te.agentAddr}, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	t.Cleanup(func() { c.Close() })
	serve(t, bind(t, c, "http://app"), "app")
	first := onlyIdentity(t, te.srv)
	back := func(was string) string {
		t.Helper()
		var now string
		testwait.For(t, func() bool {
			s := te.srv.Sessions()
			if len(s) != 1 || len(s[0].Endpoints) != 1 || s[0].ID == was {
				return false
			}
			now = s[0].Identity
			return true
		})
		return now
	}
	was := te.srv.Sessions()[0].ID
	if n := te.srv.Disconnect(first, false); n != 1 {
		t.Fatalf("Disconnect: %d, want 1", n)
	}
	if got := back(was); got != first {
		t.Fatalf("disconnected without free, the agent came back as %q, want %q", got, first)
	}
	was = te.srv.Sessions()[0].ID
	if n := te.srv.Disconnect(first, true); n != 1 {
		t.Fatalf("Disconnect with free: %d, want 1", n)
	}
	if got := back(was); got == first {
		t.Fatalf("disconnected with free, the agent came back as %q, the revoked identity", got)
	}
}

// TestRevocationSurvivesRestart: the revocation is in the record of
// StateDir: after a restart, which keeps app for the old identity, an
// agent showing its ticket is a new identity still.
func TestRevocationSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	newServer := func() *edge.Server {
		return &edge.Server{Domain: "example.test", TicketKey: ticketKey, StateDir: dir, Timeouts: edge.Timeouts{Grace: time.Hour}}
	}
	te := edgeOn(t, newServer(), listen(t), listen(t))
	ticket, identity := anonymousGone(t, te)
	te.srv.Disconnect(identity, true)
	te = te.restart(t, newServer())
	thiefGetsNothing(t, te, ticket, identity)
}

// TestSessionTicketExpires: a session ticket older than
// Timeouts.SessionTicketLifetime, by the edge's clock, gives its identity
// back no more, and none of the names kept for it; a younger one does.
func TestSessionTicketExpires(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	const lifetime = 7 * 24 * time.Hour
	te := edgeOn(t, &edge.Server{Domain: "example.test", TicketKey: ticketKey, Clock: clock.Now,
		Timeouts: edge.Timeouts{Grace: 30 * 24 * time.Hour, SessionTicketLifetime: lifetime}}, listen(t), listen(t))
	ticket, identity := anonymousGone(t, te)

	clock.Add(lifetime - time.Minute)
	young, hello := dialRaw(t, te.agentAddr, "", ticket)
	if got := identityOf(te.srv, hello.SessionID); got != identity {
		t.Fatalf("a ticket a minute short of its lifetime gave identity %q, want %q", got, identity)
	}
	young.s.Close()
	testwait.For(t, func() bool { return len(te.srv.Sessions()) == 0 })

	clock.Add(2 * time.Minute)
	old, hello := dialRaw(t, te.agentAddr, "", ticket)
	if got := identityOf(te.srv, hello.SessionID); got == identity || !strings.HasPrefix(got, "anonymous-") {
		t.Fatalf("a ticket a minute past its lifetime gave identity %q, want a new one", got)
	}
	if resp := old.bind("app", ""); resp.Error == nil || resp.Error.Code != wire.CodeNameTaken {
		t.Fatalf("the name kept for the old identity, asked for with an expired ticket: %+v %+v, want name_taken", resp.BindResp, resp.Error)
	}
}

// TestSessionTicketRenewed: a connected agent renews its session ticket
// (protocol version 5), telling it as TicketRenewed: the ticket it keeps
// is good past the lifetime of the one its hello got.
func TestSessionTicketRenewed(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	const lifetime = 7 * 24 * time.Hour
	te := edgeOn(t, &edge.Server{Domain: "example.test", TicketKey: ticketKey, Clock: clock.Now,
		Timeouts: edge.Timeouts{TicketLifetime: 2 * time.Second, SessionTicketLifetime: lifetime}}, listen(t), listen(t)) // renewals every second
	renewed := make(chan struct{}, 64)
	c := &agent.Client{Addrs: []string{te.agentAddr}, OnEvent: func(e agent.Event) {
		if e.Kind == agent.TicketRenewed {
			renewed <- struct{}{}
		}
	}}
	t.Cleanup(func() { c.Close() })
	serve(t, bind(t, c, "http://long"), "long")
	first, identity := c.Ticket(), onlyIdentity(t, te.srv)

	clock.Add(6 * 24 * time.Hour)
	// A renewal under way may have signed at the earlier time; the one
	// after it did not.
	for len(renewed) > 0 {
		<-renewed
	}
	for range 2 {
		select {
		case <-renewed:
		case <-time.After(time.Minute):
			t.Fatal("no TicketRenewed event within a minute of renewals every second")
		}
	}
	kept := c.Ticket()
	if kept == first {
		t.Fatal("TicketRenewed, and Client.Ticket is the hello's")
	}

	clock.Add(2 * 24 * time.Hour) // 8 days after the hello
	_, hello := dialRaw(t, te.agentAddr, "", first)
	if got := identityOf(te.srv, hello.SessionID); got == identity {
		t.Fatalf("the hello's ticket, 8 days old, gave the identity back")
	}
	_, hello = dialRaw(t, te.agentAddr, "", kept)
	if got := identityOf(te.srv, hello.SessionID); got != identity {
		t.Fatalf("the renewed ticket, 2 days old, gave identity %q, want %q", got, identity)
	}
}

// TestInvalidIdentityRefused: an identity that Authenticate answers and
// that CheckIdentity refuses keeps the agent out, as unauthorized, saying
// why, and is logged; Reserve refuses such identities too.
func TestInvalidIdentityRefused(t *testing.T) {
	t.Parallel()
	var log testtools.Buffer
	srv := &edge.Server{Domain: "example.test", Logger: slog.New(slog.NewTextHandler(&log, nil)), Authenticate: func(_ context.Context, token string) (string, error) {
		return strings.TrimPrefix(token, "id:"), nil
	}}
	te := edgeOn(t, srv, listen(t), listen(t))
	ctx := context.Background()
	for _, id := range []string{"al ice\n\u0000", strings.Repeat("a", 60000), "a\u202eb"} {
		c := &agent.Client{Addrs: []string{te.agentAddr}, Token: "id:" + id}
		_, err := c.Listen(ctx, "http://app")
		c.Close()
		if !errors.Is(err, agent.ErrUnauthorized) || !strings.Contains(err.Error(), "identity it cannot use") {
			t.Errorf("Authenticate answering %q: %v, want ErrUnauthorized saying the identity cannot be used", id[:min(len(id), 16)], err)
		}
		for _, name := range []string{"app", "shop.customer.test"} {
			if err := srv.Reserve(ctx, name, id); !errors.Is(err, edge.ErrInvalidIdentity) || !errors.Is(err, edge.ErrInvalidReservation) {
				t.Errorf("Reserve(%s) for %q: %v, want ErrInvalidIdentity and ErrInvalidReservation", name, id[:min(len(id), 16)], err)
			}
		}
		if err := edge.CheckIdentity(id); !errors.Is(err, edge.ErrInvalidIdentity) {
			t.Errorf("CheckIdentity(%q) = %v, want ErrInvalidIdentity", id[:min(len(id), 16)], err)
		}
	}
	if n := len(srv.Sessions()); n != 0 {
		t.Errorf("%d sessions of invalid identities", n)
	}
	if !strings.Contains(log.String(), "which Authenticate answered the token with") {
		t.Errorf("the edge's log does not tell the operator:\n%s", log.String())
	}
	c := &agent.Client{Addrs: []string{te.agentAddr}, Token: "id:alice"}
	defer c.Close()
	if _, err := c.Listen(ctx, "http://app"); err != nil {
		t.Fatalf("a valid identity after them: %v", err)
	}
}
