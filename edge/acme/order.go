package acme

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	xacme "golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// One order with the CA (RFC 8555, through golang.org/x/crypto/acme): an
// order for one name, one challenge answered per authorization (TLS-ALPN-01,
// else HTTP-01), never a second order for another challenge type; and the
// Cache, in autocert's layout, so that a cache autocert filled keeps
// serving: the account key under "acme_account+key", a name's key and chain
// under the name, in PEM; challenge answers under "NAME+token" (TLS-ALPN-01)
// and "TOKEN+http-01", for the other edges sharing the Cache. Beside them,
// the record of the order budgets (budgetRecord, in JSON) under
// "tunnelkit+acme_budget", and "+ID" after it for an edge with an ID
// (Server.ID). Every key is one CA directory's (directoryCache), as
// certmagic keeps its storage by issuer: the default directory's keys are
// autocert's own, any other's start with a form of its URL.

const accountKeyName = "acme_account+key"

// directoryCache is a Cache whose keys are those of one CA directory:
// each key with prefix before it.
type directoryCache struct {
	cache  autocert.Cache
	prefix string
}

func (c directoryCache) Get(ctx context.Context, key string) ([]byte, error) {
	return c.cache.Get(ctx, c.prefix+key)
}

func (c directoryCache) Put(ctx context.Context, key string, data []byte) error {
	return c.cache.Put(ctx, c.prefix+key, data)
}

func (c directoryCache) Delete(ctx context.Context, key string) error {
	return c.cache.Delete(ctx, c.prefix+key)
}

// storedKey returns the key under which m's cache keeps key, for logs.
func (m *certManager) storedKey(key string) string {
	if c, ok := m.cache.(directoryCache); ok {
		return c.prefix + key
	}
	return key
}

// directoryCacheOf returns the keys of cache (nil: none) that are the CA
// directory's at url (see directoryPrefix).
func directoryCacheOf(cache autocert.Cache, url string) autocert.Cache {
	p := directoryPrefix(url)
	if cache == nil || p == "" {
		return cache
	}
	return directoryCache{cache, p}
}

// directoryPrefix returns what starts the Cache keys of the CA directory
// at dir: nothing for the default directory, Let's Encrypt's production
// one, whose keys are autocert's own (the edge kept every CA's
// certificates there before it kept them per directory: they are taken
// for the default directory's); for any other, a form of its URL that is
// also a safe file name (see safeKey), its host (less a default port) and
// path, and "+": "acme-staging-v02.api.letsencrypt.org-directory+".
func directoryPrefix(dir string) string {
	form := func(dir string) string {
		u, err := url.Parse(dir)
		if err != nil || u.Host == "" {
			return safeKey(dir)
		}
		host := strings.ToLower(u.Host)
		switch u.Scheme {
		case "https":
			host = strings.TrimSuffix(host, ":443")
		case "http":
			host = strings.TrimSuffix(host, ":80")
		}
		f := host + u.Path
		if u.RawQuery != "" {
			f += "?" + u.RawQuery
		}
		return safeKey(f)
	}
	if dir == "" || form(dir) == form(xacme.LetsEncryptURL) {
		return ""
	}
	return form(dir) + "+"
}

// budgetKeyOf returns the key of the budgets' record of the edge whose ID
// (Server.ID) is id.
func budgetKeyOf(id string) string {
	const key = "tunnelkit+acme_budget"
	if id == "" {
		return key
	}
	return key + "+" + safeKey(id)
}

// safeKey returns s as a Cache key that is also a safe file name (for
// autocert.DirCache): its bytes but ASCII letters, digits, '.', '_' and
// '-' as '-', without '.' or '-' at either end; a longer one than
// maxSafeKey, or an empty one, is cut and ends with a hash of s.
func safeKey(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	k := strings.Trim(string(b), ".-")
	if k == "" || len(k) > maxSafeKey {
		sum := sha256.Sum256([]byte(s))
		k = strings.Trim(k[:min(len(k), maxSafeKey-17)], ".-") + "-" + hex.EncodeToString(sum[:8])
		k = strings.TrimLeft(k, "-")
	}
	return k
}

