package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// Certificates from an ACME CA, on demand, for https endpoints, kept by a
// small manager of the edge's own on golang.org/x/crypto/acme. It orders
// a certificate for a name an agent bound over https (exactly) at the
// first handshake for it, within a budget of orders, per owner and for
// the edge, that mirrors what a CA allows; it renews certificates of names
// still bound (or bound within ACME.Grace) and forgets the others, from
// memory and from the Cache. (autocert, which the edge used before, renews
// every name it ever got a certificate for without asking its HostPolicy
// again, and keeps every one in memory for the process's lifetime.)

// ACME gets certificates for https endpoints from an ACME CA (Let's
// Encrypt, or any RFC 8555 server) on demand: the first handshake for a
// name gets a certificate by a TLS-ALPN-01 challenge on the TLS port (or
// HTTP-01 on the HTTP port, for a CA that offers no TLS-ALPN-01), later
// ones get it from memory or the Cache, and it is renewed before it
// expires while the name stays bound and the Server runs. Certificates
// have a P-256 ECDSA key, which every current TLS client supports.
// Setting ACME accepts the CA's terms of service.
//
// Certificates are asked for only for names an agent has bound over https,
// exactly: never for whatever server name a stranger sends, and not for the
// names under a wildcard endpoint (anyone could make the edge spend the
// CA's rate limit, shared by every tenant of the domain, on random names
// under it). A wildcard endpoint needs the operator's certificate.
//
// Orders are budgeted, so that no tenant can spend the CA's rate limits
// (Let's Encrypt: 50 new certificates per registered domain per week, 300
// orders per account per 3 hours) for every other: each budget is a
// bucket as large as its count that refills evenly over its period. A
// first certificate for a name counts against every budget; a renewal
// only against OrdersPerHour (Let's Encrypt exempts renewals from its
// weekly limit). A handshake for a name that has no certificate yet and
// that the budget refuses an order fails, as a handshake for a name nobody
// bound does, counted as ReasonACMEBudget and logged at the Debug level
// (a stranger chooses how often it handshakes); a budget running out is
// logged once at the Warn level, and every issuance (Info) and failed order
// (Warn, with the CA's error) once. The budgets are each edge's: edges
// sharing one CA account (one Cache) share its limits, so divide the
// counts between them.
//
// What the budgets spent is kept in the Cache, written before each order
// and read at the start, so that a restart does not give it back (see
// Cache; each CA directory has a record of its own, as each CA has limits
// of its own). A record there that cannot be read, or is not one an edge
// wrote, is logged at the Error level and kept aside (under its key and
// "+corrupt"); the budgets then start full. Without a Cache, they last as
// long as the process.
//
// The owner an order is counted against is the identity that bound the
// name (see Server.Authenticate). An edge that authenticates no agent
// makes every agent session an identity of its own, which any client can
// have as many of as it likes, from as many addresses as it has: there,
// the names of every anonymous agent count against one owner, and so
// share one identity's budget (OrdersPerIdentity, IdentityShare). So do
// the names of another edge's anonymous agents.
type ACME struct {
	// DirectoryURL is the CA's directory. Empty: Let's Encrypt's
	// production directory.
	DirectoryURL string

	// Email is the contact the CA may write to about the certificates.
	Email string

	// Cache keeps the account key and certificates, in autocert's layout
	// (a cache autocert filled keeps serving), and the record of what
	// the order budgets spent, under "tunnelkit+acme_budget" (and "+"
	// and Server.ID, as a safe file name, after it, for an edge with an
	// ID: give each edge sharing a Cache an ID of its own). Several edges sharing one Cache
	// (a shared store implementing the interface) serve the same
	// certificates and answer each other's challenges. Nil: a directory,
	// "tunnelkit/acme" under the user's cache directory.
	//
	// Each CA directory has keys of its own, as certmagic keeps its
	// storage by issuer, so that an edge moved to another CA (from a
	// staging CA to production) gets its certificates from that CA at
	// the first handshake: Let's Encrypt's production directory, the
	// default, has autocert's keys; any other has them after a form of
	// its URL that is a safe file name and "+": its host (less a default
	// port) and path, each byte other than an ASCII letter, digit, '.',
	// '_' or '-' as '-', without '-' or '.' at either end (for
	// https://acme-staging-v02.api.letsencrypt.org/directory, the key
	// "acme-staging-v02.api.letsencrypt.org-directory+example.com";
	// longer than 64 bytes, it is cut and ends with a hash). Before this
	// layout, every CA's certificates had autocert's keys, which are now
	// the default directory's: a cache filled from another CA and then
	// pointed at the default one serves that CA's certificates until
	// they are renewed; remove them from the cache to get new ones at
	// once.
	Cache autocert.Cache

	// HTTPClient talks to the CA. Nil: http.DefaultClient.
	HTTPClient *http.Client

	// RenewBefore is how long before a certificate expires it is renewed.
	// Zero: the lesser of 30 days and a third of its lifetime.
	RenewBefore time.Duration

	// OrdersPerHour bounds the orders the edge places with the CA in an
	// hour, first certificates and renewals together. Zero: 100 (Let's
	// Encrypt allows 300 new orders per account in 3 hours). Negative: no
	// bound.
	OrdersPerHour int

	// OrdersPerWeek bounds the orders for first certificates (names the
	// edge holds no certificate for) the edge places in 7 days; renewals
	// are not counted. Zero: 50, Let's Encrypt's limit of new
	// certificates per registered domain in 7 days: lower it when other
	// servers get certificates under the same registered domain. Negative:
	// no bound.
	OrdersPerWeek int

	// OrdersPerIdentity bounds the orders for first certificates that the
	// names of one owner (an identity, see ACME) may cause in an hour.
	// Zero: 5. Negative: no bound.
	OrdersPerIdentity int

	// IdentityShare is the part of OrdersPerWeek the names of one owner
	// may spend in 7 days (at least one order), so that one tenant cannot
	// take the week's budget from every other. Zero: 1/5 (10 of 50).
	// Negative, or 1 and more: no bound but OrdersPerIdentity.
	IdentityShare float64

	// Grace is how long the certificate of a name that no agent binds
	// over https any more is kept, in memory and in the Cache, and renewed
	// when due: its owner, binding the name again within it, needs no new
	// order. Past it, the certificate is dropped from both. The Router is
	// asked whether each name is still bound every quarter of Grace (at
	// most every 6 hours, at least every second). Zero: 7 days, the
	// window of the CA's weekly limit. Negative: none; a name found
	// unbound (checked every minute, and before each renewal) is dropped
	// at once.
	Grace time.Duration
}

