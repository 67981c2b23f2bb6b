package edge_test

// The operator's log (issue #20, item 5): a refused token and a refused
// bind each get a line at once, saying who and why, within a budget per
// source that a stranger's flood cannot raise; the start says what the
// ECH keys and certificates cover.

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/sni"
)

// logRecord is one line a recordingLog kept: its level, message and
// attributes as text.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

// recordingLog is a slog.Handler that keeps every line at Info or above,
// and tells each new one on a channel without ever blocking.
type recordingLog struct {
	mu    *sync.Mutex
	lines *[]logRecord
	seen  chan struct{}
	attrs []slog.Attr
}

func newRecordingLog() (*slog.Logger, *recordingLog) {
	h := &recordingLog{mu: new(sync.Mutex), lines: new([]logRecord), seen: make(chan struct{}, 1)}
	return slog.New(h), h
}

func (h *recordingLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *recordingLog) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{r.Level, r.Message, map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	*h.lines = append(*h.lines, rec)
	h.mu.Unlock()
	select {
	case h.seen <- struct{}{}:
	default:
	}
	return nil
}
func (h *recordingLog) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(slices.Clip(h.attrs), as...)
	return &c
}
func (h *recordingLog) WithGroup(string) slog.Handler { return h }

// matching returns the lines kept so far for which f is true.
func (h *recordingLog) matching(f func(logRecord) bool) []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []logRecord
	for _, r := range *h.lines {
		if f(r) {
			out = append(out, r)
		}
	}
	return out
}

// await waits for a line for which f is true, and returns it; it fails
// the test when none came within 10 s.
func (h *recordingLog) await(t testing.TB, what string, f func(logRecord) bool) logRecord {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		if m := h.matching(f); len(m) > 0 {
			return m[0]
		}
		select {
		case <-h.seen:
		case <-timeout:
			t.Fatalf("no log line %s within 10 s; lines: %v", what, h.matching(func(logRecord) bool { return true }))
		}
	}
}

// helloFrom sends a hello with token from a session it opens on the
// agent listener at addr, and returns the answer and the session's local
// address.
func helloFrom(t testing.TB, addr, token string) (wire.Response, string) {
	t.Helper()
	s := rawSession(t, addr)
	defer s.Close()
	st, err := s.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.Write(mustMessage(t, wire.Request{Op: wire.OpHello, Hello: &wire.Hello{Version: wire.Version, Token: token}}))
	var resp wire.Response
	if err := wire.ReadMessage(st, &resp); err != nil {
		t.Fatal(err)
	}
	return resp, s.LocalAddr().String()
}

func isAuthLine(r logRecord) bool {
	return strings.HasPrefix(r.msg, "agent refused: authentication failed")
}

// TestRefusedTokensLogged: a refused token is logged at once, at Warn,
// with the agent's address; a flood of them from one address (no throttle
// in the way) adds a bounded number of lines; a refused token from
// another address is still logged at once, and a good agent is served.
func TestRefusedTokensLogged(t *testing.T) {
	t.Parallel()
	log, rec := newRecordingLog()
	srv := &edge.Server{Domain: "example.test", Authenticate: tokens, Logger: log, Limits: edge.Limits{AuthFailures: -1}}
	te := edgeOn(t, srv, listen(t), listen(t))

	resp, from := helloFrom(t, te.agentAddr, "wrong")
	if resp.Error == nil || resp.Error.Code != wire.CodeUnauthorized {
		t.Fatalf("a wrong token: %+v", resp)
	}
	line := rec.await(t, "for the refused token", func(r logRecord) bool { return isAuthLine(r) && r.attrs["agent_addr"] == from })
	if line.level < slog.LevelWarn || !strings.Contains(line.attrs["err"], "unknown token") {
		t.Fatalf("the line for a refused token: %+v, want Warn with the agent's address and why", line)
	}

	const flood = 200
	for range flood {
		if resp, _ := helloFrom(t, te.agentAddr, "wrong"); resp.Error == nil {
			t.Fatal("a wrong token was accepted")
		}
	}
	if n := len(rec.matching(isAuthLine)); n > 5 {
		t.Fatalf("%d lines for %d refused tokens from one address, want at most 5 (a minute's budget of one source)", n, flood+1)
	}

	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	go srv.ServeAgents(ln6)
	_, from6 := helloFrom(t, ln6.Addr().String(), "wrong too")
	rec.await(t, "for a refused token from another address", func(r logRecord) bool { return isAuthLine(r) && r.attrs["agent_addr"] == from6 })

	good := &agent.Client{Addrs: []string{te.agentAddr}, Token: "alice-token"}
	defer good.Close()
	l := bind(t, good, "http://app")
	serve(t, l, "alice")
	if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("a good agent after the flood: %d %q", resp.StatusCode, body)
	}
	srv.Close()
	agg := rec.matching(func(r logRecord) bool { return strings.Contains(r.msg, "not logged one by one") })
	if len(agg) != 1 || agg[0].attrs["failures"] == "0" {
		t.Fatalf("aggregate lines %v, want one counting the failures not logged one by one", agg)
	}
}

