package edge_test

// ACME orders cost every tenant of a domain (issue #19): one tenant binding
// names by the hundred must not spend the CA's limits for the others, and a
// name nobody binds any more must stop costing orders and memory. Each test
// runs a real ACME server (pebble) validating through the edge's own
// ports.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/acme"
	"github.com/tunnelkit/tunnelkit/internal/testacme"
)

// changes lets a test wait for a condition on state that goroutines
// change: each change closes the channel waiters hold.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

// changed wakes every waiter.
func (c *changes) changed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
	}
	c.ch = make(chan struct{})
}

// wait waits until cond holds, checking it at each change, for at most
// timeout; it reports whether cond held.
func (c *changes) wait(timeout time.Duration, cond func() bool) bool {
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		if c.ch == nil {
			c.ch = make(chan struct{})
		}
		ch := c.ch
		c.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-deadline:
			return cond()
		}
	}
}

// orderLog records the name of each order an ACME server created for its
// client: a POST to pebble's newOrder ("/order-plz") answered 201. (An
// order resent after one of pebble's deliberate bad nonces is one order.)
type orderLog struct {
	base http.RoundTripper
	changes
	mu    sync.Mutex
	names []string
}

func (o *orderLog) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/order-plz") && r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body.Close()
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := o.base.RoundTrip(r)
	if err == nil && body != nil && resp.StatusCode == http.StatusCreated {
		o.mu.Lock()
		o.names = append(o.names, orderedName(body))
		o.mu.Unlock()
		o.changed()
	}
	return resp, err
}

// orderedName returns the name a newOrder request's JWS asks for.
func orderedName(body []byte) string {
	var jws struct{ Payload string }
	var order struct{ Identifiers []struct{ Value string } }
	json.Unmarshal(body, &jws)
	payload, _ := base64.RawURLEncoding.DecodeString(jws.Payload)
	json.Unmarshal(payload, &order)
	if len(order.Identifiers) != 1 {
		return "?"
	}
	return order.Identifiers[0].Value
}

// count returns the orders for names accepted by match (all when nil).
func (o *orderLog) count(match func(string) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, name := range o.names {
		if match == nil || match(name) {
			n++
		}
	}
	return n
}

// list returns the names ordered, in order.
func (o *orderLog) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.names...)
}

func named(name string) func(string) bool { return func(n string) bool { return n == name } }

// logRecords is a slog.Handler that keeps every record, at every level.
type logRecords struct {
	changes
	mu   sync.Mutex
	recs []logRecord
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	l.changed()
	return nil
}

// dump logs, with t, the records at level or above: what a failed
// test's edge said.
func (l *logRecords) dump(t *testing.T, level slog.Level) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.level >= level {
			t.Logf("edge: %s %s %v", r.level, r.msg, r.attrs)
		}
	}
}

func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// find returns the records whose message starts with prefix and whose
// attributes have the given key=value pairs.
func (l *logRecords) find(prefix string, kv ...string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []logRecord
next:
	for _, r := range l.recs {
		if !strings.HasPrefix(r.msg, prefix) {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if r.attrs[kv[i]] != kv[i+1] {
				continue next
			}
		}
		found = append(found, r)
	}
	return found
}

// acmeEdge is an edge with ACME from a pebble of its own, agents
// authenticated by "<identity>-token" (any identity), every order logged
// by name, every log record kept and every count tallied.
type acmeEdge struct {
	srv       *edge.Server
	pebble    *testacme.Pebble
	agentAddr string
	httpAddr  string
	tlsAddr   string
	roots     *x509.CertPool
	orders    *orderLog
	logs      *logRecords
	obs       *tally
}

// authenticateByToken authenticates agents by "<identity>-token".
func authenticateByToken(s *edge.Server) {
	s.Authenticate = func(_ context.Context, token string) (string, error) {
		if id, ok := strings.CutSuffix(token, "-token"); ok {
			return id, nil
		}
		return "", errors.New("unknown token")
	}
}

func startACMEEdge(t *testing.T, acme edge.ACME, opts ...testacme.Option) *acmeEdge {
	return startACMEEdgeWith(t, acme, authenticateByToken, opts...)
}

func startACMEEdgeWith(t *testing.T, acme edge.ACME, configure func(*edge.Server), opts ...testacme.Option) *acmeEdge {
	t.Helper()
	ls := edge.Listeners{Agents: listen(t), HTTP: listen(t), TLS: listen(t)}
	return startACMEEdgeOn(t, startPebbleFor(t, ls, opts...), ls, acme, configure)
}

