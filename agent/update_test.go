package agent_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/policy"
)

// Update with no URL checks the endpoint's settings against the
// listener's own protocol: an https listener takes the policies of https
// (an oidc login, mutual TLS), and a tcp listener refuses those of http,
// h2c and verbose errors, before anything is sent.
func TestUpdateEmptyURLChecksTheListenersProtocol(t *testing.T) {
	addr, binds := bindEdge(t)
	c := &agent.Client{Addrs: []string{addr}}
	defer c.Close()
	ctx := context.Background()

	https, err := c.Listen(ctx, "https://app")
	if err != nil {
		t.Fatal(err)
	}
	defer https.Close()
	<-binds
	oidc := &policy.Spec{OIDC: &policy.OIDC{Issuer: "https://id.example", ClientID: "c", AllowDomains: []string{"example.com"}}}
	mtls := &policy.Spec{MutualTLS: &policy.MutualTLS{CAs: string(testpki.New(t).PEM)}}
	for _, spec := range []*policy.Spec{oidc, mtls} {
		if err := https.Update(ctx, agent.Endpoint{Policy: spec}); err != nil {
			t.Errorf("https listener, Update with %v: %v", spec.Kinds(), err)
			continue
		}
		if b := <-binds; b.Proto != wire.ProtoHTTPS || b.Policy == nil || b.Replaces == "" {
			t.Errorf("https listener, Update with %v sent %+v", spec.Kinds(), b)
		}
	}

	tcp, err := c.Listen(ctx, "tcp://")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	<-binds
	for _, tc := range []struct {
		ep   agent.Endpoint
		want string
	}{
		{agent.Endpoint{Policy: &policy.Spec{BasicAuth: &policy.BasicAuth{Credentials: []string{"a:b"}}}}, "basic_auth is not for tcp endpoints"},
		{agent.Endpoint{AppProtocol: "h2c"}, "needs an http or https endpoint"},
		{agent.Endpoint{VerboseErrors: true}, "verbose errors need an http or https endpoint"},
	} {
		err := tcp.Update(ctx, tc.ep)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("tcp listener, Update with %+v: %v; want an error saying %s", tc.ep, err, tc.want)
		}
		if tc.ep.Policy != nil && !errors.Is(err, policy.ErrProtocol) {
			t.Errorf("tcp listener, Update with %+v: %v; want policy.ErrProtocol", tc.ep, err)
		}
	}
	select {
	case b := <-binds:
		t.Errorf("a refused Update was sent: %+v", b)
	default:
	}
}

// logSignal is a slog handler that closes a channel at the first record
// of a message.
type logSignal struct {
	msg  string
	seen chan struct{}
}

func (h *logSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *logSignal) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logSignal) WithGroup(string) slog.Handler            { return h }
func (h *logSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case <-h.seen:
		default:
			close(h.seen)
		}
	}
	return nil
}

// While Update waits for the endpoint's former health check to end (here a
// check that takes no notice of its context), proxy streams for tunnels
// the agent does not know are answered: they do not wait for it.
func TestUpdateHealthStopHoldsNoStream(t *testing.T) {
	srv, rt, addr := startEdge(t)
	changed := &logSignal{msg: "endpoint changed in place", seen: make(chan struct{})}
	c := &agent.Client{Addrs: []string{addr}, Logger: slog.New(changed)}
	defer c.Close()
	ctx := context.Background()

	other, err := c.Listen(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	slow := &agent.HealthCheck{
		Check: func(context.Context) error {
			close(entered) // once: the next check comes in an hour
			<-release
			return nil
		},
		Interval: time.Hour, Timeout: 59 * time.Minute,
	}
	l, err := c.ListenEndpoint(ctx, agent.Endpoint{URL: "http://app", HealthCheck: slow})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	<-entered

	updated := make(chan error, 1)
	go func() {
		updated <- l.Update(ctx, agent.Endpoint{HealthCheck: &agent.HealthCheck{Check: func(context.Context) error { return nil }}})
	}()
	<-changed.seen // the edge granted it; now the former check is stopped

	routes, _ := rt.Lookup(ctx, "http", "other.example.test")
	if len(routes) == 0 {
		t.Fatal("no route for other.example.test")
	}
	unknown := routes[0]
	unknown.TunnelID = "no-such-tunnel"
	answered := make(chan error, 1)
	go func() {
		conn, err := srv.DialRoute(ctx, unknown, edge.ConnInfo{Client: netip.MustParseAddrPort("192.0.2.1:40000"), Host: "other.example.test"})
		if err != nil {
			answered <- err
			return
		}
		defer conn.Close()
		_, err = io.ReadAll(conn)
		answered <- err
	}()
	waited := false
	select {
	case <-answered: // refused: no listener for it
	case <-time.After(20 * time.Second):
		t.Error("a proxy stream for an unknown tunnel waited for the former health check to end")
		waited = true
	}
	close(release)
	released = true
	if err := <-updated; err != nil {
		t.Fatalf("Update: %v", err)
	}
	if waited {
		<-answered
	}
}

// A health check in flight ends when its runner does: on the listener's
// Close, and when Update puts another check in its place.
func TestHealthCheckInFlightCancelled(t *testing.T) {
	for _, how := range []string{"Close", "Update"} {
		t.Run(how, func(t *testing.T) {
			_, _, addr := startEdge(t)
			c := &agent.Client{Addrs: []string{addr}}
			defer c.Close()
			entered, ended := make(chan struct{}), make(chan error, 1)
			hc := &agent.HealthCheck{
				Check: func(ctx context.Context) error {
					close(entered) // once: the next check comes in an hour
					<-ctx.Done()
					ended <- ctx.Err()
					return ctx.Err()
				},
				Interval: time.Hour, Timeout: 59 * time.Minute,
			}
			l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "http://app", HealthCheck: hc})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			<-entered
			updated := make(chan error, 1)
			switch how {
			case "Close":
				l.Close()
			case "Update":
				go func() {
					updated <- l.Update(context.Background(), agent.Endpoint{HealthCheck: &agent.HealthCheck{Check: func(context.Context) error { return nil }}})
				}()
			}
			select {
			case err := <-ended:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the check in flight ended with %v, want context.Canceled", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("%s left the health check in flight running", how)
			}
			if how == "Update" {
				c.Close() // ends the check, if it still runs, and so Update
				if err := <-updated; err != nil {
					t.Errorf("Update: %v", err)
				}
			}
		})
	}
}