// Defaults of ACME's budgets.
const (
	DefaultACMEOrdersPerHour     = 100
	DefaultACMEOrdersPerWeek     = 50
	DefaultACMEOrdersPerIdentity = 5
	DefaultACMEIdentityShare     = 1.0 / 5
	DefaultACMEGrace             = 7 * 24 * time.Hour
)

// acmeConfig is ACME's settings resolved: every budget a number, zero for
// no bound.
type acmeConfig struct {
	ordersPerHour     int
	ordersPerWeek     int
	ordersPerIdentity int
	identityWeek      int           // an owner's first certificates per week
	grace             time.Duration // 0: none
	renewBefore       time.Duration // 0: a third of the lifetime, at most 30 days
}

func (a *ACME) resolve() acmeConfig {
	c := acmeConfig{
		ordersPerHour:     limit(a.OrdersPerHour, DefaultACMEOrdersPerHour),
		ordersPerWeek:     limit(a.OrdersPerWeek, DefaultACMEOrdersPerWeek),
		ordersPerIdentity: limit(a.OrdersPerIdentity, DefaultACMEOrdersPerIdentity),
		grace:             timeout(a.Grace, DefaultACMEGrace),
		renewBefore:       max(a.RenewBefore, 0),
	}
	share := a.IdentityShare
	if share == 0 {
		share = DefaultACMEIdentityShare
	}
	if share > 0 && share < 1 && c.ordersPerWeek > 0 {
		c.identityWeek = max(1, int(share*float64(c.ordersPerWeek)))
	}
	return c
}

