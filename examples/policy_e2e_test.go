package examples_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestOperatorPolicyWithTheBinaries runs the edge with -policy, the
// operator's policy on every endpoint, and an agent that declares basic
// auth: a request without credentials is refused by the edge; one with
// them reaches the app with the operator's header and the user the edge
// vouches for.
func TestOperatorPolicyWithTheBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	bin := build(t, "tunnelkit")
	file := filepath.Join(t.TempDir(), "operator.json")
	if err := os.WriteFile(file, []byte(`{"cidr_deny":["192.0.2.0/24"],"request_headers":{"add":["X-Operator: yes"]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	agents, pub := freePort(t), freePort(t)
	start(t, filepath.Join(bin, "tunnelkit"), "edge", "-agents", agents, "-http", pub, "-domain", "example.test", "-policy", file, "-policy-kinds", "basic_auth,rate_limit")
	waitListening(t, agents)
	waitListening(t, pub)

	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "operator=%s user=%s", r.Header.Get("X-Operator"), r.Header.Get("Tunnelkit-Auth-User"))
	})}
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go app.Serve(appLn)
	t.Cleanup(func() { app.Close() })
	url := readURL(t, start(t, filepath.Join(bin, "tunnelkit"), "agent", "-edge", agents, "-url", "http://guarded.example.test", "-to", appLn.Addr().String(), "-basic-auth", "ann:s3cret"))

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, pub)
		},
	}}
	resp, err := client.Get(url + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("Tunnelkit-Error") != "unauthorized" {
		t.Fatalf("without credentials: %d %q; want the edge's 401 unauthorized", resp.StatusCode, resp.Header.Get("Tunnelkit-Error"))
	}
	req, _ := http.NewRequest("GET", url+"/", nil)
	req.SetBasicAuth("ann", "s3cret")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "operator=yes user=ann"; resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("with credentials: %d %q; want %q", resp.StatusCode, body, want)
	}
}
