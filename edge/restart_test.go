package edge_test

// A restart gives each name back to the identity that held it when the
// edge stopped, and to no one else (issue #19, item 1); a first start is
// not a restart (issue #20, item 3).

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.ngrok.com/muxado/v2"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
	"github.com/tunnelkit/tunnelkit/internal/wire"
)

// rawAgent is a hand-written agent on one session: it sends what it likes,
// tickets kept from before among them.
type rawAgent struct {
	t testing.TB
	s muxado.Session
}

// dialRaw opens a session to addr and says hello with token and ticket,
// or fails the test.
func dialRaw(t testing.TB, addr, token, ticket string) (*rawAgent, *wire.HelloResp) {
	t.Helper()
	a := &rawAgent{t, rawSession(t, addr)}
	go answerStreams(a.s, func(muxado.Stream, wire.StreamType) {}) // the heartbeat
	resp := a.call(wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: token, Ticket: ticket}})
	if resp.HelloResp == nil {
		t.Fatalf("hello: %+v", resp.Error)
	}
	return a, resp.HelloResp
}

// call sends one control request and returns the answer.
func (a *rawAgent) call(req wire.Request) wire.Response {
	a.t.Helper()
	st, err := a.s.OpenStream()
	if err != nil {
		a.t.Fatal(err)
	}
	defer st.Close()
	st.Write(mustMessage(a.t, req))
	var resp wire.Response
	if err := wire.ReadMessage(st, &resp); err != nil {
		a.t.Fatal(err)
	}
	return resp
}

// bind asks for an http endpoint named name, with an endpoint ticket.
func (a *rawAgent) bind(name, ticket string) wire.Response {
	return a.call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: name, Ticket: ticket}})
}

// gatedClient is an agent whose first dial goes through at once and
// whose later ones wait until the returned gate is closed; close the conn
// it holds to cut its session.
func gatedClient(t testing.TB, addr, token string) (c *agent.Client, gate chan struct{}, conn *atomic.Pointer[net.Conn]) {
	gate = make(chan struct{})
	conn = new(atomic.Pointer[net.Conn])
	var dials atomic.Int32
	c = &agent.Client{Addrs: []string{addr}, Token: token, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				select {
				case <-gate:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			nc, err := (&net.Dialer{}).DialContext(ctx, network, a)
			if err == nil {
				conn.Store(&nc)
			}
			return nc, err
		}}
	t.Cleanup(func() { c.Close() })
	return c, gate, conn
}

// TestRestartRefusesStaleTicket: bob binds victim, keeps its endpoint
// ticket and unbinds; alice binds victim; the edge restarts. Bob, asking
// first with his old ticket, is refused, and told why; alice gets her
// name back and keeps it. With tokens, and without authentication, where
// bob's session ticket gives him his identity back.
func TestRestartRefusesStaleTicket(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		auth         bool
		alice, bob   string // tokens
		bobKeepsSelf bool   // bob's second hello shows his session ticket
	}{
		{"tokens", true, "alice-token", "bob-token", false},
		{"anonymous", false, "", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, dir := []byte(strings.Repeat("s", 32)), t.TempDir()
			newServer := func() *edge.Server {
				srv := &edge.Server{TicketKey: key, StateDir: dir, Domain: "example.test", Timeouts: edge.Timeouts{Grace: time.Minute}}
				if c.auth {
					srv.Authenticate = tokens
				}
				return srv
			}
			te1 := edgeOn(t, newServer(), listen(t), listen(t))

			bob, hello := dialRaw(t, te1.agentAddr, c.bob, "")
			resp := bob.bind("victim", "")
			if resp.BindResp == nil {
				t.Fatalf("bob's bind: %+v", resp.Error)
			}
			old := resp.BindResp.Ticket
			if resp := bob.call(wire.Request{Op: wire.OpUnbind, Unbind: &wire.Unbind{TunnelID: resp.BindResp.TunnelID}}); resp.Error != nil {
				t.Fatalf("bob's unbind: %+v", resp.Error)
			}

			alice, gate, _ := gatedClient(t, te1.agentAddr, c.alice)
			l := bind(t, alice, "http://victim")
			serve(t, l, "alice")
			url := l.URL()

			te2 := te1.restart(t, newServer())
			sessionTicket := ""
			if c.bobKeepsSelf {
				sessionTicket = hello.Ticket
			}
			bob2, _ := dialRaw(t, te2.agentAddr, c.bob, sessionTicket)
			resp = bob2.bind("victim", old)
			if resp.Error == nil || resp.Error.Code != wire.CodeNameTaken || !strings.Contains(resp.Error.Message, "when the edge stopped") {
				t.Fatalf("bob asking for victim with his stale ticket after the restart: %+v %+v, want name_taken saying alice held it when the edge stopped", resp.BindResp, resp.Error)
			}
			t.Logf("bob was told: %s", resp.Error.Message)

			close(gate)
			testwait.For(t, func() bool {
				resp, body := get(t, te2, url+"/", nil)
				return resp.StatusCode == 200 && body == "alice /"
			})
			if l.URL() != url {
				t.Fatalf("alice came back as %q, want %q", l.URL(), url)
			}
			if resp := bob2.bind("victim", old); resp.Error == nil || resp.Error.Code != wire.CodeNameTaken {
				t.Fatalf("bob again once alice is back: %+v %+v, want name_taken", resp.BindResp, resp.Error)
			}
			if resp, body := get(t, te2, url+"/", nil); resp.StatusCode != 200 || body != "alice /" {
				t.Fatalf("victim after bob tried again: %d %q, want alice's app", resp.StatusCode, body)
			}
		})
	}
}