// maxSafeKey bounds the length of safeKey's keys, so that one and a host
// name mostly fit in a file name's 255 bytes.
const maxSafeKey = 64

// loadBudget makes the budgets owe what their record in the Cache says,
// if there is one. One that cannot be read, or is not valid, is logged
// (Error) and the budgets start full; one not valid is kept, as it was,
// under its key and "+corrupt", before the next order writes the record
// anew.
func (m *certManager) loadBudget() {
	if m.cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, cacheTimeout)
	defer cancel()
	log := m.log
	b, err := m.cache.Get(ctx, m.budgetKey)
	switch {
	case errors.Is(err, autocert.ErrCacheMiss):
		return
	case err != nil:
		log.Error("acme: the record of the order budgets could not be read: they start full", "key", m.storedKey(m.budgetKey), "err", err)
		return
	}
	r, err := parseBudgetRecord(b)
	if err != nil {
		aside := m.storedKey(m.budgetKey + "+corrupt")
		if perr := m.cache.Put(ctx, m.budgetKey+"+corrupt", b); perr != nil {
			log.Warn("acme: cache", "op", "put", "key", aside, "err", perr)
			aside = ""
		}
		log.Error("acme: the record of the order budgets is not valid: they start full", "key", m.storedKey(m.budgetKey), "kept_as", aside, "err", err)
		return
	}
	m.budget.restore(r, time.Now())
	log.Info("acme: the order budgets owe what their record says", "key", m.storedKey(m.budgetKey), "written", r.At.Format(time.RFC3339),
		"orders_per_hour", r.Hour, "orders_per_week", r.Week, "owners", len(r.Owners))
}

