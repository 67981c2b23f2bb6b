package edge_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
)

// TestUpdateInPlaceKeepsTheName: an endpoint whose policy changes in place
// (Listener.Update) keeps its URL, its name (another identity looping binds
// of it all along never gets it) and a download under way, which ends
// whole; the new policy holds for the next requests, and changing it back
// lifts it.
func TestUpdateInPlaceKeepsTheName(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{}
	te, _ := tenantEdge(t, srv)
	var events []view.Event
	var evMu sync.Mutex
	stopWatch := srv.Watch(func(e view.Event) {
		evMu.Lock()
		events = append(events, e)
		evMu.Unlock()
	})
	defer stopWatch()
	alice := tenant(t, te, "alice")
	l := bind(t, alice, "http://shop")
	const size = 8 << 20
	started := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/", nameHandler("alice"))
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		close(started)
		io.Copy(w, pattern(size))
	})
	url := l.URL()
	done := make(chan struct{})
	go func() { defer close(done); http.Serve(l, mux) }()
	t.Cleanup(func() { l.Close(); <-done })

	// A download under way, read slowly: a window's worth first.
	resp, err := te.httpClient.Get(te.url("shop") + "/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(4096); err != nil {
		t.Fatal(err)
	}

	// Bob loops binds of the name from two sessions all along.
	ctx, cancel := context.WithCancel(context.Background())
	var bobGot atomic.Bool
	var loops sync.WaitGroup
	for range 2 {
		bob := tenant(t, te, "bob")
		loops.Go(func() {
			for ctx.Err() == nil {
				bl, err := bob.Listen(ctx, "http://shop")
				if err == nil {
					bobGot.Store(true)
					bl.Close()
				}
			}
		})
	}

	deny := &policy.Spec{CIDRDeny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if err := l.Update(context.Background(), agent.Endpoint{Policy: deny}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if l.URL() != url {
		t.Errorf("URL after Update = %q, want %q", l.URL(), url)
	}
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("after the deny policy: %d %q, want 403", r.StatusCode, body)
	}
	// The download goes on, whole.
	n, err := io.Copy(io.Discard, br)
	if err != nil || n != size {
		t.Errorf("download across the Update: %d bytes, %v; want %d", n, err, size)
	}
	if err := l.Update(context.Background(), agent.Endpoint{URL: "http://shop"}); err != nil {
		t.Fatalf("Update back: %v", err)
	}
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != 200 || body != "alice /" {
		t.Errorf("after the policy was lifted: %d %q", r.StatusCode, body)
	}
	cancel()
	loops.Wait()
	if bobGot.Load() {
		t.Error("bob bound alice's name while it changed")
	}
	evMu.Lock()
	updates := 0
	for _, e := range events {
		if e.Kind == view.Update && e.URL == url {
			updates++
		}
		if e.Kind == view.Unbind && e.URL == url {
			t.Errorf("an unbind event for %s: %+v", url, e)
		}
	}
	evMu.Unlock()
	if updates != 2 {
		t.Errorf("%d update events, want 2", updates)
	}
}

// TestUpdateInPlaceTCP: a tcp endpoint changed in place keeps its port and
// its open connection; the new policy holds for the next connections.
func TestUpdateInPlaceTCP(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{TCPPorts: edge.PortRange{Min: 1024, Max: 65535}}
	te, _ := tenantEdge(t, srv)
	alice := tenant(t, te, "alice")
	l := bind(t, alice, "tcp://")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	addr := strings.TrimPrefix(l.URL(), "tcp://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string) error {
		if _, err := io.WriteString(c, msg); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			return errors.Join(err, errors.New("echo: "+string(buf)))
		}
		return nil
	}
	if err := echo("before"); err != nil {
		t.Fatal(err)
	}
	deny := &policy.Spec{CIDRDeny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	if err := l.Update(context.Background(), agent.Endpoint{URL: l.URL(), Policy: deny}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if strings.TrimPrefix(l.URL(), "tcp://") != addr {
		t.Errorf("URL after Update = %q, want tcp://%s", l.URL(), addr)
	}
	if err := echo("after"); err != nil {
		t.Errorf("the open connection after the Update: %v", err)
	}
	// A new connection is refused by the policy: closed with nothing read.
	c2, err := net.Dial("tcp", addr)
	if err == nil {
		c2.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c2, "x")
		if n, _ := c2.Read(make([]byte, 1)); n != 0 {
			t.Error("a new connection reached the app past the deny policy")
		}
		c2.Close()
	}
}

