package edge_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/policy"
)

// TestPolicyChanged: an operator policy changed while the edge runs holds
// for the endpoints bound before it, at their next request, once the edge
// is told (Server.PolicyChanged); a change that refuses an endpoint's own
// policy refuses its traffic rather than let it through unchecked.
func TestPolicyChanged(t *testing.T) {
	t.Parallel()
	var op atomic.Pointer[policy.Operator]
	op.Store(&policy.Operator{})
	srv := &edge.Server{Policy: func(string) policy.Operator { return *op.Load() }}
	te, _ := tenantEdge(t, srv)
	alice := tenant(t, te, "alice")
	serve(t, bind(t, alice, "http://shop"), "alice")
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != 200 || body != "alice /" {
		t.Fatalf("before: %d %q", r.StatusCode, body)
	}
	deny := policy.Operator{Policy: policy.Spec{CIDRDeny: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}
	op.Store(&deny)
	if r, _ := get(t, te, te.url("shop"), nil); r.StatusCode != 200 {
		t.Fatalf("changed, the edge not told yet: %d, want 200 (what was compiled holds)", r.StatusCode)
	}
	srv.PolicyChanged()
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("after PolicyChanged: %d %q, want 403", r.StatusCode, body)
	}
	// An operator policy that leaves agents no basic_auth refuses an
	// endpoint that declared one: its traffic is refused, not let through.
	op.Store(&policy.Operator{})
	srv.PolicyChanged()
	l, err := alice.ListenEndpoint(t.Context(), agent.Endpoint{URL: "http://locked", Policy: &policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"ann:pw"}}}})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, l, "locked")
	op.Store(&policy.Operator{Kinds: []string{policy.KindCIDRDeny}})
	srv.PolicyChanged()
	if r, body := get(t, te, te.url("locked"), nil); r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("an endpoint whose policy the new operator's refuses: %d %q, want 503", r.StatusCode, body)
	}
	if r, body := get(t, te, te.url("shop"), nil); r.StatusCode != 200 || body != "alice /" {
		t.Errorf("an endpoint without a policy of its own: %d %q", r.StatusCode, body)
	}
}

// TestSetLimits: limits changed while the edge runs hold from the next
// bind and the next connection; what is held already stays, above a
// lowered bound too.
func TestSetLimits(t *testing.T) {
	t.Parallel()
	start := edge.Limits{EndpointsPerIdentity: 2, ConnsPerSource: 2}
	obs := &tally{}
	srv := &edge.Server{Limits: start, Observer: obs}
	quota := "refused/" + string(edge.ReasonIdentityEndpointLimit)
	te, _ := tenantEdge(t, srv)
	alice := tenant(t, te, "alice")
	bind(t, alice, "http://one")
	bind(t, alice, "http://two")
	if err := listenRefused(alice, "http://three", obs, quota); !errors.Is(err, agent.ErrUnavailable) {
		t.Fatalf("a third endpoint past 2: %v, want ErrUnavailable", err)
	}
	raised := start
	raised.EndpointsPerIdentity = 3
	raised.ConnsPerSource = 3
	if err := srv.SetLimits(raised); err != nil {
		t.Fatal(err)
	}
	three := bind(t, alice, "http://three")
	lowered := raised
	lowered.EndpointsPerIdentity = 1
	if err := srv.SetLimits(lowered); err != nil {
		t.Fatal(err)
	}
	if err := listenRefused(alice, "http://four", obs, quota); !errors.Is(err, agent.ErrUnavailable) {
		t.Errorf("a bind past the lowered bound: %v, want ErrUnavailable", err)
	}
	three.Close()
	if n := len(srv.Endpoints()); n != 2 {
		t.Errorf("%d endpoints after the bound was lowered, want the 2 held", n)
	}

	// Connections: the third of one source is taken once the bound is 3,
	// the fourth is closed as it is accepted.
	answers := func(c net.Conn) bool {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: nobody.example.test\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}
	for i := range 4 {
		c, err := net.Dial("tcp", te.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close() // held open: each counts against the source
		if got, want := answers(c), i < 3; got != want {
			t.Errorf("connection %d answered: %v, want %v", i+1, got, want)
		}
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.SetLimits(start); !errors.Is(err, edge.ErrServerClosed) {
		t.Errorf("SetLimits once closed: %v, want ErrServerClosed", err)
	}
}
