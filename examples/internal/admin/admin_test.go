package admin

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

const token = "0123456789abcdef-the-admin-token"

// bearer is the Authorization header with the API's token.
const bearer = "Bearer " + token

// testEdge is an edge on loopback, whose tokens are "token-of-" and the
// identity, with the admin API in front of it.
type testEdge struct {
	srv                 *edge.Server
	url                 string // the API's
	agentAddr, httpAddr string
	drains              atomic.Int32
}

func startEdge(t *testing.T) *testEdge {
	t.Helper()
	return startEdgeWith(t, nil, nil)
}

// startEdgeWith is startEdge, with the edge's settings and the API's
// changed by configure and configureAPI, unless nil.
func startEdgeWith(t *testing.T, configure func(*edge.Server), configureAPI func(*API)) *testEdge {
	t.Helper()
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	agents, pub := listen(), listen()
	srv := &edge.Server{Domain: "example.test", Authenticate: func(_ context.Context, tok string) (string, error) {
		if id, ok := strings.CutPrefix(tok, "token-of-"); ok {
			return id, nil
		}
		return "", errors.New("unknown token")
	}}
	if configure != nil {
		configure(srv)
	}
	if err := srv.Start(edge.Listeners{Agents: agents, HTTP: pub}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	e := &testEdge{srv: srv, agentAddr: agents.Addr().String(), httpAddr: pub.Addr().String()}
	api := &API{Server: srv, Token: sha256.Sum256([]byte(token)), Drain: func() { e.drains.Add(1) }}
	if configureAPI != nil {
		configureAPI(api)
	}
	hs := httptest.NewServer(api)
	t.Cleanup(hs.Close)
	e.url = hs.URL
	return e
}

// agentOf connects an agent of identity to e and binds url, serving "ok".
func (e *testEdge) agentOf(t *testing.T, identity, url string) *agent.Client {
	t.Helper()
	c := &agent.Client{Addrs: []string{e.agentAddr}, Token: "token-of-" + identity, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	t.Cleanup(func() { c.Close() })
	l, err := c.Listen(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	return c
}

// get requests host's "/" through the edge's HTTP port.
func (e *testEdge) get(t *testing.T, host string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.httpAddr+"/", nil)
	req.Host = host
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// call sends method path with body to the API, with auth as the
// Authorization header when not empty, and returns the status and body.
func (e *testEdge) call(t *testing.T, method, path, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusUnauthorized && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("%s %s: 401 without WWW-Authenticate: Bearer", method, path)
	}
	return resp.StatusCode, string(b)
}

// endpoints are the API's, each with a request that would succeed.
var endpoints = []struct{ method, path, body string }{
	{"GET", "/v1/sessions", ""},
	{"GET", "/v1/endpoints", ""},
	{"POST", "/v1/identities/alice/disconnect", ""},
	{"GET", "/v1/reservations", ""},
	{"PUT", "/v1/reservations/kept.example.test", `{"identity":"carol"}`},
	{"DELETE", "/v1/reservations/kept.example.test", ""},
	{"POST", "/v1/drain", ""},
}

// Every endpoint under /v1/ answers 401 without the token, with another
// one, with it in another scheme, and changes nothing; with it, each
// answers.
func TestUnauthorized(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	e.agentOf(t, "alice", "http://app")
	for _, ep := range endpoints {
		for _, auth := range []string{"", "Bearer wrong-token-of-the-same-size-", "Bearer " + token + "x", "Basic " + token, token, "Bearer", "Bearer " + strings.ToUpper(token)} {
			if code, body := e.call(t, ep.method, ep.path, auth, ep.body); code != http.StatusUnauthorized {
				t.Errorf("%s %s with Authorization %q: %d %s, want 401", ep.method, ep.path, auth, code, body)
			}
		}
	}
	if e.drains.Load() != 0 || len(e.srv.Sessions()) != 1 {
		t.Fatalf("unauthorized requests changed something: %d drains, %d sessions", e.drains.Load(), len(e.srv.Sessions()))
	}
	for _, ep := range endpoints {
		if code, body := e.call(t, ep.method, ep.path, bearer, ep.body); code/100 != 2 {
			t.Errorf("%s %s with the token: %d %s", ep.method, ep.path, code, body)
		}
	}
	if e.drains.Load() != 1 {
		t.Errorf("POST /v1/drain: %d drains, want 1", e.drains.Load())
	}
}

// /healthz needs no token: 200 while the edge serves, 503 once it drains.
func TestHealthz(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	if code, body := e.call(t, "GET", "/healthz", "", ""); code != 200 || body != "ok\n" {
		t.Fatalf("serving: %d %q", code, body)
	}
	if code, _ := e.call(t, "POST", "/healthz", "", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", code)
	}
	go e.srv.Drain(context.Background())
	testwait.For(t, e.srv.Draining)
	if code, body := e.call(t, "GET", "/healthz", "", ""); code != 503 {
		t.Fatalf("draining: %d %q", code, body)
	}
}

// The sessions and endpoints, as JSON of the shape, with their
// traffic.
func TestSessionsAndEndpoints(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	e.agentOf(t, "alice", "http://app")
	if code := e.get(t, "app.example.test"); code != 200 {
		t.Fatalf("GET through the edge: %d", code)
	}
	code, body := e.call(t, "GET", "/v1/sessions", bearer, "")
	var sessions struct {
		Sessions []struct {
			ID, Identity, Remote string
			Version              int
			Since                time.Time
			Endpoints            []struct{ URL string }
		}
	}
	if err := json.Unmarshal([]byte(body), &sessions); code != 200 || err != nil {
		t.Fatalf("GET /v1/sessions: %d %s %v", code, body, err)
	}
	if s := sessions.Sessions; len(s) != 1 || s[0].ID == "" || s[0].Identity != "alice" || s[0].Remote == "" || s[0].Version == 0 || s[0].Since.IsZero() ||
		len(s[0].Endpoints) != 1 || !strings.HasPrefix(s[0].Endpoints[0].URL, "http://app.example.test:") {
		t.Errorf("GET /v1/sessions: %s", body)
	}
	// The request's counts land once the exchange ended.
	testwait.For(t, func() bool {
		_, body = e.call(t, "GET", "/v1/endpoints", bearer, "")
		return strings.Contains(body, `"requests":1`)
	})
	var endpoints struct {
		Endpoints []map[string]any
	}
	if err := json.Unmarshal([]byte(body), &endpoints); err != nil || len(endpoints.Endpoints) != 1 {
		t.Fatalf("GET /v1/endpoints: %s %v", body, err)
	}
	ep := endpoints.Endpoints[0]
	for _, k := range []string{"url", "proto", "identity", "session", "requests", "conns", "bytes_in", "bytes_out"} {
		if _, ok := ep[k]; !ok {
			t.Errorf("GET /v1/endpoints: no %q in %s", k, body)
		}
	}
	if ep["identity"] != "alice" || ep["proto"] != "http" || ep["session"] != sessions.Sessions[0].ID || ep["bytes_out"].(float64) == 0 {
		t.Errorf("GET /v1/endpoints: %s", body)
	}
}

// Disconnecting an identity ends its sessions at once, and no other's.
func TestDisconnect(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	e.agentOf(t, "alice", "http://app")
	e.agentOf(t, "bob", "http://bob")
	var before string
	for _, s := range e.srv.Sessions() {
		if s.Identity == "alice" {
			before = s.ID
		}
	}
	if code, body := e.call(t, "POST", "/v1/identities/alice/disconnect?free=true", bearer, ""); code != 200 || strings.TrimSpace(body) != `{"disconnected":1}` {
		t.Fatalf("disconnect: %d %s", code, body)
	}
	for _, s := range e.srv.Sessions() {
		if s.ID == before {
			t.Errorf("alice's session %s lives on", before)
		}
	}
	if code, body := e.call(t, "POST", "/v1/identities/nobody/disconnect", bearer, ""); code != 200 || strings.TrimSpace(body) != `{"disconnected":0}` {
		t.Errorf("disconnect of nobody: %d %s", code, body)
	}
	if code := e.get(t, "bob.example.test"); code != 200 {
		t.Errorf("bob after alice's disconnect: %d", code)
	}
	if code, _ := e.call(t, "GET", "/v1/identities/alice/disconnect", bearer, ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET of disconnect: %d, want 405", code)
	}
}

// Reservations: put, listed, refused to another identity where another
// holds the name, deleted; bad bodies and names are 400, a missing one
// 404.
func TestReservations(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	e.agentOf(t, "bob", "http://taken")
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"PUT", "/v1/reservations/kept.example.test", `{"identity":"alice"}`, 200, `{"name":"kept.example.test","identity":"alice"}`},
		{"PUT", "/v1/reservations/customer.example.com", `{"identity":"alice"}`, 200, ""},
		{"GET", "/v1/reservations", "", 200, `{"reservations":[{"name":"customer.example.com","identity":"alice"},{"name":"kept.example.test","identity":"alice"}]}`},
		{"PUT", "/v1/reservations/taken.example.test", `{"identity":"alice"}`, 409, ""},
		{"PUT", "/v1/reservations/x.kept.example.test", `{"identity":"bob"}`, 409, ""},
		{"PUT", "/v1/reservations/kept2.example.test", `{"identity":""}`, 400, ""},
		{"PUT", "/v1/reservations/kept2.example.test", `{"identity":"alice","extra":1}`, 400, ""},
		{"PUT", "/v1/reservations/kept2.example.test", `not json`, 400, ""},
		{"PUT", "/v1/reservations/*.example.test", `{"identity":"alice"}`, 400, ""},
		{"PUT", "/v1/reservations/example.test", `{"identity":"alice"}`, 400, ""},
		{"DELETE", "/v1/reservations/kept.example.test", "", 200, `{"name":"kept.example.test"}`},
		{"DELETE", "/v1/reservations/kept.example.test", "", 404, ""},
		{"GET", "/v1/reservations", "", 200, `{"reservations":[{"name":"customer.example.com","identity":"alice"}]}`},
	} {
		code, body := e.call(t, c.method, c.path, bearer, c.body)
		if code != c.code || c.want != "" && strings.TrimSpace(body) != c.want {
			t.Errorf("%s %s %s: %d %s, want %d %s", c.method, c.path, c.body, code, body, c.code, c.want)
		}
		if code >= 400 && !strings.Contains(body, `"error":`) {
			t.Errorf("%s %s: %d without an error message: %s", c.method, c.path, code, body)
		}
	}
}

