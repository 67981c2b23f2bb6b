package agentcmd

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// hostForwarder sends each request to the app with the Host of its rule,
// the client's left in X-Forwarded-Host, the rest as it came; an app that
// cannot be reached gets the client a 502 app_unreachable.
func TestHostForwarder(t *testing.T) {
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s xfh=%s xff=%s path=%s query=%s", r.Host, r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-For"), r.URL.Path, r.URL.RawQuery)
	})}
	go app.Serve(appLn)
	defer app.Close()
	to := target{network: "tcp", addr: appLn.Addr().String()}

	for rule, want := range map[string]string{"rewrite": appLn.Addr().String(), "app.local": "app.local"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- hostForwarder{to: to, host: to.hostHeader(rule), logger: slog.New(slog.DiscardHandler)}.Serve(ln)
		}()
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/a/b?x=1;y", nil)
		req.Host = "abc.example.test"
		req.Header.Set("X-Forwarded-Host", "abc.example.test")
		req.Header.Set("X-Forwarded-For", "203.0.113.7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if w := "host=" + want + " xfh=abc.example.test xff=203.0.113.7 path=/a/b query=x=1;y"; string(b) != w {
			t.Errorf("rule %q: the app saw %q, want %q", rule, b, w)
		}
		ln.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}

	// An app that is not there.
	gone, _ := net.Listen("tcp", "127.0.0.1:0")
	goneAddr := gone.Addr().String()
	gone.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	var log testtools.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	go hostForwarder{to: target{network: "tcp", addr: goneAddr}, host: "x", logger: logger}.Serve(ln)
	resp, err := http.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	id := resp.Header.Get("Tunnelkit-Request-Id")
	if want := "app_unreachable: the app behind the tunnel cannot be reached\nrequest id: " + id + "\n"; resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Tunnelkit-Error") != "app_unreachable" || id == "" || string(b) != want {
		t.Errorf("an app that is not there: %d %q; want 502 %q", resp.StatusCode, b, want)
	}
	// The warning, written before the answer, has the detail under the
	// answer's request ID.
	if !strings.Contains(log.String(), "request_id="+id) || !strings.Contains(log.String(), "dial tcp "+goneAddr) {
		t.Errorf("log:\n%s\nwant request_id=%s with the dial's error", log.String(), id)
	}
}