// TestRestartKeepsNameFromAgentThatLostIt: bob's agent loses its session
// and, while it is away past its grace, alice takes victim; the edge
// restarts; bob's agent, back first with the endpoint ticket it kept,
// does not get victim (its listener ends, name taken), and alice's agent,
// back after it, does.
func TestRestartKeepsNameFromAgentThatLostIt(t *testing.T) {
	t.Parallel()
	key, dir := []byte(strings.Repeat("p", 32)), t.TempDir()
	srv1 := &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test", Timeouts: edge.Timeouts{Grace: 50 * time.Millisecond}}
	te1 := edgeOn(t, srv1, listen(t), listen(t))

	bob, bobGate, bobConn := gatedClient(t, te1.agentAddr, "bob-token")
	bl := bind(t, bob, "http://victim")
	bobAccept := make(chan error, 1)
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				bobAccept <- err
				return
			}
			c.Close()
		}
	}()
	(*bobConn.Load()).Close() // bob's network drops; his agent waits at bobGate

	alice, aliceGate, _ := gatedClient(t, te1.agentAddr, "alice-token")
	var al *agent.Listener
	testwait.For(t, func() bool { // once bob's reservation lapsed
		var err error
		al, err = alice.Listen(context.Background(), "http://victim")
		return err == nil
	})
	serve(t, al, "alice")
	url := al.URL()

	te2 := te1.restart(t, &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test", Timeouts: edge.Timeouts{Grace: time.Minute}})
	close(bobGate)
	select {
	case err := <-bobAccept:
		if !errors.Is(err, agent.ErrNameTaken) {
			t.Fatalf("bob's listener ended with %v, want ErrNameTaken", err)
		}
	case <-time.After(20 * time.Second):
		resp, body := get(t, te2, url+"/", nil)
		t.Fatalf("bob's listener still open 20 s after his agent came back; victim answers %d %q", resp.StatusCode, body)
	}
	close(aliceGate)
	testwait.For(t, func() bool {
		resp, body := get(t, te2, url+"/", nil)
		return resp.StatusCode == 200 && body == "alice /"
	})
	if al.URL() != url {
		t.Fatalf("alice came back as %q, want %q", al.URL(), url)
	}
}