// checkEvery is how often the Router is asked whether a name with a
// certificate is still bound.
func (c acmeConfig) checkEvery() time.Duration {
	if c.grace == 0 {
		return time.Minute
	}
	return min(max(c.grace/4, time.Second), 6*time.Hour)
}

// How long an order may take, and how long after a failed one the next
// order for the same name waits (doubling with each failure in a row).
const (
	orderTimeout     = 5 * time.Minute
	orderRetryFirst  = time.Minute
	orderRetryLatest = time.Hour
)

// certManager gets, keeps and renews the certificates of https names.
type certManager struct {
	srv    *Server
	cfg    acmeConfig
	email  string
	client *acme.Client
	cache  autocert.Cache // nil: certificates last as long as the process
	budget *orderBudget
	// budgetKey is the budgets' record's key in the cache.
	budgetKey string
	// saveMu orders the writes of the budgets' record; saved is the
	// count of orders taken that the last one included.
	saveMu sync.Mutex
	saved  uint64
	ctx    context.Context // done when the server closes: orders stop
	cancel context.CancelFunc
	wake   chan struct{} // asks the maintenance loop to look again

	acctMu     sync.Mutex
	registered bool // the account exists at the CA, and client.Key is set

	mu     sync.Mutex
	names  map[string]*certEntry
	alpn   map[string]*tls.Certificate // TLS-ALPN-01 challenge certificates, by name
	http01 map[string]string           // HTTP-01 key authorizations, by path
}

// certEntry is what the manager knows of one name it ordered or loaded a
// certificate for.
type certEntry struct {
	name     string
	cert     *tls.Certificate // the newest; nil until one is issued
	renewAt  time.Time
	identity string     // who bound the name, when last seen
	owner    string     // whose budget its first certificate counts against
	seen     time.Time  // when the name was last known bound
	checked  time.Time  // when the Router was last asked about it
	order    *certOrder // the order under way, if any
	failures int        // orders that failed in a row
	retryAt  time.Time  // no order before, after a failure or a refusal
}

// certOrder is an order under way; done is closed once cert or err is set.
type certOrder struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

// valid reports whether e has a certificate that has not expired.
func (e *certEntry) valid(now time.Time) bool {
	return e.cert != nil && now.Before(e.cert.Leaf.NotAfter)
}

// newCertManager returns the manager of a's certificates, kept in cache
// (nil: none) under the keys of a's directory, with the budgets' spending
// read back from it.
func newCertManager(s *Server, a *ACME, cache autocert.Cache) *certManager {
	ctx, cancel := context.WithCancel(context.Background())
	m := &certManager{
		srv:       s,
		cfg:       s.cfg.acme,
		email:     a.Email,
		client:    &acme.Client{DirectoryURL: a.DirectoryURL, HTTPClient: a.HTTPClient},
		cache:     directoryCacheOf(cache, a.DirectoryURL),
		budget:    newOrderBudget(s.cfg.acme),
		budgetKey: budgetKeyOf(s.ID),
		ctx:       ctx,
		cancel:    cancel,
		wake:      make(chan struct{}, 1),
		names:     map[string]*certEntry{},
		alpn:      map[string]*tls.Certificate{},
		http01:    map[string]string{},
	}
	m.loadBudget()
	return m
}

// certificate returns the certificate for a terminated handshake: the one
// held for its name, or one from the Cache, or a new one, ordered within
// the budget if an agent bound the name over https exactly. The
// handshake's context bounds the wait for an order, not the order.
func (m *certManager) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name, ok := router.Normalise(hello.ServerName)
	if !ok {
		return nil, fmt.Errorf("edge: no certificate for %q: not a host name", hello.ServerName)
	}
	ctx := hello.Context()
	m.mu.Lock()
	e := m.names[name]
	switch {
	case e != nil && e.valid(time.Now()):
		c := e.cert
		m.mu.Unlock()
		return c, nil
	case e != nil && e.order != nil:
		o := e.order
		m.mu.Unlock()
		return m.await(ctx, name, o)
	}
	m.mu.Unlock()

	r, bound, err := m.route(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("edge: no certificate for %q: %w", name, err)
	}
	if !bound {
		return nil, fmt.Errorf("edge: no certificate for %q: no https endpoint has that name", name)
	}
	cached, had := m.load(ctx, name)
	if cached != nil {
		return m.keep(name, r, cached), nil
	}
	o, err := m.orderFirst(name, r, had)
	if err != nil {
		return nil, err
	}
	return m.await(ctx, name, o)
}

