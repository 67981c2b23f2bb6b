package policy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// The recipe of the package documentation, with httputil.ReverseProxy as
// the edge's proxy: what the policy sets reaches the app over a real
// connection, and the app's response is rewritten.
func TestBehindReverseProxy(t *testing.T) {
	type seen struct {
		Header http.Header
		Body   string
		Length int64
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Server", "app/1.0")
		w.Header().Set("X-Powered-By", "PHP")
		json.NewEncoder(w).Encode(seen{r.Header, string(body), r.ContentLength})
	}))
	defer app.Close()
	target, _ := url.Parse(app.URL)
	pol := mustCompile(t, ProtoHTTP, Spec{
		BasicAuth:       &BasicAuth{Credentials: []string{"ann:s3cret"}},
		Webhook:         &Webhook{Provider: WebhookGitHub, Secret: "hook"},
		RequestHeaders:  &Headers{Add: []string{"X-Env: prod"}, Remove: []string{"X-Debug"}},
		ResponseHeaders: &Headers{Add: []string{"X-Frame-Options: DENY"}, Remove: []string{"Server", "X-Powered-By"}},
	}, Options{})
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		ModifyResponse: func(resp *http.Response) error {
			pol.Response(resp, resp.Request, netip.Addr{})
			return nil
		},
	}
	edge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client := netip.MustParseAddrPort(r.RemoteAddr).Addr()
		if pol.Check(w, r, client) {
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	defer edge.Close()

	const payload = `{"zen":"Keep it logically awesome."}`
	req, _ := http.NewRequest("POST", edge.URL+"/hook", io.NopCloser(strings.NewReader(payload))) // chunked
	req.SetBasicAuth("ann", "s3cret")
	req.Header.Set("X-Hub-Signature-256", "sha256="+sign("hook", payload))
	req.Header.Set("X-Debug", "1")
	req.Header.Set(HeaderAuthUser, "root")
	resp, err := edge.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got seen
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d, %v", resp.StatusCode, err)
	}
	if got.Body != payload || got.Length != int64(len(payload)) {
		t.Errorf("the app got body %q of length %d; want the client's %d bytes", got.Body, got.Length, len(payload))
	}
	if got.Header.Get(HeaderAuthUser) != "ann" || got.Header.Get("X-Env") != "prod" || got.Header.Get("X-Debug") != "" || got.Header.Get("Authorization") != "" {
		t.Errorf("the app got headers %v", got.Header)
	}
	if resp.Header.Get("Server") != "" || resp.Header.Get("X-Powered-By") != "" || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("the client got headers %v", resp.Header)
	}

	// A refusal never reaches the app.
	req, _ = http.NewRequest("POST", edge.URL+"/hook", strings.NewReader(payload))
	req.SetBasicAuth("ann", "s3cret")
	req.Header.Set("X-Hub-Signature-256", "sha256="+sign("other", payload))
	resp, err = edge.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("Tunnelkit-Error") != CodeWebhookInvalid || !strings.HasPrefix(string(body), "webhook_invalid: ") {
		t.Errorf("bad signature: %d %q", resp.StatusCode, body)
	}
}