// TestFirstStartServesChosenNamesAtOnce: an edge that never ran grants a
// chosen name at once, with a record of names (empty directory) or
// without one (TicketKey alone). A restart keeps the names held when it
// stopped for their holders, and serves the others at once.
func TestFirstStartServesChosenNamesAtOnce(t *testing.T) {
	t.Parallel()
	key := []byte(strings.Repeat("f", 32))
	t.Run("no record", func(t *testing.T) {
		te := edgeOn(t, &edge.Server{TicketKey: key, Authenticate: tokens, Domain: "example.test"}, listen(t), listen(t))
		if _, err := tenant(t, te, "bob").Listen(context.Background(), "http://app"); err != nil {
			t.Fatalf("a chosen name on an edge with a ticket key and no record: %v, want it at once", err)
		}
	})
	t.Run("record", func(t *testing.T) {
		dir := t.TempDir()
		newServer := func() *edge.Server {
			return &edge.Server{TicketKey: key, StateDir: dir, Authenticate: tokens, Domain: "example.test", Timeouts: edge.Timeouts{Grace: time.Minute}}
		}
		te1 := edgeOn(t, newServer(), listen(t), listen(t))
		bob, gate, _ := gatedClient(t, te1.agentAddr, "bob-token")
		l, err := bob.Listen(context.Background(), "http://app")
		if err != nil {
			t.Fatalf("a chosen name at the first start: %v, want it at once", err)
		}
		serve(t, l, "bob")
		url := l.URL()

		te2 := te1.restart(t, newServer())
		alice := tenant(t, te2, "alice")
		if _, err := alice.Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
			t.Fatalf("alice asking for bob's name after the restart: %v, want ErrNameTaken", err)
		}
		_, err = alice.Listen(context.Background(), "http://x.app.example.test")
		if !errors.Is(err, agent.ErrNameTaken) || !strings.Contains(err.Error(), "held app.example.test when the edge stopped") {
			t.Fatalf("alice asking for a name under bob's after the restart: %v, want ErrNameTaken saying bob's name was kept for him", err)
		}
		if _, err := alice.Listen(context.Background(), "http://fresh"); err != nil {
			t.Fatalf("a name nobody held, after the restart: %v, want it at once", err)
		}
		close(gate)
		testwait.For(t, func() bool {
			resp, body := get(t, te2, url+"/", nil)
			return resp.StatusCode == 200 && body == "bob /"
		})
	})
}

// TestStateDirUnusable: a StateDir the edge cannot write keeps it from
// starting, saying so.
func TestStateDirUnusable(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &edge.Server{Domain: "example.test", StateDir: filepath.Join(file, "sub")}
	defer srv.Close()
	if err := srv.Start(edge.Listeners{Agents: listen(t)}); err == nil || !strings.Contains(err.Error(), "StateDir") {
		t.Fatalf("Start with a StateDir under a file: %v, want an error naming StateDir", err)
	}
}

// TestRestartAfterCrashKeepsNames: the record is written as names change
// hands, so an edge killed without stopping (its record copied while it
// runs) still gives names back to their holders.
func TestRestartAfterCrashKeepsNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	te1 := edgeOn(t, &edge.Server{StateDir: dir, Authenticate: tokens, Domain: "example.test"}, listen(t), listen(t))
	bind(t, tenant(t, te1, "alice"), "http://app")
	bob1 := tenant(t, te1, "bob")
	gone := bind(t, bob1, "http://gone")
	gone.Close() // free again, and recorded so
	b, err := os.ReadFile(filepath.Join(dir, "names.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	crashed := t.TempDir()
	if err := os.WriteFile(filepath.Join(crashed, "names.jsonl"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	te2 := edgeOn(t, &edge.Server{StateDir: crashed, Authenticate: tokens, Domain: "example.test"}, listen(t), listen(t))
	bob := tenant(t, te2, "bob")
	if _, err := bob.Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob asking for alice's name after the crash: %v, want ErrNameTaken", err)
	}
	if _, err := tenant(t, te2, "alice").Listen(context.Background(), "http://gone"); err != nil {
		t.Fatalf("alice asking for the name bob released before the crash: %v, want it at once", err)
	}
	if _, err := tenant(t, te2, "alice").Listen(context.Background(), "http://app"); err != nil {
		t.Fatalf("alice asking for her name after the crash: %v", err)
	}
}