// await waits for o, or for ctx.
func (m *certManager) await(ctx context.Context, name string, o *certOrder) (*tls.Certificate, error) {
	select {
	case <-o.done:
		return o.cert, o.err
	case <-ctx.Done():
		return nil, fmt.Errorf("edge: the certificate for %q is still being issued", name)
	}
}

// route returns the https route bound to name exactly, if there is one.
func (m *certManager) route(ctx context.Context, name string) (r router.Route, bound bool, err error) {
	routes, err := m.srv.router().Lookup(ctx, wire.ProtoHTTPS, name)
	for _, r := range routes {
		if r.Name == name {
			return r, true, nil
		}
	}
	return router.Route{}, false, err
}

// owner returns whose budget the names of r count against: its identity,
// or, for an anonymous agent (any client may have as many of those
// identities as it opens sessions, from as many addresses as it has),
// anonymousOwner, which every anonymous agent shares. An identity that
// this edge's Authenticate gave is its own even if it looks anonymous;
// another edge's anonymous agents (a route of another edge, see Relay)
// are anonymous here too.
func (m *certManager) owner(r router.Route) string {
	s := m.srv
	if strings.HasPrefix(r.Identity, anonymousPrefix) && (s.Authenticate == nil || r.Edge != s.ID) {
		return anonymousOwner
	}
	return r.Identity
}

// anonymousOwner is the owner of every anonymous agent's names, in the
// ACME order budget: one identity's budget for them all.
const anonymousOwner = "anonymous agents"

// keep holds c, loaded from the Cache, as name's certificate, unless one
// newer is held already, and returns the one held.
func (m *certManager) keep(name string, r router.Route, c *tls.Certificate) *tls.Certificate {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.names[name]
	if e == nil {
		e = &certEntry{name: name, owner: m.owner(r)}
		m.names[name] = e
	}
	e.identity, e.seen, e.checked = r.Identity, now, now
	if e.cert == nil || c.Leaf.NotAfter.After(e.cert.Leaf.NotAfter) {
		e.cert, e.renewAt = c, m.renewAt(c.Leaf)
		m.poke()
	}
	return e.cert
}

// orderFirst starts an order for name, bound by r, which has no valid
// certificate (had: it had one once), unless one is under way (then it
// returns that one), the last one failed too recently, or the budget
// refuses.
func (m *certManager) orderFirst(name string, r router.Route, had bool) (*certOrder, error) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.names[name]
	switch {
	case e != nil && e.order != nil:
		return e.order, nil
	case e != nil && e.valid(now):
		o := &certOrder{done: make(chan struct{}), cert: e.cert}
		close(o.done)
		return o, nil
	case e != nil && now.Before(e.retryAt):
		return nil, fmt.Errorf("edge: no certificate for %q: no new order before %s", name, e.retryAt.Format(time.RFC3339))
	}
	owner := m.owner(r)
	first := !had && (e == nil || e.cert == nil)
	if !m.spend(name, r.Identity, owner, first, now) {
		m.srv.obs().Refused(ReasonACMEBudget)
		return nil, fmt.Errorf("edge: no certificate for %q: over the ACME order budget", name)
	}
	if e == nil {
		e = &certEntry{name: name}
		m.names[name] = e
	}
	e.identity, e.owner, e.seen, e.checked = r.Identity, owner, now, now
	return m.startLocked(e, !first)
}

// spend takes an order from the budget, and logs a refusal (at the Debug
// level: a stranger's handshakes can repeat it) or a budget running out
// (at the Warn level: orders, which the budget bounds, cause it).
func (m *certManager) spend(name, identity, owner string, first bool, now time.Time) bool {
	refused, spent := m.budget.take(owner, first, now)
	log := m.srv.log()
	if refused != nil {
		log.Debug("acme: no order: over budget", "name", name, "identity", identity, "owner", owner,
			"renewal", !first, "budget", refused.budget, "retry_in", refused.wait.Round(time.Second))
		return false
	}
	for _, b := range spent {
		args := []any{"budget", b, "last_name", name}
		if b == budgetIdentity || b == budgetShare {
			args = append(args, "owner", owner)
		}
		log.Warn("acme: order budget spent; names without a certificate get none until it refills", args...)
	}
	return true
}