// A flood of reservations stops at the edge's bounds, per identity and in
// all, with 409 and a message naming the bound; the reservations made
// are listed, and a removal makes room.
func TestReservationFlood(t *testing.T) {
	t.Parallel()
	e := startEdgeWith(t, func(s *edge.Server) { s.Limits.Reservations, s.Limits.ReservationsPerIdentity = 50, 20 }, nil)
	made := 0
	for i := range 1000 {
		code, body := e.call(t, "PUT", fmt.Sprintf("/v1/reservations/n%d", i), bearer, `{"identity":"alice"}`)
		if code == http.StatusConflict {
			if !strings.Contains(body, "too many reservations") || !strings.Contains(body, "alice holds 20") || !strings.Contains(body, "ReservationsPerIdentity") {
				t.Errorf("alice past her bound: %s", body)
			}
			break
		}
		if code != 200 {
			t.Fatalf("PUT n%d: %d %s", i, code, body)
		}
		made++
	}
	if made != 20 {
		t.Fatalf("alice's flood: %d reservations made, want 20", made)
	}
	for i := range 1000 {
		code, body := e.call(t, "PUT", fmt.Sprintf("/v1/reservations/m%d", i), bearer, fmt.Sprintf(`{"identity":"id%d"}`, i))
		if code == http.StatusConflict {
			if !strings.Contains(body, "too many reservations") || !strings.Contains(body, "Limits.Reservations") || !strings.Contains(body, `"name":"m`) {
				t.Errorf("past the edge's bound: %s", body)
			}
			break
		}
		if code != 200 {
			t.Fatalf("PUT m%d: %d %s", i, code, body)
		}
		made++
	}
	if made != 50 {
		t.Fatalf("the flood: %d reservations made, want 50", made)
	}
	var list struct{ Reservations []reservation }
	if _, body := e.call(t, "GET", "/v1/reservations", bearer, ""); json.Unmarshal([]byte(body), &list) != nil || len(list.Reservations) != 50 {
		t.Fatalf("GET /v1/reservations: %s", body)
	}
	if code, body := e.call(t, "DELETE", "/v1/reservations/N0", bearer, ""); code != 200 {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	if code, body := e.call(t, "PUT", "/v1/reservations/again", bearer, `{"identity":"bob"}`); code != 200 {
		t.Fatalf("PUT once one was removed: %d %s", code, body)
	}
}

// A reservation's name is one however it is spelled: PUT, GET and DELETE
// answer the stored spelling, and find the reservation under any other.
func TestReservationSpellings(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	spellings := []string{"zzz", "ZZZ", "zzz.example.test", "zzz.Example.TEST."}
	for _, put := range spellings {
		for _, del := range spellings {
			if code, body := e.call(t, "PUT", "/v1/reservations/"+put, bearer, `{"identity":"alice"}`); code != 200 || strings.TrimSpace(body) != `{"name":"zzz.example.test","identity":"alice"}` {
				t.Fatalf("PUT %s: %d %s", put, code, body)
			}
			if code, body := e.call(t, "PUT", "/v1/reservations/"+put, bearer, `{"identity":"bob"}`); code != 409 || !strings.Contains(body, `"name":"zzz.example.test"`) {
				t.Fatalf("PUT %s for bob: %d %s, want 409 with the stored name", put, code, body)
			}
			if _, body := e.call(t, "GET", "/v1/reservations", bearer, ""); strings.TrimSpace(body) != `{"reservations":[{"name":"zzz.example.test","identity":"alice"}]}` {
				t.Fatalf("GET after PUT %s: %s", put, body)
			}
			if code, body := e.call(t, "DELETE", "/v1/reservations/"+del, bearer, ""); code != 200 || strings.TrimSpace(body) != `{"name":"zzz.example.test"}` {
				t.Fatalf("PUT %s, DELETE %s: %d %s", put, del, code, body)
			}
			if code, body := e.call(t, "DELETE", "/v1/reservations/"+del, bearer, ""); code != 404 || !strings.Contains(body, `"name":"zzz.example.test"`) {
				t.Fatalf("DELETE %s again: %d %s, want 404 with the stored name", del, code, body)
			}
		}
	}
}

// Public suffixes are no customer's domain; names under them are.
// Identities of spaces, control characters or too many bytes are refused.
func TestReservationRefusals(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	for _, c := range []struct {
		name, body string
		code       int
		want       string
	}{
		{"co.uk", `{"identity":"alice"}`, 400, "public suffix"},
		{"github.io", `{"identity":"alice"}`, 400, "public suffix"},
		{"shop.co.uk", `{"identity":"alice"}`, 200, `"name":"shop.co.uk"`},
		{"x", `{"identity":"al ice\n\u0000"}`, 400, "invalid identity"},
		{"x", `{"identity":"` + strings.Repeat("a", 60000) + `"}`, 400, "60000 bytes"},
		{"x", `{"identity":"a\u202eb"}`, 400, "invalid identity"},
	} {
		code, body := e.call(t, "PUT", "/v1/reservations/"+c.name, bearer, c.body)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("PUT %s %.40s: %d %.300s, want %d with %q", c.name, c.body, code, body, c.code, c.want)
		}
	}
	if _, body := e.call(t, "GET", "/v1/reservations", bearer, ""); strings.TrimSpace(body) != `{"reservations":[{"name":"shop.co.uk","identity":"alice"}]}` {
		t.Errorf("GET: %s", body)
	}
}

