package policy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sign is HMAC-SHA256 in hex, as each provider documents it.
func sign(secret, payload string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(payload))
	return hex.EncodeToString(m.Sum(nil))
}

func TestWebhook(t *testing.T) {
	const body = `{"action":"opened","number":7}`
	clk := newClock()
	now := clk.Now().Unix()
	ts := strconv.FormatInt(now, 10)
	old := strconv.FormatInt(now-int64(WebhookTolerance/time.Second)-1, 10)
	future := strconv.FormatInt(now+int64(WebhookTolerance/time.Second)+1, 10)
	edge := strconv.FormatInt(now-int64(WebhookTolerance/time.Second), 10)
	type hdr = map[string]string
	for _, tc := range []struct {
		name     string
		provider string
		secret   string
		header   hdr
		body     string
		ok       bool
	}{
		{"github", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + sign("gh-secret", body)}, body, true},
		{"github upper hex", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + strings.ToUpper(sign("gh-secret", body))}, body, true},
		{"github empty body", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + sign("gh-secret", "")}, "", true},
		{"github wrong secret", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + sign("other", body)}, body, false},
		{"github tampered", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + sign("gh-secret", body)}, body + " ", false},
		{"github sha1 only", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature": "sha1=00"}, body, false},
		{"github no prefix", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": sign("gh-secret", body)}, body, false},
		{"github short", WebhookGitHub, "gh-secret", hdr{"X-Hub-Signature-256": "sha256=" + sign("gh-secret", body)[:62]}, body, false},
		{"stripe", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + ts + ",v1=" + sign("whsec_abc", ts+"."+body)}, body, true},
		{"stripe rolled secret", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + ts + ",v1=" + sign("whsec_old", ts+"."+body) + ",v1=" + sign("whsec_abc", ts+"."+body) + ",v0=deadbeef"}, body, true},
		{"stripe at tolerance", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + edge + ",v1=" + sign("whsec_abc", edge+"."+body)}, body, true},
		{"stripe old", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + old + ",v1=" + sign("whsec_abc", old+"."+body)}, body, false},
		{"stripe future", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + future + ",v1=" + sign("whsec_abc", future+"."+body)}, body, false},
		{"stripe other t", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + ts + ",v1=" + sign("whsec_abc", edge+"."+body)}, body, false},
		{"stripe two t", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + ts + ",t=" + ts + ",v1=" + sign("whsec_abc", ts+"."+body)}, body, false},
		{"stripe v0 only", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "t=" + ts + ",v0=" + sign("whsec_abc", ts+"."+body)}, body, false},
		{"stripe no t", WebhookStripe, "whsec_abc", hdr{"Stripe-Signature": "v1=" + sign("whsec_abc", "."+body)}, body, false},
		{"slack", WebhookSlack, "8f742231b10e8888abcd99yyyzzz85a5", hdr{"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": "v0=" + sign("8f742231b10e8888abcd99yyyzzz85a5", "v0:"+ts+":"+body)}, body, true},
		{"slack old", WebhookSlack, "s", hdr{"X-Slack-Request-Timestamp": old, "X-Slack-Signature": "v0=" + sign("s", "v0:"+old+":"+body)}, body, false},
		{"slack other ts", WebhookSlack, "s", hdr{"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": "v0=" + sign("s", "v0:"+edge+":"+body)}, body, false},
		{"slack no ts", WebhookSlack, "s", hdr{"X-Slack-Signature": "v0=" + sign("s", "v0::"+body)}, body, false},
		{"slack bad ts", WebhookSlack, "s", hdr{"X-Slack-Request-Timestamp": "-1", "X-Slack-Signature": "v0=" + sign("s", "v0:-1:"+body)}, body, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, ProtoHTTPS, Spec{Webhook: &Webhook{Provider: tc.provider, Secret: tc.secret}}, Options{Now: clk.Now})
			r := newRequest("POST", "/hook")
			r.Body = io.NopCloser(strings.NewReader(tc.body))
			r.ContentLength = -1 // as for a chunked body
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			served, w := check(p, r, "192.0.2.1")
			if !tc.ok {
				if !served || w.Code != http.StatusForbidden || w.Header().Get("Tunnelkit-Error") != CodeWebhookInvalid {
					t.Fatalf("served %v, %d %q; want 403 webhook_invalid", served, w.Code, w.Header().Get("Tunnelkit-Error"))
				}
				return
			}
			if served {
				t.Fatalf("refused: %d %s", w.Code, w.Body)
			}
			// The app gets the body intact, twice if it asks.
			for range 2 {
				got, err := io.ReadAll(r.Body)
				if err != nil || string(got) != tc.body || r.ContentLength != int64(len(tc.body)) {
					t.Fatalf("app's body %q (%d), %v; want %q", got, r.ContentLength, err, tc.body)
				}
				if r.Body, err = r.GetBody(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestWebhookBodyBound(t *testing.T) {
	const max = 1000
	p := mustCompile(t, ProtoHTTP, Spec{Webhook: &Webhook{Provider: WebhookGitHub, Secret: "s"}}, Options{MaxWebhookBody: max})
	for _, tc := range []struct {
		name   string
		size   int
		length int64
		status int
	}{
		{"announced too large", max + 1, max + 1, 413},
		{"chunked too large", max + 1, -1, 413},
		{"chunked much too large", 100 * max, -1, 413},
		{"at the bound", max, max, 200},
	} {
		body := strings.Repeat("x", tc.size)
		src := &countingReader{r: strings.NewReader(body)}
		r := newRequest("POST", "/")
		r.Body = io.NopCloser(src)
		r.ContentLength = tc.length
		r.Header.Set("X-Hub-Signature-256", "sha256="+sign("s", body))
		served, w := check(p, r, "192.0.2.1")
		switch {
		case tc.status == 200 && served:
			t.Errorf("%s: refused: %d %s", tc.name, w.Code, w.Body)
		case tc.status != 200 && (!served || w.Code != tc.status || w.Header().Get("Tunnelkit-Error") != CodeBodyTooLarge):
			t.Errorf("%s: served %v, %d %q; want %d body_too_large", tc.name, served, w.Code, w.Header().Get("Tunnelkit-Error"), tc.status)
		}
		if src.n > max+1 {
			t.Errorf("%s: read %d bytes (bound %d)", tc.name, src.n, max)
		}
		if tc.length > max && src.n != 0 {
			t.Errorf("%s: read %d bytes of a body announced too large", tc.name, src.n)
		}
	}
	if DefaultMaxWebhookBody != 1<<20 {
		t.Error("the documented default changed")
	}
	// The caller bounds the time of the read, knowing there is one.
	if !p.ReadsBody() {
		t.Error("ReadsBody of a webhook policy: false")
	}
	other := mustCompile(t, ProtoHTTP, Spec{BasicAuth: &BasicAuth{Credentials: []string{"a:b"}}, RateLimit: &RateLimit{Requests: 1}}, Options{})
	if other.ReadsBody() || (*Policy)(nil).ReadsBody() {
		t.Error("ReadsBody of a policy without webhook: true")
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
