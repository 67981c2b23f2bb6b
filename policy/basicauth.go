package policy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"hash"
	"net/http"
	"strings"
	"sync"
)

// basicAuth checks HTTP basic credentials against keyed hashes of the
// declared pairs: HMAC-SHA256 under a key drawn at random for each compiled
// policy, so no password stays in clear once compiled, and checking a
// request costs one HMAC and a constant-time scan of at most MaxCredentials
// hashes, whatever the user name.
type basicAuth struct {
	macs  [][sha256.Size]byte
	users [][]string // users[i]: the user of macs[i], as a header value
	pass  bool       // pass the Authorization header on to the app
	pool  sync.Pool  // of *basicMAC, under the policy's key
}

// basicMAC is a keyed hash and scratch space, reused between requests.
type basicMAC struct {
	h   hash.Hash
	sum [sha256.Size]byte
	enc [(MaxCredentialBytes + 2) / 3 * 4]byte // the header's base64
	raw [(MaxCredentialBytes + 2) / 3 * 3]byte // decoded credentials
}

// basicChallenge is the WWW-Authenticate header of a 401.
var basicChallenge = []string{`Basic realm="tunnelkit", charset="UTF-8"`}

func newBasicAuth(b *BasicAuth) *basicAuth {
	key := make([]byte, 32)
	rand.Read(key)
	a := &basicAuth{pass: b.PassAuthorization}
	a.pool.New = func() any { return &basicMAC{h: hmac.New(sha256.New, key)} }
	m := a.pool.Get().(*basicMAC)
	for _, c := range b.Credentials {
		user, pass, _ := strings.Cut(c, ":")
		a.macs = append(a.macs, m.mac([]byte(user), []byte(pass)))
		a.users = append(a.users, []string{user}[:1:1])
	}
	a.pool.Put(m)
	return a
}

// mac hashes a user and password, each length-prefixed so that no two
// pairs hash alike.
func (m *basicMAC) mac(user, pass []byte) [sha256.Size]byte {
	m.h.Reset()
	m.sum[0], m.sum[1] = byte(len(user)>>8), byte(len(user))
	m.h.Write(m.sum[:2])
	m.h.Write(user)
	m.h.Write(pass)
	return [sha256.Size]byte(m.h.Sum(m.sum[:0]))
}

// check returns the index of the pair the request's Authorization header
// carries, or -1.
func (a *basicAuth) check(h http.Header) int {
	v := h["Authorization"]
	if len(v) != 1 {
		return -1
	}
	const prefix = "Basic "
	s := v[0]
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return -1
	}
	s = strings.TrimLeft(s[len(prefix):], " ")
	m := a.pool.Get().(*basicMAC)
	defer a.pool.Put(m)
	if len(s) > len(m.enc) {
		return -1
	}
	enc := m.enc[:copy(m.enc[:], s)]
	n, err := base64.StdEncoding.Decode(m.raw[:], enc)
	if err != nil {
		return -1
	}
	raw := m.raw[:n]
	i := 0
	for i < len(raw) && raw[i] != ':' {
		i++
	}
	if i == len(raw) {
		return -1
	}
	sum := m.mac(raw[:i], raw[i+1:])
	found := -1
	for j := range a.macs {
		// Every hash is compared, whichever matches.
		eq := subtle.ConstantTimeCompare(sum[:], a.macs[j][:])
		found = subtle.ConstantTimeSelect(eq, j, found)
	}
	return found
}
