package main

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// hello names its client: behind an agent's -to, the hop the edge added
// last to X-Forwarded-For, not the agent's socket; reached through the
// tunnel itself, the address the tunnel reports.
func TestHandlerNamesTheClient(t *testing.T) {
	for _, c := range []struct {
		remote string
		xff    []string
		want   string
	}{
		{"127.0.0.1:51742", []string{"203.0.113.7"}, "You are 203.0.113.7, asking for app.example.test/x\n"},
		{"127.0.0.1:51742", []string{"198.51.100.1, 203.0.113.7"}, "You are 203.0.113.7, "},
		{"127.0.0.1:51742", []string{"198.51.100.1", "203.0.113.7"}, "You are 203.0.113.7, "},
		{"203.0.113.9:443", nil, "You are 203.0.113.9, "},
	} {
		r := httptest.NewRequest("GET", "http://app.example.test/x", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		w := httptest.NewRecorder()
		Handler().ServeHTTP(w, r)
		if !strings.Contains(w.Body.String(), c.want) {
			t.Errorf("remote %s, X-Forwarded-For %q: %q, want %q", c.remote, c.xff, w.Body.String(), c.want)
		}
	}
}
