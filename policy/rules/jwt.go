package rules

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/tunnelkit/tunnelkit/policy"
)

// The defaults of jwt-validation.
const (
	// DefaultJWKSRefresh is the least time between two fetches of one
	// JWKS for tokens whose key it does not hold (a key rotated in), when
	// Engine.JWKSRefresh is zero: a flood of tokens with made-up key IDs
	// costs the JWKS server one request per interval.
	DefaultJWKSRefresh = 30 * time.Second

	// JWKSTTL is how long fetched keys are used before they are fetched
	// again.
	JWKSTTL = time.Hour

	// JWKSTimeout bounds a fetch; MaxJWKSBytes its body.
	JWKSTimeout  = 5 * time.Second
	MaxJWKSBytes = 256 << 10

	// JWTLeeway is the clock skew allowed on exp, nbf and iat.
	JWTLeeway = time.Minute
)

// ErrPrivateJWKS is the error of a JWKS URL at an address that is not
// public, when Engine.AllowPrivate is false: a tenant naming a URL must
// not make the edge reach into its own network.
var ErrPrivateJWKS = errors.New("rules: JWKS at a non-public address")

var _ policy.JWTEngine = Engine{}

// JWT implements policy.JWTEngine: a verifier of tokens signed by the keys
// of cfg's JWKS URLs, fetched when first needed, kept JWKSTTL, and fetched
// again for an unknown key ID at most once every Engine.JWKSRefresh.
func (e Engine) JWT(cfg *policy.JWTValidation) (policy.JWTVerifier, error) {
	var sets []*keySet
	for _, u := range cfg.JWS.Keys.Sources.AdditionalJKUs {
		if !e.AllowPrivate && policy.PrivateJKU(u) {
			return nil, fmt.Errorf("%w: %w: %s", policy.ErrForbidden, ErrPrivateJWKS, u)
		}
		sets = append(sets, &keySet{url: u, client: e.client(), refresh: e.jwksRefresh()})
	}
	var algs []jose.SignatureAlgorithm
	for _, a := range cfg.JWS.AllowedAlgorithms {
		algs = append(algs, jose.SignatureAlgorithm(a))
	}
	var issuers, audiences []string
	for _, v := range cfg.Issuer.AllowList {
		issuers = append(issuers, v.Value)
	}
	for _, v := range cfg.Audience.AllowList {
		audiences = append(audiences, v.Value)
	}
	return func(ctx context.Context, token string, now time.Time) (map[string]any, error) {
		tok, err := jwt.ParseSigned(token, algs)
		if err != nil {
			return nil, err
		}
		if len(tok.Headers) != 1 {
			return nil, errors.New("a token of one signature only")
		}
		h := tok.Headers[0]
		var std jwt.Claims
		var all map[string]any
		verified, unavailable := false, 0
		for _, ks := range sets {
			keys, err := ks.find(ctx, now, h.KeyID, h.Algorithm)
			if err != nil {
				unavailable++
				continue
			}
			for _, k := range keys {
				if tok.Claims(k.Key, &std, &all) == nil {
					verified = true
					break
				}
			}
			if verified {
				break
			}
		}
		switch {
		case !verified && unavailable == len(sets):
			return nil, fmt.Errorf("%w: no JWKS could be fetched", policy.ErrUnavailable)
		case !verified:
			return nil, errors.New("no key of the JWKS verifies the token")
		case !slices.Contains(issuers, std.Issuer):
			return nil, jwt.ErrInvalidIssuer
		}
		if err := std.ValidateWithLeeway(jwt.Expected{AnyAudience: audiences, Time: now}, JWTLeeway); err != nil {
			return nil, err
		}
		return all, nil
	}, nil
}

func (e Engine) jwksRefresh() time.Duration {
	if e.JWKSRefresh > 0 {
		return e.JWKSRefresh
	}
	return DefaultJWKSRefresh
}