// A reservation for an identity that KnownIdentity does not know is made,
// with a warning, in PUT's answer and in the list.
func TestReservationWarning(t *testing.T) {
	t.Parallel()
	e := startEdgeWith(t, nil, func(a *API) { a.KnownIdentity = func(id string) bool { return id == "alice" } })
	if _, body := e.call(t, "PUT", "/v1/reservations/a", bearer, `{"identity":"alice"}`); strings.Contains(body, "warning") {
		t.Errorf("a known identity: %s", body)
	}
	code, body := e.call(t, "PUT", "/v1/reservations/b", bearer, `{"identity":"bob"}`)
	if code != 200 || !strings.Contains(body, `"warning":"no token of this edge names the identity \"bob\"`) {
		t.Errorf("an unknown identity: %d %s", code, body)
	}
	if _, body := e.call(t, "GET", "/v1/reservations", bearer, ""); strings.Count(body, "warning") != 1 || !strings.Contains(body, "b.example.test until one does") {
		t.Errorf("GET: %s", body)
	}
}

// Without a token, /v1/ is off and says how to turn it on; /healthz
// answers.
func TestNoToken(t *testing.T) {
	t.Parallel()
	e := startEdge(t)
	hs := httptest.NewServer(&API{Server: e.srv})
	defer hs.Close()
	e.url = hs.URL
	if code, body := e.call(t, "GET", "/v1/sessions", "Bearer ", ""); code != 404 || !strings.Contains(body, "-admin-token-file") {
		t.Errorf("/v1/ without a token configured: %d %s", code, body)
	}
	if code, _ := e.call(t, "GET", "/healthz", "", ""); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
}

