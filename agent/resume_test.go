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