// startPebbleFor starts a pebble that validates challenges on the ports of
// ls.HTTP and ls.TLS.
func startPebbleFor(t *testing.T, ls edge.Listeners, opts ...testacme.Option) *testacme.Pebble {
	t.Helper()
	httpPort, _ := strconv.Atoi(portOf(ls.HTTP))
	tlsPort, _ := strconv.Atoi(portOf(ls.TLS))
	return testacme.Start(t, httpPort, tlsPort, opts...)
}

// startACMEEdgeOn starts an edge on ls with ACME from pebble (which must
// validate on the ports of ls.HTTP and ls.TLS), with acme's other settings.
func startACMEEdgeOn(t *testing.T, pebble *testacme.Pebble, ls edge.Listeners, acme edge.ACME, configure func(*edge.Server)) *acmeEdge {
	t.Helper()
	e := &acmeEdge{
		pebble:    pebble,
		agentAddr: ls.Agents.Addr().String(),
		httpAddr:  ls.HTTP.Addr().String(),
		tlsAddr:   ls.TLS.Addr().String(),
		roots:     pebble.Roots(t),
		orders:    &orderLog{base: pebble.HTTPClient.Transport},
		logs:      &logRecords{},
		obs:       &tally{},
	}
	acme.DirectoryURL = pebble.DirectoryURL
	acme.Email = "ops@example.test"
	if acme.Cache == nil {
		acme.Cache = autocert.DirCache(t.TempDir())
	}
	acme.HTTPClient = &http.Client{Transport: e.orders, Timeout: 30 * time.Second}
	e.srv = &edge.Server{
		Domain:   "example.test",
		HTTPPort: portOf(ls.HTTP),
		TLSPort:  portOf(ls.TLS),
		ACME:     &acme,
		Logger:   slog.New(e.logs),
		Observer: e.obs,
		// A handshake waits for its name's order at most this long: a
		// minute, as the tests' own handshakes do, not the default 10 s.
		// Pebble rejects 5% of nonces, the ACME client backs off 1 s,
		// then 2 s, ... before each retry, and polls the authorization
		// and the order: on a loaded machine an order can outlast 10 s,
		// and its handshake then fails though the order succeeds (one CI
		// run saw 4 of mallory's 5 budgeted names get a certificate).
		Timeouts: edge.Timeouts{Handshake: time.Minute},
	}
	if configure != nil {
		configure(e.srv)
	}
	if err := e.srv.Start(ls); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.srv.Close()
		if t.Failed() {
			e.logs.dump(t, slog.LevelInfo)
		}
	})
	return e
}

// restart closes e and starts another edge in its place: on the same
// public ports (pebble validates there), with the same pebble and acme's
// settings (give it e's Cache), and a new agent port.
func (e *acmeEdge) restart(t *testing.T, acme edge.ACME, configure func(*edge.Server)) *acmeEdge {
	t.Helper()
	e.srv.Close()
	ls := edge.Listeners{Agents: listen(t), HTTP: listenOn(t, e.httpAddr), TLS: listenOn(t, e.tlsAddr)}
	return startACMEEdgeOn(t, e.pebble, ls, acme, configure)
}

// listenOn listens on addr again, which a closed listener held.
func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// agent returns a connected agent client of identity.
func (e *acmeEdge) agent(t *testing.T, identity string) *agent.Client {
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: identity + "-token"}
	t.Cleanup(func() { c.Close() })
	return c
}