// saveBudget writes the budgets' record to the Cache, if orders were
// taken since it was last written: before each order is placed, so that
// neither a restart nor a crash gives the order back.
func (m *certManager) saveBudget(ctx context.Context) {
	if m.cache == nil {
		return
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	b, taken, err := m.budget.record(time.Now())
	if taken == m.saved {
		return
	}
	if err == nil {
		err = m.cache.Put(ctx, m.budgetKey, b)
	}
	if err != nil {
		m.log.Warn("acme: the record of the order budgets not written: a restart would give back what they spent since it last was",
			"key", m.storedKey(m.budgetKey), "err", err)
		return
	}
	m.saved = taken
}

// cacheTimeout bounds a Cache operation that no handshake or order bounds.
const cacheTimeout = 10 * time.Second

// register creates the edge's account at the CA, once; its key comes from
// the Cache, or is made and put there.
func (m *certManager) register(ctx context.Context) error {
	m.acctMu.Lock()
	defer m.acctMu.Unlock()
	if m.registered {
		return nil
	}
	if m.client.Key == nil {
		key, err := m.accountKey(ctx)
		if err != nil {
			return err
		}
		m.client.Key = key
	}
	a := &xacme.Account{}
	if m.email != "" {
		a.Contact = []string{"mailto:" + m.email}
	}
	if _, err := m.client.Register(ctx, a, xacme.AcceptTOS); err != nil && !errors.Is(err, xacme.ErrAccountAlreadyExists) {
		return err
	}
	m.registered = true
	return nil
}

// accountKey returns the account key from the Cache, or a new one it puts
// there.
func (m *certManager) accountKey(ctx context.Context) (crypto.Signer, error) {
	if m.cache != nil {
		b, err := m.cache.Get(ctx, accountKeyName)
		if err == nil {
			key, _, err := decodeKeyAndChain(b)
			if err != nil {
				return nil, fmt.Errorf("the account key in the cache: %w", err)
			}
			return key, nil
		}
		if !errors.Is(err, autocert.ErrCacheMiss) {
			return nil, fmt.Errorf("the account key in the cache: %w", err)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if m.cache != nil {
		b, err := encodeKeyAndChain(key, nil)
		if err == nil {
			err = m.cache.Put(ctx, accountKeyName, b)
		}
		if err != nil {
			return nil, fmt.Errorf("putting the account key in the cache: %w", err)
		}
	}
	return key, nil
}

// issue places one order for name and returns its certificate.
func (m *certManager) issue(ctx context.Context, name string) (*tls.Certificate, error) {
	if err := m.register(ctx); err != nil {
		return nil, fmt.Errorf("ACME account: %w", err)
	}
	o, err := m.client.AuthorizeOrder(ctx, xacme.DomainIDs(name))
	if err != nil {
		return nil, err
	}
	for _, u := range o.AuthzURLs {
		if err := m.authorize(ctx, name, u); err != nil {
			return nil, err
		}
	}
	if o, err = m.client.WaitOrder(ctx, o.URI); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{name}}, key)
	if err != nil {
		return nil, err
	}
	chain, _, err := m.client.CreateOrderCert(ctx, o.FinalizeURL, csr, true)
	if err != nil {
		return nil, err
	}
	c, err := certOf(name, key, chain)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	if now := time.Now(); !now.Before(c.Leaf.NotAfter) {
		return nil, fmt.Errorf("the CA's certificate expired at %s", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// authorize completes the authorization at url for name, answering one
// challenge, if it is pending.
func (m *certManager) authorize(ctx context.Context, name, url string) error {
	z, err := m.client.GetAuthorization(ctx, url)
	if err != nil {
		return err
	}
	switch z.Status {
	case xacme.StatusValid:
		return nil
	case xacme.StatusPending:
	default:
		return fmt.Errorf("the authorization for %s is %s", name, z.Status)
	}
	var chal *xacme.Challenge
	for _, typ := range []string{"tls-alpn-01", "http-01"} {
		for _, c := range z.Challenges {
			if c.Type == typ && chal == nil {
				chal = c
			}
		}
	}
	if chal == nil {
		m.abandon(z.URI)
		return errNoChallenge
	}
	done, err := m.answer(ctx, name, chal)
	if err != nil {
		m.abandon(z.URI)
		return err
	}
	defer done()
	if _, err := m.client.Accept(ctx, chal); err != nil {
		m.abandon(z.URI)
		return err
	}
	if _, err := m.client.WaitAuthorization(ctx, z.URI); err != nil {
		var invalid *xacme.AuthorizationError
		if !errors.As(err, &invalid) {
			m.abandon(z.URI) // still pending: the CA counts pending ones
		}
		return err
	}
	return nil
}

// abandon deactivates a pending authorization, if it can.
func (m *certManager) abandon(url string) {
	ctx, cancel := context.WithTimeout(m.ctx, cacheTimeout)
	defer cancel()
	m.client.RevokeAuthorization(ctx, url)
}

// answer readies the answer to chal for name, and returns a func that
// withdraws it.
func (m *certManager) answer(ctx context.Context, name string, chal *xacme.Challenge) (done func(), err error) {
	var key string
	var value []byte
	switch chal.Type {
	case "tls-alpn-01":
		cert, err := m.client.TLSALPN01ChallengeCert(chal.Token, name)
		if err != nil {
			return nil, err
		}
		signer, ok := cert.PrivateKey.(crypto.Signer)
		if !ok {
			return nil, errors.New("the challenge certificate's key cannot sign")
		}
		if value, err = encodeKeyAndChain(signer, cert.Certificate); err != nil {
			return nil, err
		}
		key = name + "+token"
		m.mu.Lock()
		m.alpn[name] = &cert
		m.mu.Unlock()
		done = func() {
			m.mu.Lock()
			delete(m.alpn, name)
			m.mu.Unlock()
		}
	case "http-01":
		v, err := m.client.HTTP01ChallengeResponse(chal.Token)
		if err != nil {
			return nil, err
		}
		path := m.client.HTTP01ChallengePath(chal.Token)
		key, value = chal.Token+"+http-01", []byte(v)
		m.mu.Lock()
		m.http01[path] = v
		m.mu.Unlock()
		done = func() {
			m.mu.Lock()
			delete(m.http01, path)
			m.mu.Unlock()
		}
	default:
		return nil, errNoChallenge
	}
	if m.cache == nil {
		return done, nil
	}
	// For the other edges sharing the Cache, which the CA may reach
	// instead of this one.
	m.cache.Put(ctx, key, value)
	withdraw := done
	return func() {
		withdraw()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cacheTimeout)
		defer cancel()
		m.cache.Delete(ctx, key)
	}, nil
}

// loadChallenge returns the TLS-ALPN-01 challenge certificate another edge
// put in the Cache for name.
func (m *certManager) loadChallenge(ctx context.Context, name string) (*tls.Certificate, error) {
	if m.cache == nil {
		return nil, autocert.ErrCacheMiss
	}
	b, err := m.cache.Get(ctx, name+"+token")
	if err != nil {
		return nil, err
	}
	key, chain, err := decodeKeyAndChain(b)
	if err != nil || len(chain) == 0 {
		return nil, autocert.ErrCacheMiss
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key}, nil
}

// load returns name's certificate from the Cache, if it holds one that
// has not expired; had reports whether it holds one at all.
func (m *certManager) load(ctx context.Context, name string) (c *tls.Certificate, had bool) {
	if m.cache == nil {
		return nil, false
	}
	b, err := m.cache.Get(ctx, name)
	if err != nil {
		if !errors.Is(err, autocert.ErrCacheMiss) {
			// Debug: a stranger's handshakes can repeat it.
			m.log.Debug("acme: cache", "op", "get", "name", name, "err", err)
		}
		return nil, false
	}
	key, chain, err := decodeKeyAndChain(b)
	if err != nil {
		return nil, false
	}
	if c, err = certOf(name, key, chain); err != nil {
		return nil, false
	}
	if !time.Now().Before(c.Leaf.NotAfter) {
		return nil, true
	}
	return c, true
}

// put keeps c as name's certificate in the Cache.
func (m *certManager) put(ctx context.Context, name string, c *tls.Certificate) error {
	if m.cache == nil {
		return nil
	}
	b, err := encodeKeyAndChain(c.PrivateKey.(crypto.Signer), c.Certificate)
	if err != nil {
		return err
	}
	return m.cache.Put(ctx, name, b)
}

// delete removes name's certificate from the Cache.
func (m *certManager) delete(name string) {
	if m.cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cacheTimeout)
	defer cancel()
	if err := m.cache.Delete(ctx, name); err != nil {
		m.log.Warn("acme: cache", "op", "delete", "name", name, "err", err)
	}
}

// certOf returns the certificate of chain and key, whose leaf must cover
// name and match the key.
func certOf(name string, key crypto.Signer, chain [][]byte) (*tls.Certificate, error) {
	if len(chain) == 0 {
		return nil, errors.New("no certificate")
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return nil, err
	}
	if err := leaf.VerifyHostname(name); err != nil {
		return nil, err
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return nil, errors.New("the key does not match the certificate")
	}
	return &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: leaf}, nil
}

// encodeKeyAndChain writes key, then the certificates of chain, in PEM.
func encodeKeyAndChain(key crypto.Signer, chain [][]byte) ([]byte, error) {
	var buf bytes.Buffer
	var block *pem.Block
	if k, ok := key.(*ecdsa.PrivateKey); ok {
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		block = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
	} else {
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return nil, err
		}
		block = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
	}
	pem.Encode(&buf, block)
	for _, c := range chain {
		pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c})
	}
	return buf.Bytes(), nil
}

// decodeKeyAndChain reads what encodeKeyAndChain (or autocert) wrote: a
// private key, then certificates.
func decodeKeyAndChain(b []byte) (crypto.Signer, [][]byte, error) {
	block, rest := pem.Decode(b)
	if block == nil || !strings.HasSuffix(block.Type, "PRIVATE KEY") {
		return nil, nil, errors.New("no PEM private key first")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("the private key cannot sign")
	}
	var chain [][]byte
	for {
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			chain = append(chain, block.Bytes)
		}
	}
	return signer, chain, nil
}