// startLocked starts an order for e, which the caller has budgeted.
func (m *certManager) startLocked(e *certEntry, renewal bool) (*certOrder, error) {
	o := &certOrder{done: make(chan struct{})}
	e.order = o
	if !m.srv.goTracked(func() { m.fulfil(e, o, renewal) }) {
		e.order = nil
		if e.cert == nil {
			delete(m.names, e.name)
		}
		return nil, ErrServerClosed
	}
	return o, nil
}

// fulfil places the order o for e with the CA, keeps and caches its
// certificate, and logs the outcome.
func (m *certManager) fulfil(e *certEntry, o *certOrder, renewal bool) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(m.ctx, orderTimeout)
	m.saveBudget(ctx)
	cert, err := m.issue(ctx, e.name)
	if err == nil {
		if perr := m.put(ctx, e.name, cert); perr != nil {
			m.srv.log().Warn("acme: certificate not cached", "name", e.name, "err", perr)
		}
	}
	cancel()
	d := time.Since(start)
	closed := m.ctx.Err() != nil
	cause := err
	if err != nil {
		err = fmt.Errorf("edge: no certificate for %q: %w", e.name, err)
	}
	m.mu.Lock()
	e.order, o.cert, o.err = nil, cert, err
	identity := e.identity
	var retry time.Duration
	if err == nil {
		e.cert, e.renewAt, e.failures, e.retryAt = cert, m.renewAt(cert.Leaf), 0, time.Time{}
	} else {
		retry = min(orderRetryFirst<<min(e.failures, 10), orderRetryLatest)
		e.failures++
		e.retryAt = time.Now().Add(retry)
	}
	close(o.done)
	m.mu.Unlock()
	m.poke()
	log := m.srv.log()
	if err != nil {
		if !closed {
			log.Warn("acme: order failed", "name", e.name, "identity", identity, "renewal", renewal,
				"duration", d.Round(time.Millisecond), "err", cause, "retry_in", retry)
		}
		return
	}
	log.Info("acme: certificate issued", "name", e.name, "identity", identity, "renewal", renewal,
		"duration", d.Round(time.Millisecond), "expires", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
}

// renewAt returns when the certificate leaf is due for renewal: RenewBefore
// (or a third of its lifetime, at most 30 days) before it expires, less a
// tenth of that at random (at most an hour), so that edges sharing a Cache
// do not all renew at once.
func (m *certManager) renewAt(leaf *x509.Certificate) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	before := min(life/3, 30*24*time.Hour)
	if m.cfg.renewBefore > 0 {
		before = min(m.cfg.renewBefore, life)
	}
	if j := min(before/10, time.Hour); j > 0 {
		before += rand.N(j)
	}
	return leaf.NotAfter.Add(-before)
}

// poke asks the maintenance loop to look at the names again.
func (m *certManager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// maintain renews and drops certificates until done is closed (the
// server closed), then stops every order under way.
func (m *certManager) maintain(done <-chan struct{}) {
	defer m.cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		case <-m.wake:
		}
		t.Reset(time.Until(m.tend(time.Now())))
	}
}

