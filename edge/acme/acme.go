// Package acme gets certificates for an edge's https endpoints from an ACME
// CA (Let's Encrypt, or any RFC 8555 server), on demand, within budgets
// that keep one tenant from spending the CA's limits for every other.
//
// An edge.Server makes its Manager from its Server.ACME (a Config) and uses
// it through its certificate hook: GetCertificate for terminated
// handshakes (and TLS-ALPN-01 challenges), ServeHTTP for HTTP-01
// challenges on its HTTP port. What the Manager needs of the edge is one
// question, Names: who holds a name bound over https.
//
// Typical use, outside an edge (a server of one's own whose names come
// from elsewhere):
//
//	m := acme.New(&acme.Config{Cache: autocert.DirCache("certs")}, acme.Options{Names: myNames})
//	defer m.Close()
//	go m.Run(done)
//	srv := &http.Server{TLSConfig: &tls.Config{GetCertificate: m.GetCertificate, NextProtos: []string{"h2", "http/1.1", acme.ALPNProto}}}
package acme

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	xacme "golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"

	"github.com/tunnelkit/tunnelkit/router"
)

// Certificates from an ACME CA, on demand, for https endpoints, kept by a
// small manager of tunnelkit's own on golang.org/x/crypto/acme. It orders
// a certificate for a name an agent bound over https (exactly) at the
// first handshake for it, within a budget of orders, per owner and for
// the edge, that mirrors what a CA allows; it renews certificates of names
// still bound (or bound within Config.Grace) and forgets the others, from
// memory and from the Cache. (autocert, which the edge used before, renews
// every name it ever got a certificate for without asking its HostPolicy
// again, and keeps every one in memory for the process's lifetime.)

