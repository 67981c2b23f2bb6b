package etcdrouter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/relay"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// relayEdge is an edge of a cluster on etcd: a Server with its Router,
// its Relay serving on relayAddr, its ID.
type relayEdge struct {
	srv                            *edge.Server
	rt                             *Router
	agentAddr, httpAddr, relayAddr string
}

func startRelayEdge(t *testing.T, ca *testpki.CA, prefix string) *relayEdge {
	t.Helper()
	lns := make([]net.Listener, 3)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	agents, pub, relayLn := lns[0], lns[1], lns[2]
	id := relayLn.Addr().String()
	rt := newRouter(t, Config{Prefix: prefix, Edge: id})
	srv := &edge.Server{ID: id, Domain: "example.test", Router: rt}
	rl := &relay.Relay{Server: srv, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{ca.IssueEdge(t, []string{id}, "127.0.0.1")},
		RootCAs:      ca.Pool,
		ClientCAs:    ca.Pool,
	}}
	srv.Dialer = rl
	if err := srv.Start(edge.Listeners{Agents: agents, HTTP: pub}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { rl.Serve(relayLn) })
	t.Cleanup(func() { rl.Close(); srv.Close(); wg.Wait() })
	return &relayEdge{srv: srv, rt: rt, agentAddr: agents.Addr().String(), httpAddr: pub.Addr().String(), relayAddr: id}
}

// refused reports whether the relay at addr refuses a peer with cert,
// which it hears at its first read (TLS 1.3); an admitted peer hears
// nothing (the relay waits for its streams) until the read's deadline, a
// safety net long past any refusal.
func refused(t *testing.T, addr string, cert tls.Certificate, ca *testpki.CA) bool {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Pool, ServerName: "127.0.0.1"})
	if err != nil {
		return true
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestRelayAdmitsEdgesRegisteredInEtcd: edges on etcd relay to each
// other; the relay certificate of an edge that never joined, and that of
// an edge that left (its Router closed), open no relay session, though
// the cluster's CA signed them for edges.
func TestRelayAdmitsEdgesRegisteredInEtcd(t *testing.T) {
	prefix := uniquePrefix(t)
	ca := testpki.New(t)
	a := startRelayEdge(t, ca, prefix)
	b := startRelayEdge(t, ca, prefix)

	ag := &agent.Client{Addrs: []string{a.agentAddr}}
	t.Cleanup(func() { ag.Close() })
	l, err := ag.Listen(context.Background(), "http://app")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "xff=%s", r.Header.Get("X-Forwarded-For"))
	}))
	get := func() error {
		req, _ := http.NewRequest("GET", "http://"+b.httpAddr+"/", nil)
		req.Host = "app.example.test"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "xff=127.0.0.1" {
			return fmt.Errorf("%s %q", resp.Status, body)
		}
		return nil
	}
	// B relays to A once its cache has A's route.
	testwait.Within(t, callTimeout, "a client of B reaches the agent on A", func() bool { return get() == nil })

	if !refused(t, a.relayAddr, ca.IssueEdge(t, []string{"127.0.0.1:1"}, "127.0.0.1"), ca) {
		t.Error("the certificate of an edge that never joined opened a relay session")
	}
	left := newRouter(t, Config{Prefix: prefix, Edge: "127.0.0.1:2"})
	testwait.Within(t, callTimeout, "the edge that joined a member for A", isMember(t, a.rt, "127.0.0.1:2", true))
	if err := left.Close(); err != nil {
		t.Fatal(err)
	}
	testwait.Within(t, callTimeout, "the edge that left no member for A", isMember(t, a.rt, "127.0.0.1:2", false))
	if !refused(t, a.relayAddr, ca.IssueEdge(t, []string{"127.0.0.1:2"}, "127.0.0.1"), ca) {
		t.Error("the certificate of an edge that left opened a relay session")
	}
	if err := get(); err != nil {
		t.Fatalf("a client of B after the refusals: %v", err)
	}
}