// tend checks the names that are due, and returns when the next one is.
func (m *certManager) tend(now time.Time) time.Time {
	every := m.cfg.checkEvery()
	next := now.Add(every)
	var due []*certEntry
	m.mu.Lock()
	for _, e := range m.names {
		if e.order != nil {
			continue // its end pokes the loop
		}
		at := e.checked.Add(every)
		if e.cert != nil {
			if r := later(e.renewAt, e.retryAt); r.Before(at) {
				at = r
			}
		}
		if !at.After(now) {
			due = append(due, e)
		} else if at.Before(next) {
			next = at
		}
	}
	m.mu.Unlock()
	for _, e := range due {
		if m.ctx.Err() != nil {
			break
		}
		if at := m.check(e, now); at.Before(next) {
			next = at
		}
	}
	return next
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// check asks the Router whether e's name is still bound: a name unbound
// for longer than Grace is dropped; one bound, or unbound within Grace,
// whose certificate is due gets renewed. It returns when e is due next.
func (m *certManager) check(e *certEntry, now time.Time) time.Time {
	ctx, cancel := context.WithTimeout(m.ctx, m.srv.cfg.handshake)
	r, bound, err := m.route(ctx, e.name)
	cancel()
	m.mu.Lock()
	e.checked = now
	if bound || err != nil { // a failing Router drops nothing
		e.seen = now
		if bound {
			e.identity = r.Identity
		}
	}
	unbound := now.Sub(e.seen)
	drop := e.order == nil && !bound && err == nil && unbound >= m.cfg.grace
	if drop {
		delete(m.names, e.name)
	}
	renew := !drop && e.cert != nil && e.order == nil && !now.Before(later(e.renewAt, e.retryAt))
	identity, owner := e.identity, e.owner
	m.mu.Unlock()
	if drop {
		m.delete(e.name)
		m.srv.log().Info("acme: certificate dropped: no agent binds the name", "name", e.name, "identity", identity,
			"unbound_for", unbound.Round(time.Second))
		return now.Add(m.cfg.checkEvery())
	}
	if !renew {
		return now.Add(m.cfg.checkEvery())
	}
	return m.renew(e, identity, owner, now)
}

// renew renews e's certificate: from the Cache, if another edge renewed it
// already, else by an order within the budget. It returns when e is due
// next.
func (m *certManager) renew(e *certEntry, identity, owner string, now time.Time) time.Time {
	if c, _ := m.load(m.ctx, e.name); c != nil {
		m.mu.Lock()
		if e.cert == nil || c.Leaf.NotAfter.After(e.cert.Leaf.NotAfter) {
			if at := m.renewAt(c.Leaf); at.After(now) {
				e.cert, e.renewAt = c, at
				m.mu.Unlock()
				return at
			}
		}
		m.mu.Unlock()
	}
	refused, spent := m.budget.take(owner, false, now)
	for _, b := range spent {
		m.srv.log().Warn("acme: order budget spent; names without a certificate get none until it refills", "budget", b, "last_name", e.name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if refused != nil {
		e.retryAt = now.Add(max(refused.wait, time.Second))
		m.srv.log().Debug("acme: renewal deferred: over budget", "name", e.name, "identity", identity,
			"budget", refused.budget, "retry_in", refused.wait.Round(time.Second))
		return e.retryAt
	}
	if e.order == nil {
		m.startLocked(e, true)
	}
	return now.Add(m.cfg.checkEvery())
}

// challengeCert returns the TLS-ALPN-01 challenge certificate for hello's
// name: this edge's, or one another edge sharing the Cache put there.
func (m *certManager) challengeCert(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name, ok := router.Normalise(hello.ServerName)
	if !ok {
		return nil, fmt.Errorf("edge: no ACME challenge for %q", hello.ServerName)
	}
	m.mu.Lock()
	c := m.alpn[name]
	m.mu.Unlock()
	if c != nil {
		return c, nil
	}
	if c, err := m.loadChallenge(hello.Context(), name); err == nil {
		return c, nil
	}
	return nil, fmt.Errorf("edge: no ACME challenge for %q", name)
}

// serveHTTP01 answers a CA's HTTP-01 challenge request.
func (m *certManager) serveHTTP01(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	v, ok := m.http01[r.URL.Path]
	m.mu.Unlock()
	if !ok && m.cache != nil {
		token := strings.TrimPrefix(r.URL.Path, "/.well-known/acme-challenge/")
		if b, err := m.cache.Get(r.Context(), token+"+http-01"); err == nil {
			v, ok = string(b), true
		}
	}
	if !ok {
		http.Error(w, "no such ACME challenge", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Write([]byte(v))
}

// errNoChallenge: the CA offered no challenge the edge can answer.
var errNoChallenge = errors.New("the CA offered neither tls-alpn-01 nor http-01")