// TestRefusedBindsLogged: a refused bind is logged at once with the
// identity, the name and why; a flood of refused binds from one agent adds
// a bounded number of lines, and the name's owner is served.
func TestRefusedBindsLogged(t *testing.T) {
	t.Parallel()
	log, rec := newRecordingLog()
	// The log's own budget, without the throttle of refused binds, which
	// would spread the flood over a minute and more.
	te, _ := tenantEdge(t, &edge.Server{Logger: log, Limits: edge.Limits{RefusedBinds: -1}})
	al := bind(t, tenant(t, te, "alice"), "http://app")
	serve(t, al, "alice")

	isBindLine := func(r logRecord) bool { return r.msg == "bind refused" }
	if _, err := tenant(t, te, "bob").Listen(context.Background(), "http://app"); !errors.Is(err, agent.ErrNameTaken) {
		t.Fatalf("bob binding alice's name: %v", err)
	}
	line := rec.await(t, "for bob's refused bind", isBindLine)
	if line.attrs["identity"] != "bob" || line.attrs["name"] != "app" || line.attrs["code"] != wire.CodeNameTaken || !strings.Contains(line.attrs["reason"], "held by another owner") {
		t.Fatalf("the line for a refused bind: %+v, want bob, app, name_taken and why", line)
	}

	bob, _ := dialRaw(t, te.agentAddr, "bob-token", "")
	for i := range 100 {
		if resp := bob.bind("app", ""); resp.Error == nil {
			t.Fatalf("bind %d of alice's name granted", i)
		}
	}
	if n := len(rec.matching(isBindLine)); n > 5 {
		t.Fatalf("%d lines for 101 refused binds from one address, want at most 5", n)
	}
	if resp, body := get(t, te, te.url("app")+"/", nil); resp.StatusCode != 200 || body != "alice /" {
		t.Fatalf("alice after bob's flood: %d %q", resp.StatusCode, body)
	}
}

// TestStartLogsECHAndCertificates: the start names the ECH keys' public
// names, and warns of certificates that cover neither a name under the
// domain nor those public names; certificates that cover them get no
// warning.
func TestStartLogsECHAndCertificates(t *testing.T) {
	t.Parallel()
	const public = "public.other.test"
	key, _, err := sni.NewECHKey(public)
	if err != nil {
		t.Fatal(err)
	}
	ca := testpki.New(t)
	for _, c := range []struct {
		name  string
		certs []tls.Certificate
		warn  bool
	}{
		{"another domain's certificate", []tls.Certificate{ca.Issue(t, "*.elsewhere.test")}, true},
		{"the domain and the public name", []tls.Certificate{ca.Issue(t, "*.example.test"), ca.Issue(t, public)}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			log, rec := newRecordingLog()
			srv := &edge.Server{Domain: "example.test", ECHKeys: []tls.EncryptedClientHelloKey{key}, Certificates: c.certs, Logger: log}
			defer srv.Close()
			if err := srv.Start(edge.Listeners{TLS: listen(t)}); err != nil {
				t.Fatal(err)
			}
			loaded := rec.matching(func(r logRecord) bool { return r.msg == "ECH keys loaded" })
			if len(loaded) != 1 || !strings.Contains(loaded[0].attrs["public_names"], public) {
				t.Fatalf("lines naming the ECH keys: %v, want one naming %s", loaded, public)
			}
			warned := rec.matching(func(r logRecord) bool { return r.level == slog.LevelWarn && strings.Contains(r.msg, "cover neither") })
			if c.warn != (len(warned) == 1) {
				t.Fatalf("warnings %v, want one: %v", warned, c.warn)
			}
		})
	}
}