// handshake completes a TLS handshake for name with the edge, verifying
// its certificate against pebble's root, and returns the certificate.
func (e *acmeEdge) handshake(name string) (*x509.Certificate, error) {
	// The context bounds the handshake, an order on demand included (a
	// NetDialer's Timeout would bound it too: tls.Dialer applies it to
	// the whole dial).
	d := &tls.Dialer{Config: &tls.Config{ServerName: name, RootCAs: e.roots}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", e.tlsAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// handshakeAll makes one handshake for each name, a few at a time, and
// returns how many succeeded.
func (e *acmeEdge) handshakeAll(names []string) int {
	var ok atomic.Int32
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, name := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := e.handshake(name); err == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// bindMany binds n https names, random ones under prefix, with c, and
// returns them.
func bindMany(t *testing.T, c *agent.Client, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		l := bind(t, c, fmt.Sprintf("https://%s%03d-%s", prefix, i, newHex(t)))
		names[i] = hostOf(t, l.URL())
	}
	return names
}

func newHex(*testing.T) string {
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x", b)
}

func hostOf(t *testing.T, url string) string {
	t.Helper()
	host, _, err := net.SplitHostPort(strings.TrimPrefix(url, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	return host
}

// TestACMEOrderBudget is issue #19's attack, against pebble: one tenant
// (mallory) binds 300 random https names and makes a handshake for each,
// then binds, handshakes and unbinds 30 more one at a time. Its orders stop
// at its budget (ACME.OrdersPerIdentity, 5 by default) while its other
// handshakes fail and are counted, without a log line each above Debug;
// another tenant (alice) still gets her certificate. Then more tenants
// spend the edge's own budget (ACME.OrdersPerHour, 12 here): the orders
// pebble got never pass it.
func TestACMEOrderBudget(t *testing.T) {
	const perHour = 12
	e := startACMEEdge(t, edge.ACME{OrdersPerHour: perHour})
	mallory := e.agent(t, "mallory")
	names := bindMany(t, mallory, "m", 300)
	if ok := e.handshakeAll(names); ok != acme.DefaultOrdersPerIdentity {
		t.Errorf("%d of mallory's 300 names got a certificate, want %d", ok, acme.DefaultOrdersPerIdentity)
	}
	isMallory := func(n string) bool { return strings.HasPrefix(n, "m") }
	if n := e.orders.count(nil); n != acme.DefaultOrdersPerIdentity || e.orders.count(isMallory) != n {
		t.Errorf("%d ACME orders (%d of them mallory's) for mallory's 300 names, want %d", n, e.orders.count(isMallory), acme.DefaultOrdersPerIdentity)
	}
	if n := e.obs.get("refused/acme_budget"); n != 300-acme.DefaultOrdersPerIdentity {
		t.Errorf("%d handshakes refused as acme_budget, want %d", n, 300-acme.DefaultOrdersPerIdentity)
	}

	// One at a time: bind, handshake, unbind.
	for i := range 30 {
		l := bind(t, mallory, fmt.Sprintf("https://n%03d-%s", i, newHex(t)))
		if _, err := e.handshake(hostOf(t, l.URL())); err == nil {
			t.Errorf("mallory's name %d bound after its budget was spent got a certificate", i)
		}
		l.Close()
	}
	if n := e.orders.count(nil); n != acme.DefaultOrdersPerIdentity {
		t.Errorf("%d ACME orders after 30 more names bound and unbound, want still %d", n, acme.DefaultOrdersPerIdentity)
	}

	// The well-behaved tenant.
	alice := e.agent(t, "alice")
	aliceName := hostOf(t, bind(t, alice, "https://alice").URL())
	if cert, err := e.handshake(aliceName); err != nil {
		t.Fatalf("alice, after mallory's 330 names: %v", err)
	} else if cert.DNSNames[0] != aliceName {
		t.Errorf("alice got a certificate for %v", cert.DNSNames)
	}

	// Three more tenants, ten names each: the edge's budget runs out.
	for _, id := range []string{"t1", "t2", "t3"} {
		e.handshakeAll(bindMany(t, e.agent(t, id), id+"-", 10))
	}
	if n := e.orders.count(nil); n != perHour {
		t.Errorf("%d ACME orders in all, want the edge's budget, %d", n, perHour)
	}
	late := hostOf(t, bind(t, alice, "https://alice-late").URL())
	if _, err := e.handshake(late); err == nil {
		t.Error("a name got a certificate past the edge's budget")
	}
	if n := e.orders.count(nil); n != perHour {
		t.Errorf("%d ACME orders, want %d", n, perHour)
	}

	// One line per issuance; one per budget spent; nothing above Debug
	// per refused handshake.
	if n := len(e.logs.find("acme: certificate issued")); n != perHour {
		t.Errorf("%d issuance lines for %d orders", n, perHour)
	}
	spent := e.logs.find("acme: order budget spent")
	for _, want := range [][]string{
		{"budget", "orders_per_identity", "owner", "mallory"},
		{"budget", "orders_per_hour"},
	} {
		if n := len(e.logs.find("acme: order budget spent", want...)); n != 1 {
			t.Errorf("%d lines for the budget %v spent, want 1", n, want)
		}
	}
	e.logs.mu.Lock()
	loud := 0
	for _, r := range e.logs.recs {
		if r.level > slog.LevelInfo {
			loud++
		}
	}
	e.logs.mu.Unlock()
	if loud > len(spent) {
		t.Errorf("%d records above Info, %d of them for budgets spent: want no other", loud, len(spent))
	}
	if n := len(e.logs.find("acme: no order: over budget")); n < 300 {
		t.Errorf("%d Debug lines for refused orders, want one per refused handshake", n)
	}

	// Close waits for the certificates' upkeep and every order.
	e.srv.Close()
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "acme.(*certManager)") {
		t.Errorf("the ACME manager's goroutines outlive Close:\n%s", stacks)
	}
}

// TestACMEAnonymousAgentsShareOneBudget is issue #32's item 3: on an edge
// that authenticates no agent, every session is an identity of its own,
// which any client can have as many of as it likes, from as many
// addresses as it has (ten IPv6 /64s are one /60). Anonymous agents from
// ten addresses, each binding two names, get between them one identity's
// share: ACME.OrdersPerIdentity orders in the hour (before, each address
// had its own, and ten made 20 orders here).
func TestACMEAnonymousAgentsShareOneBudget(t *testing.T) {
	t.Parallel()
	const sources = 10
	e := startACMEEdgeWith(t, edge.ACME{}, nil)
	var names []string
	for i := range sources {
		ip := fmt.Sprintf("127.0.0.%d", 11+i)
		c := &agent.Client{Addrs: []string{e.agentAddr}, DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialSource(ctx, ip, addr)
		}}
		t.Cleanup(func() { c.Close() })
		names = append(names, bindMany(t, c, fmt.Sprintf("s%d-", i), 2)...)
	}
	got := e.handshakeAll(names)
	if want := acme.DefaultOrdersPerIdentity; got != want || e.orders.count(nil) != want {
		t.Errorf("anonymous agents from %d addresses, %d names: %d certificates, %d orders; want one identity's share, %d",
			sources, len(names), got, e.orders.count(nil), want)
	}
	if n := len(e.logs.find("acme: order budget spent", "budget", "orders_per_identity")); n != 1 {
		t.Errorf("%d lines for the anonymous agents' budget spent, want 1", n)
	}
}

// TestACMEBudgetSurvivesRestart is issue #32's item 3: the budgets' spending
// is kept in the Cache, so that a restart does not give it back. Before a
// restart, alice spends her share of the week (2 of 4) and bob 1 of the
// edge's week; after it, with the same Cache, alice's next name and, once
// bob spent the edge's last order of the week, carol's get none.
func TestACMEBudgetSurvivesRestart(t *testing.T) {
	t.Parallel()
	acme := edge.ACME{OrdersPerWeek: 4, IdentityShare: 0.5, Cache: autocert.DirCache(t.TempDir())}
	e := startACMEEdge(t, acme)
	if got := e.handshakeAll(bindMany(t, e.agent(t, "alice"), "a", 2)); got != 2 {
		t.Fatalf("alice got %d certificates, want 2", got)
	}
	if got := e.handshakeAll(bindMany(t, e.agent(t, "bob"), "b", 1)); got != 1 {
		t.Fatalf("bob got %d certificates, want 1", got)
	}

	e = e.restart(t, acme, authenticateByToken)
	if got := e.handshakeAll(bindMany(t, e.agent(t, "alice"), "a-again", 1)); got != 0 {
		t.Errorf("alice, her share of the week spent before the restart, got %d certificates after it", got)
	}
	if got := e.handshakeAll(bindMany(t, e.agent(t, "bob"), "b-again", 1)); got != 1 {
		t.Errorf("bob got %d certificates after the restart, want 1 (his share is not spent)", got)
	}
	if got := e.handshakeAll(bindMany(t, e.agent(t, "carol"), "c", 1)); got != 0 {
		t.Errorf("carol got %d certificates after the edge's week was spent, before and after a restart", got)
	}
	if n := e.orders.count(nil); n != 1 {
		t.Errorf("%d orders after the restart (%v), want 1, bob's", n, e.orders.list())
	}
	if n := e.obs.get("refused/acme_budget"); n != 2 {
		t.Errorf("%d handshakes refused as acme_budget after the restart, want 2", n)
	}
	if n := len(e.logs.find("acme: order budget spent", "budget", "orders_per_week")); n != 1 {
		t.Errorf("%d lines for the week's budget spent after the restart, want 1", n)
	}
}

// TestACMEBudgetRecordNotValid: a record of the budgets in the Cache that
// is not one an edge wrote (here, garbage over the one the first edge
// wrote) neither stops a restarted edge nor crashes it: the edge says so
// at the Error level, naming the key, keeps the bytes under the key and
// "+corrupt", starts its budgets full and writes a valid record at its
// next order.
func TestACMEBudgetRecordNotValid(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	acme := edge.ACME{Cache: autocert.DirCache(dir)}
	e := startACMEEdge(t, acme)
	if got := e.handshakeAll(bindMany(t, e.agent(t, "alice"), "a", 1)); got != 1 {
		t.Fatalf("alice got %d certificates, want 1", got)
	}
	record := filepath.Join(dir, cacheKey(e.pebble, "tunnelkit+acme_budget"))
	garbage := []byte("{\"version\":1,\"at\":\"2026-12-01T12:00:00Z\",\"orders_per_week\":-50}\x00\xff")
	if err := os.WriteFile(record, garbage, 0o600); err != nil {
		t.Fatal(err)
	}

	e = e.restart(t, acme, authenticateByToken)
	if got := e.handshakeAll(bindMany(t, e.agent(t, "alice"), "a-again", 1)); got != 1 {
		t.Errorf("alice got %d certificates after the restart, want 1", got)
	}
	logged := e.logs.find("acme: the record of the order budgets is not valid", "key", filepath.Base(record), "kept_as", filepath.Base(record)+"+corrupt")
	if len(logged) != 1 || logged[0].level != slog.LevelError {
		t.Errorf("%d Error lines for the record not valid, want 1", len(logged))
	}
	if kept, err := os.ReadFile(record + "+corrupt"); err != nil || !bytes.Equal(kept, garbage) {
		t.Errorf("the record not valid was not kept as it was: %q, %v", kept, err)
	}
	var written struct{ Version int }
	b, err := os.ReadFile(record)
	if err == nil {
		err = json.Unmarshal(b, &written)
	}
	if err != nil || written.Version != 1 {
		t.Errorf("the record after the next order: %q, %v", b, err)
	}
}

// deleteWatch is an autocert.Cache that reports each certificate it
// deletes (not the challenge answers, "NAME+token" and "TOKEN+http-01").
type deleteWatch struct {
	autocert.Cache
	deleted chan string
}

func (c deleteWatch) Delete(ctx context.Context, key string) error {
	err := c.Cache.Delete(ctx, key)
	if strings.HasSuffix(key, "+token") || strings.HasSuffix(key, "+http-01") {
		return err
	}
	select {
	case c.deleted <- key:
	default:
	}
	return err
}

// TestACMEUnboundNameNotRenewed: pebble's certificates live 30 s and the
// edge renews them 20 s before they expire. Of two names with a
// certificate, the one still bound is renewed; the one its agent unbound
// is not: its certificate is dropped from the edge's memory and from the
// cache instead, with a line in the log.
func TestACMEUnboundNameNotRenewed(t *testing.T) {
	t.Parallel()
	cache := deleteWatch{autocert.DirCache(t.TempDir()), make(chan string, 64)}
	e := startACMEEdge(t, edge.ACME{RenewBefore: 20 * time.Second, Grace: -1, Cache: cache}, testacme.CertValidity(30*time.Second))
	alice := e.agent(t, "alice")
	keep := hostOf(t, bind(t, alice, "https://keep").URL())
	goneL := bind(t, alice, "https://gone")
	gone := hostOf(t, goneL.URL())
	first, err := e.handshake(keep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.handshake(gone); err != nil {
		t.Fatal(err)
	}
	goneL.Close()

	select {
	case key := <-cache.deleted:
		if key != cacheKey(e.pebble, gone) {
			t.Fatalf("the cache lost %q, want only %q", key, cacheKey(e.pebble, gone))
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the certificate of %s, unbound, was not dropped from the cache (orders: %v)", gone, e.orders.list())
	}
	if !e.logs.wait(10*time.Second, func() bool { return len(e.logs.find("acme: certificate dropped", "name", gone)) == 1 }) {
		t.Errorf("no log line for %s dropped", gone)
	}
	// Renewed at least once: on a loaded machine an order can take longer
	// than the 10 s a 30 s certificate lives before it is due again, so
	// renewals may follow each other faster than this wait looks.
	if !e.orders.wait(60*time.Second, func() bool { return e.orders.count(named(keep)) >= 2 }) {
		t.Fatalf("%s, still bound, was not renewed (orders: %v)", keep, e.orders.list())
	}
	if !e.logs.wait(60*time.Second, func() bool { return len(e.logs.find("acme: certificate issued", "name", keep, "renewal", "true")) >= 1 }) {
		t.Errorf("no log line for %s renewed", keep)
	}
	if n := e.orders.count(named(gone)); n != 1 {
		t.Errorf("%d orders for %s, unbound after its first: want 1", n, gone)
	}
	second, err := e.handshake(keep)
	if err != nil {
		t.Fatal(err)
	}
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Errorf("%s: still the first certificate after its renewal", keep)
	}
}