// Config is how a Manager gets certificates for https endpoints from an ACME CA (Let's
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
// bound does, counted (Options.Refused; an edge counts it as
// edge.ReasonACMEBudget) and logged at the Debug level
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
// The owner an order is counted against is the one Names gives, the
// identity that bound the name (see edge.Server.Authenticate). An edge
// that authenticates no agent makes every agent session an identity of
// its own, which any client can have as many of as it likes, from as many
// addresses as it has: there, the edge gives the names of every anonymous
// agent one owner, so that they share one identity's budget
// (OrdersPerIdentity, IdentityShare). So do the names of another edge's
// anonymous agents.
type Config struct {
	// DirectoryURL is the CA's directory. Empty: Let's Encrypt's
	// production directory.
	DirectoryURL string

	// Email is the contact the CA may write to about the certificates.
	Email string

	// Cache keeps the account key and certificates, in autocert's layout
	// (a cache autocert filled keeps serving), and the record of what
	// the order budgets spent, under "tunnelkit+acme_budget" (and "+"
	// and Options.ID (the edge's Server.ID), as a safe file name, after it, for an edge with an
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

// Defaults of Config's budgets.
const (
	DefaultOrdersPerHour     = 100
	DefaultOrdersPerWeek     = 50
	DefaultOrdersPerIdentity = 5
	DefaultIdentityShare     = 1.0 / 5
	DefaultGrace             = 7 * 24 * time.Hour
)

// ALPNProto is the ALPN protocol of TLS-ALPN-01 challenges: a TLS
// configuration whose GetCertificate is a Manager's must offer it.
const ALPNProto = xacme.ALPNProto

// Holder is who holds a name bound over https: the identity that bound
// it, and the owner whose budget its orders count against.
type Holder struct {
	Identity string
	Owner    string
}

// Names tells a Manager which names may get certificates, and whose they
// are.
type Names interface {
	// Holder returns who holds name (normalised: lower case, no trailing
	// dot), bound over https exactly (not through a wildcard: see
	// Config); ok is false when nobody does. An error is a Names that
	// cannot tell now: no certificate is ordered, and none is dropped.
	Holder(ctx context.Context, name string) (h Holder, ok bool, err error)
}

// Options are what a Manager is given besides its Config.
type Options struct {
	// Names tells which names may get certificates. Required.
	Names Names

	// Logger receives the Manager's log. Nil: none.
	Logger *slog.Logger

	// ID names the edge among those sharing a Cache: the budgets' record
	// is kept under a key of its own (see Config.Cache). Empty: a lone
	// edge.
	ID string

	// Refused, if set, is called when a handshake gets no certificate
	// because the budget refused the order. It must not block.
	Refused func()

	// CheckTimeout bounds each question the upkeep asks Names. Zero: 10 s.
	CheckTimeout time.Duration
}

// defaultCheckTimeout is Options.CheckTimeout's default.
const defaultCheckTimeout = 10 * time.Second

// limit resolves a bound of Config: zero is def, negative is no bound (0).
func limit(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

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

func (a *Config) resolve() acmeConfig {
	c := acmeConfig{
		ordersPerHour:     limit(a.OrdersPerHour, DefaultOrdersPerHour),
		ordersPerWeek:     limit(a.OrdersPerWeek, DefaultOrdersPerWeek),
		ordersPerIdentity: limit(a.OrdersPerIdentity, DefaultOrdersPerIdentity),
		grace:             max(a.Grace, 0),
		renewBefore:       max(a.RenewBefore, 0),
	}
	if a.Grace == 0 {
		c.grace = DefaultGrace
	}
	share := a.IdentityShare
	if share == 0 {
		share = DefaultIdentityShare
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

// Manager gets, keeps and renews the certificates of https names (see
// Config). Make one with New.
type Manager = certManager

// certManager is Manager.
type certManager struct {
	holders      Names
	log          *slog.Logger
	refused      func()
	checkTimeout time.Duration // Options.CheckTimeout
	wg           sync.WaitGroup
	closed       bool // guarded by mu: no order starts
	cfg          acmeConfig
	email        string
	client       *xacme.Client
	cache        autocert.Cache // nil: certificates last as long as the process
	budget       *orderBudget
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

// New returns the Manager of a's certificates, kept in a.Cache (nil: a
// directory, "tunnelkit/acme" under the user's cache directory, or none if
// there is no such directory) under the keys of a's directory, with the
// budgets' spending read back from it. Close it when done.
func New(a *Config, o Options) *Manager {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cache := a.Cache
	if cache == nil {
		if dir, err := os.UserCacheDir(); err == nil {
			cache = autocert.DirCache(filepath.Join(dir, "tunnelkit", "acme"))
		} else {
			log.Warn("acme: no cache directory; certificates last as long as the process", "err", err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := a.resolve()
	m := &certManager{
		holders:      o.Names,
		log:          log,
		refused:      o.Refused,
		checkTimeout: cmp.Or(o.CheckTimeout, defaultCheckTimeout),
		cfg:          cfg,
		email:        a.Email,
		client:       &xacme.Client{DirectoryURL: a.DirectoryURL, HTTPClient: a.HTTPClient},
		cache:        directoryCacheOf(cache, a.DirectoryURL),
		budget:       newOrderBudget(cfg),
		budgetKey:    budgetKeyOf(o.ID),
		ctx:          ctx,
		cancel:       cancel,
		wake:         make(chan struct{}, 1),
		names:        map[string]*certEntry{},
		alpn:         map[string]*tls.Certificate{},
		http01:       map[string]string{},
	}
	m.loadBudget()
	return m
}

// GetCertificate returns the certificate for a handshake: for a
// TLS-ALPN-01 challenge (hello offers only ALPNProto), its challenge
// certificate; else the one held for its name, or one from the Cache, or
// a new one, ordered within the budget if Names says the name is held. The
// handshake's context bounds the wait for an order, not the order.
func (m *certManager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if slices.Contains(hello.SupportedProtos, ALPNProto) {
		return m.challengeCert(hello)
	}
	name, ok := router.Normalise(hello.ServerName)
	if !ok {
		return nil, fmt.Errorf("acme: no certificate for %q: not a host name", hello.ServerName)
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

	h, bound, err := m.holders.Holder(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("acme: no certificate for %q: %w", name, err)
	}
	if !bound {
		return nil, fmt.Errorf("acme: no certificate for %q: no https endpoint has that name", name)
	}
	cached, had := m.load(ctx, name)
	if cached != nil {
		return m.keep(name, h, cached), nil
	}
	o, err := m.orderFirst(name, h, had)
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
		return nil, fmt.Errorf("acme: the certificate for %q is still being issued", name)
	}
}

// keep holds c, loaded from the Cache, as name's certificate, unless one
// newer is held already, and returns the one held.
func (m *certManager) keep(name string, h Holder, c *tls.Certificate) *tls.Certificate {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.names[name]
	if e == nil {
		e = &certEntry{name: name, owner: h.Owner}
		m.names[name] = e
	}
	e.identity, e.seen, e.checked = h.Identity, now, now
	if e.cert == nil || c.Leaf.NotAfter.After(e.cert.Leaf.NotAfter) {
		e.cert, e.renewAt = c, m.renewAt(c.Leaf)
		m.poke()
	}
	return e.cert
}

// orderFirst starts an order for name, held by h, which has no valid
// certificate (had: it had one once), unless one is under way (then it
// returns that one), the last one failed too recently, or the budget
// refuses.
func (m *certManager) orderFirst(name string, h Holder, had bool) (*certOrder, error) {
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
		return nil, fmt.Errorf("acme: no certificate for %q: no new order before %s", name, e.retryAt.Format(time.RFC3339))
	}
	owner := h.Owner
	first := !had && (e == nil || e.cert == nil)
	if !m.spend(name, h.Identity, owner, first, now) {
		if m.refused != nil {
			m.refused()
		}
		return nil, fmt.Errorf("acme: no certificate for %q: over the ACME order budget", name)
	}
	if e == nil {
		e = &certEntry{name: name}
		m.names[name] = e
	}
	e.identity, e.owner, e.seen, e.checked = h.Identity, owner, now, now
	return m.startLocked(e, !first)
}

// spend takes an order from the budget, and logs a refusal (at the Debug
// level: a stranger's handshakes can repeat it) or a budget running out
// (at the Warn level: orders, which the budget bounds, cause it).
func (m *certManager) spend(name, identity, owner string, first bool, now time.Time) bool {
	refused, spent := m.budget.take(owner, first, now)
	log := m.log
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
	if m.closed {
		if e.cert == nil {
			delete(m.names, e.name)
		}
		return nil, ErrClosed
	}
	o := &certOrder{done: make(chan struct{})}
	e.order = o
	m.wg.Go(func() { m.fulfil(e, o, renewal) })
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
			m.log.Warn("acme: certificate not cached", "name", e.name, "err", perr)
		}
	}
	cancel()
	d := time.Since(start)
	closed := m.ctx.Err() != nil
	cause := err
	if err != nil {
		err = fmt.Errorf("acme: no certificate for %q: %w", e.name, err)
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
	log := m.log
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

// Run renews and drops certificates until done is closed or the Manager
// is closed, then stops every order under way.
func (m *certManager) Run(done <-chan struct{}) {
	defer m.cancel()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-m.ctx.Done():
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

// check asks Names whether e's name is still bound: a name unbound
// for longer than Grace is dropped; one bound, or unbound within Grace,
// whose certificate is due gets renewed. It returns when e is due next.
func (m *certManager) check(e *certEntry, now time.Time) time.Time {
	ctx, cancel := context.WithTimeout(m.ctx, m.checkTimeout)
	h, bound, err := m.holders.Holder(ctx, e.name)
	cancel()
	m.mu.Lock()
	e.checked = now
	if bound || err != nil { // a failing Names drops nothing
		e.seen = now
		if bound {
			e.identity = h.Identity
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
		m.log.Info("acme: certificate dropped: no agent binds the name", "name", e.name, "identity", identity,
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
		m.log.Warn("acme: order budget spent; names without a certificate get none until it refills", "budget", b, "last_name", e.name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if refused != nil {
		e.retryAt = now.Add(max(refused.wait, time.Second))
		m.log.Debug("acme: renewal deferred: over budget", "name", e.name, "identity", identity,
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
		return nil, fmt.Errorf("acme: no challenge for %q", hello.ServerName)
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
	return nil, fmt.Errorf("acme: no challenge for %q", name)
}

// ChallengePath is the path under which CAs ask for HTTP-01 challenges:
// requests for it go to the Manager's ServeHTTP.
const ChallengePath = "/.well-known/acme-challenge/"

// ServeHTTP answers a CA's HTTP-01 challenge request (a path under
// ChallengePath).
func (m *certManager) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	v, ok := m.http01[r.URL.Path]
	m.mu.Unlock()
	if !ok && m.cache != nil {
		token := strings.TrimPrefix(r.URL.Path, ChallengePath)
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

// ErrClosed is the error of a handshake that needs an order from a Manager
// that was closed.
var ErrClosed = errors.New("acme: the manager is closed")

// Close stops every order under way and the upkeep, and waits for them.
// Certificates held are still served. Calling it again does nothing.
func (m *certManager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	return nil
}