// clients are the HTTP clients of JWKS fetches, one per setting.
var clients sync.Map // clientKey -> *http.Client

type clientKey struct {
	private bool
	roots   *x509.CertPool
}

func (e Engine) client() *http.Client {
	k := clientKey{e.AllowPrivate, e.RootCAs}
	if c, ok := clients.Load(k); ok {
		return c.(*http.Client)
	}
	dialer := &net.Dialer{Timeout: JWKSTimeout}
	if !e.AllowPrivate {
		dialer.Control = publicOnly
	}
	c := &http.Client{
		Timeout: JWKSTimeout,
		Transport: &http.Transport{
			Proxy:               nil, // the address checked is the server's
			DialContext:         dialer.DialContext,
			TLSClientConfig:     &tls.Config{RootCAs: e.RootCAs},
			TLSHandshakeTimeout: JWKSTimeout,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     time.Minute,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return errors.New("a JWKS URL that redirects") },
	}
	got, _ := clients.LoadOrStore(k, c)
	return got.(*http.Client)
}

// publicOnly is a net.Dialer's Control that refuses addresses that are
// not public ones.
func publicOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrPrivateJWKS, address)
	}
	if a := ap.Addr().Unmap(); !policy.PublicAddr(a) {
		return fmt.Errorf("%w: %s", ErrPrivateJWKS, a)
	}
	return nil
}

// keySet is one JWKS URL's keys.
type keySet struct {
	url     string
	client  *http.Client
	refresh time.Duration

	mu      sync.Mutex // held while fetching: the others wait for it
	keys    []jose.JSONWebKey
	fetched time.Time // of keys
	tried   time.Time // the last fetch, successful or not
}

// find returns the keys that may have signed a token with key ID kid and
// algorithm alg, fetching the set when it has none or they are old, or
// when it holds no key of kid and it was not fetched within refresh.
func (ks *keySet) find(ctx context.Context, now time.Time, kid, alg string) ([]jose.JSONWebKey, error) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.keys == nil && !ks.tried.IsZero() && now.Sub(ks.tried) < min(ks.refresh, JWKSTimeout) {
		return nil, errors.New("the last fetch of the JWKS failed")
	}
	if ks.keys == nil || now.Sub(ks.fetched) > JWKSTTL {
		if err := ks.fetch(ctx, now); err != nil && ks.keys == nil {
			return nil, err
		}
	}
	keys := match(ks.keys, kid, alg)
	if len(keys) == 0 && kid != "" && now.Sub(ks.tried) >= ks.refresh {
		ks.fetch(ctx, now)
		keys = match(ks.keys, kid, alg)
	}
	return keys, nil
}

func match(keys []jose.JSONWebKey, kid, alg string) []jose.JSONWebKey {
	var out []jose.JSONWebKey
	for _, k := range keys {
		if (kid == "" || k.KeyID == kid) && (k.Algorithm == "" || k.Algorithm == alg) {
			out = append(out, k)
		}
	}
	return out
}

// fetch gets the set; on failure the keys held stay.
func (ks *keySet) fetch(ctx context.Context, now time.Time) error {
	ks.tried = now
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), JWKSTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ks.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := ks.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("JWKS %s: %s", ks.url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxJWKSBytes+1))
	if err != nil {
		return err
	}
	if len(body) > MaxJWKSBytes {
		return fmt.Errorf("JWKS %s: over %d bytes", ks.url, MaxJWKSBytes)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		return fmt.Errorf("JWKS %s: %v", ks.url, err)
	}
	keys := []jose.JSONWebKey{} // not nil: fetched, maybe empty
	for _, k := range set.Keys {
		// Public signing keys only: a symmetric ("oct") key published
		// in a JWKS would let anyone who read it sign.
		if k.IsPublic() && (k.Use == "" || k.Use == "sig") && k.Valid() {
			keys = append(keys, k)
		}
	}
	ks.keys, ks.fetched = keys, now
	return nil
}