// TestUpdateRefusals: what an Update may not do leaves the endpoint as it
// was: another name, another protocol, a policy the endpoint's protocol
// cannot take, a pool whose other members disagree; and a raw bind naming
// another session's tunnel, or none, is refused.
func TestUpdateRefusals(t *testing.T) {
	t.Parallel()
	srv := &edge.Server{}
	te, _ := tenantEdge(t, srv)
	alice := tenant(t, te, "alice")
	l := bind(t, alice, "http://shop")
	serve(t, l, "alice")
	for _, c := range []struct {
		name string
		ep   agent.Endpoint
		want error
	}{
		{"another name", agent.Endpoint{URL: "http://other"}, nil},
		{"another protocol", agent.Endpoint{URL: "tls://shop.example.test"}, nil},
		{"a policy of no http endpoint", agent.Endpoint{Policy: &policy.Spec{OIDC: &policy.OIDC{Issuer: "https://issuer.example", ClientID: "x", ClientSecret: "y"}}}, nil},
	} {
		if err := l.Update(context.Background(), c.ep); err == nil {
			t.Errorf("%s: Update succeeded", c.name)
		}
		if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != 200 || body != "alice /" {
			t.Errorf("%s: the endpoint after a refused Update: %d %q", c.name, r.StatusCode, body)
		}
	}

	// A pool: alice's two sessions share "pool"; one of them alone cannot
	// give it a policy the other has not.
	p1 := bind(t, alice, "")
	p1.Close()
	a2 := tenant(t, te, "alice")
	m1, err := alice.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pool", Pool: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a2.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://pool", Pool: true}); err != nil {
		t.Fatal(err)
	}
	deny := &policy.Spec{CIDRDeny: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	if err := m1.Update(context.Background(), agent.Endpoint{Pool: true, Policy: deny}); !errors.Is(err, agent.ErrNameTaken) {
		t.Errorf("a policy for one member of a pool: %v, want ErrNameTaken", err)
	}

	// Raw binds that name a tunnel they may not replace.
	raw, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	for _, id := range []string{"", "nope", strings.Repeat("x", 5000)} {
		b := &wire.Bind{Proto: wire.ProtoHTTP, Name: "shop", Replaces: id}
		if id == "" {
			b.Replaces = tunnelOf(t, srv, l.URL()) // alice's, from bob's session
		}
		resp := raw.call(wire.Request{Op: wire.OpBind, Bind: b})
		if resp.Error == nil {
			t.Errorf("bob's bind replacing %q: granted %+v", id, resp.BindResp)
		}
	}
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != 200 || body != "alice /" {
		t.Errorf("alice's endpoint after bob's tries: %d %q", r.StatusCode, body)
	}

	// From the session that holds the tunnel: another name, another
	// protocol, or a second replace of a tunnel already replaced.
	own, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	first := own.bind("raw1", "")
	if first.BindResp == nil {
		t.Fatalf("bind raw1: %+v", first.Error)
	}
	id := first.BindResp.TunnelID
	for _, b := range []*wire.Bind{
		{Proto: wire.ProtoHTTP, Name: "raw2", Replaces: id},
		{Proto: wire.ProtoTLS, Name: "raw1.example.test", Replaces: id},
		{Proto: wire.ProtoHTTP, Replaces: id}, // a random name
	} {
		if resp := own.call(wire.Request{Op: wire.OpBind, Bind: b}); resp.Error == nil || resp.Error.Code != wire.CodeBadRequest {
			t.Errorf("replace %+v: %+v, want bad_request", b, resp)
		}
	}
	second := own.call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: "RAW1.example.test.", Replaces: id}})
	if second.BindResp == nil || second.BindResp.URL != first.BindResp.URL || second.BindResp.TunnelID == id {
		t.Fatalf("replace of raw1 under another spelling: %+v, want %s under a new tunnel", second, first.BindResp.URL)
	}
	if resp := own.call(wire.Request{Op: wire.OpBind, Bind: &wire.Bind{Proto: wire.ProtoHTTP, Name: "raw1", Replaces: id}}); resp.Error == nil || resp.Error.Code != wire.CodeNotFound {
		t.Errorf("a second replace of the tunnel replaced: %+v, want not_found", resp)
	}
	if n := len(srv.Endpoints()); n != 4 {
		t.Errorf("%d endpoints on the edge, want 4 (shop, pool twice, raw1 once)", n)
	}
}

// tunnelOf returns the tunnel ID of the endpoint at url on srv.
func tunnelOf(t *testing.T, srv *edge.Server, url string) string {
	t.Helper()
	for _, e := range srv.Endpoints() {
		if e.URL == url {
			return e.Tunnel
		}
	}
	t.Fatalf("no endpoint %s", url)
	return ""
}
