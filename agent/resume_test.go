package agent_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// killable dials the edge once, as a process that is then killed: kill
// closes its connection (as the kernel does for a process killed with
// SIGKILL), and later dials fail, as the dead process makes none.
type killable struct {
	mu     sync.Mutex
	conn   net.Conn
	killed bool
}

func (k *killable) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return nil, errors.New("this agent was killed")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	k.conn = c
	return c, err
}

func (k *killable) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed = true
	k.conn.Close()
}

// TestResumeTicketAfterKill: an agent without a token killed while it
// holds a name, and started again, gets the name back at once when it
// presents its earlier session's ticket (Client.ResumeTicket, with
// Endpoint.Ticket): the edge gives it its identity back. Without the
// ticket, the agent is another identity, refused for the grace of the
// earlier session, and the refusal says until when the name is kept.
func TestResumeTicketAfterKill(t *testing.T) {
	e := startHTTPEdge(t, nil)
	k := &killable{}
	first := &agent.Client{Addrs: []string{e.agents}, DialContext: k.dial, MinBackoff: time.Hour, MaxBackoff: time.Hour}
	defer first.Close()
	if first.Ticket() != "" {
		t.Fatalf("a ticket before the first session: %q", first.Ticket())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := first.Listen(ctx, "http://resume")
	if err != nil {
		t.Fatal(err)
	}
	session, endpoint := first.Ticket(), l.Ticket()
	if session == "" || endpoint == "" {
		t.Fatalf("session ticket %q, endpoint ticket %q: want both", session, endpoint)
	}
	k.kill()

	// Another agent, or this one without its ticket: refused, told until
	// when the name is kept once the edge saw the session end.
	testwait.Until(t, 10*time.Second, "a refusal saying until when the name is kept", func() error {
		other := &agent.Client{Addrs: []string{e.agents}}
		defer other.Close()
		_, err := other.Listen(ctx, "http://resume")
		if !errors.Is(err, agent.ErrNameTaken) {
			t.Fatalf("another identity binding a name kept for its owner: %v, want ErrNameTaken", err)
		}
		if !strings.Contains(err.Error(), "its owner's session ended, and the name is kept for them until ") || !strings.HasSuffix(err.Error(), " UTC") {
			return err
		}
		return nil
	})

	again := &agent.Client{Addrs: []string{e.agents}, ResumeTicket: session}
	defer again.Close()
	if again.Ticket() != session {
		t.Errorf("Ticket before the first session: %q, want ResumeTicket", again.Ticket())
	}
	l2, err := again.ListenEndpoint(ctx, agent.Endpoint{URL: "http://resume", Ticket: endpoint})
	if err != nil {
		t.Fatalf("binding again with the earlier session's ticket: %v", err)
	}
	if l2.URL() != l.URL() {
		t.Errorf("URL %s after the restart, want %s", l2.URL(), l.URL())
	}
	if again.Ticket() == session || again.Ticket() == "" {
		t.Errorf("Ticket after the new session: %q, want the new session's", again.Ticket())
	}
}

// TestResumeTicketHostile: a ResumeTicket the edge did not sign (garbage,
// or a real one altered) gets no identity back and takes no name: the
// client binds as a new identity, and a name kept for another is refused.
func TestResumeTicketHostile(t *testing.T) {
	e := startHTTPEdge(t, nil)
	k := &killable{}
	owner := &agent.Client{Addrs: []string{e.agents}, DialContext: k.dial, MinBackoff: time.Hour, MaxBackoff: time.Hour}
	defer owner.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := owner.Listen(ctx, "http://kept"); err != nil {
		t.Fatal(err)
	}
	real := owner.Ticket()
	k.kill()
	last := real[len(real)-1]
	flipped := real[:len(real)-1] + string(rune('A'+(last-'A'+1)%26))
	for _, ticket := range []string{"garbage", flipped, strings.Repeat("A", 5000), "\n" + real} {
		c := &agent.Client{Addrs: []string{e.agents}, ResumeTicket: ticket}
		if _, err := c.Listen(ctx, "http://other-"+randomLabel(t)); err != nil {
			t.Errorf("ResumeTicket %.20q: a bind of a free name failed: %v", ticket, err)
		}
		if _, err := c.Listen(ctx, "http://kept"); !errors.Is(err, agent.ErrNameTaken) {
			t.Errorf("ResumeTicket %.20q took the name kept for its owner: %v", ticket, err)
		}
		c.Close()
	}
}

// randomLabel returns a label no other test binds.
func randomLabel(t *testing.T) string {
	return strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())) + "-" + time.Now().Format("150405.000000000")[7:]
}
