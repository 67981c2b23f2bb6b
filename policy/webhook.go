package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxWebhookBody is the largest body a webhook check reads when
// Options.MaxWebhookBody is zero: a larger one is refused with 413
// body_too_large. (GitHub caps its payloads at 25 MB, but almost all are
// far smaller; Stripe's and Slack's are small.)
const DefaultMaxWebhookBody = 1 << 20

// WebhookTolerance is how far a signed timestamp (Stripe's t=, Slack's
// X-Slack-Request-Timestamp) may be from the edge's clock, either way: both
// providers recommend five minutes, against replays.
const WebhookTolerance = 5 * time.Minute

// maxSignatures bounds the signatures of one Stripe-Signature header that
// are tried (Stripe sends several while a secret is rolled).
const maxSignatures = 8

// webhook verifies a provider's signature of a request body.
type webhook struct {
	provider string
	secret   []byte // an HMAC key: it cannot be kept other than as itself
}

func newWebhook(w *Webhook) *webhook {
	return &webhook{provider: w.Provider, secret: []byte(w.Secret)}
}

// verify reports whether h and body carry a valid signature at now.
func (wh *webhook) verify(h http.Header, body []byte, now time.Time) bool {
	switch wh.provider {
	case WebhookGitHub:
		// X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>
		sig, ok := strings.CutPrefix(h.Get("X-Hub-Signature-256"), "sha256=")
		return ok && wh.equal(sig, nil, body)
	case WebhookStripe:
		// Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, t "." body)>[,v1=...][,v0=...]
		var ts string
		var sigs []string
		for field := range strings.SplitSeq(h.Get("Stripe-Signature"), ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(field), "=")
			switch k {
			case "t":
				if ts != "" {
					return false
				}
				ts = v
			case "v1":
				if len(sigs) < maxSignatures {
					sigs = append(sigs, v)
				}
			}
		}
		if !fresh(ts, now) {
			return false
		}
		ok := false
		for _, sig := range sigs {
			ok = wh.equal(sig, []byte(ts+"."), body) || ok
		}
		return ok
	case WebhookSlack:
		// X-Slack-Signature: v0=<hex HMAC-SHA256(secret, "v0:" ts ":" body)>
		ts := h.Get("X-Slack-Request-Timestamp")
		sig, ok := strings.CutPrefix(h.Get("X-Slack-Signature"), "v0=")
		return ok && fresh(ts, now) && wh.equal(sig, []byte("v0:"+ts+":"), body)
	}
	return false
}

// equal reports whether the hex signature sig is the HMAC of prefix and
// body, comparing in constant time.
func (wh *webhook) equal(sig string, prefix, body []byte) bool {
	var got [sha256.Size]byte
	if len(sig) != hex.EncodedLen(len(got)) {
		return false
	}
	if _, err := hex.Decode(got[:], []byte(sig)); err != nil {
		return false
	}
	m := hmac.New(sha256.New, wh.secret)
	m.Write(prefix)
	m.Write(body)
	return hmac.Equal(m.Sum(nil), got[:])
}

// fresh reports whether ts, decimal Unix seconds, is within
// WebhookTolerance of now.
func fresh(ts string, now time.Time) bool {
	if ts == "" || len(ts) > 12 {
		return false
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sec < 0 {
		return false
	}
	d := now.Sub(time.Unix(sec, 0))
	return d <= WebhookTolerance && d >= -WebhookTolerance
}