// LoadToken takes the first line of a file only its owner may read, of
// 16 bytes at least.
func TestLoadToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got, err := LoadToken(write("ok", token+"\nignored\n", 0o600)); err != nil || got != sha256.Sum256([]byte(token)) {
		t.Errorf("a good file: %v", err)
	}
	if _, err := LoadToken(write("ro", "  "+token+"  \n", 0o400)); err != nil {
		t.Errorf("a read-only file of its owner: %v", err)
	}
	for name, c := range map[string]struct {
		content string
		mode    os.FileMode
		want    string
	}{
		"world": {token, 0o644, "chmod 600"},
		"group": {token, 0o640, "chmod 600"},
		"write": {token, 0o602, "chmod 600"},
		"short": {"0123456789", 0o600, "at least 16 bytes"},
		"empty": {"", 0o600, "at least 16 bytes"},
		"blank": {"\n" + token, 0o600, "at least 16 bytes"},
	} {
		if _, err := LoadToken(write(name, c.content, c.mode)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	if _, err := LoadToken(dir); err == nil {
		t.Error("a directory: no error")
	}
	if _, err := LoadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file: no error")
	}
}

// FuzzAPI sends the API requests of any method, path, Authorization and
// body: it never panics, and without the token nothing under /v1/ answers
// anything but 401 (or 404 outside it), nor changes anything.
func FuzzAPI(f *testing.F) {
	for _, ep := range endpoints {
		f.Add(ep.method, ep.path, "", ep.body)
		f.Add(ep.method, ep.path, bearer, ep.body)
	}
	f.Add("PUT", "/v1/reservations/%2e%2e", bearer, `{"identity":"`+strings.Repeat("a", 1000)+`"}`)
	f.Add("POST", "/v1/identities/%00/disconnect", bearer, "")
	f.Add("GET", "/v1/../healthz", "", "")
	f.Add("GET", "/v1//sessions", bearer, "")
	srv := &edge.Server{Domain: "example.test"}
	defer srv.Close()
	var drains atomic.Int32
	api := &API{Server: srv, Token: sha256.Sum256([]byte(token)), Drain: func() { drains.Add(1) }}
	f.Fuzz(func(t *testing.T, method, path, auth, body string) {
		req, err := http.NewRequest(method, "http://admin"+path, strings.NewReader(body))
		if err != nil || req.URL.Path != path && req.URL.RawPath != path {
			return // not a request a client could send
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		before := drains.Load()
		w := httptest.NewRecorder()
		api.ServeHTTP(w, req)
		scheme, tok, ok := strings.Cut(req.Header.Get("Authorization"), " ")
		authorized := ok && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(tok) == token
		if !authorized && strings.HasPrefix(req.URL.Path, "/v1/") {
			if w.Code != http.StatusUnauthorized {
				t.Fatalf("%s %q with Authorization %q: %d, want 401", method, path, auth, w.Code)
			}
			if drains.Load() != before {
				t.Fatalf("%s %q with Authorization %q drained the edge", method, path, auth)
			}
		}
		if w.Code >= 500 && w.Code != http.StatusNotImplemented && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %q: %d %s", method, path, w.Code, w.Body)
		}
	})
}
