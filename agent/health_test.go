package agent_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
)

// HTTPCheckHost sends its Host, for an app that answers only to its own
// name; HTTPCheck the URL's host and port.
func TestHTTPCheckHost(t *testing.T) {
	addr := testnet.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "app.internal" {
			w.WriteHeader(http.StatusMisdirectedRequest)
		}
	}), false)
	ctx := context.Background()
	if err := agent.HTTPCheckHost(nil, "http://"+addr+"/healthz", "app.internal")(ctx); err != nil {
		t.Errorf("HTTPCheckHost with the app's name: %v", err)
	}
	if err := agent.HTTPCheck(nil, "http://"+addr+"/healthz")(ctx); err == nil {
		t.Error("HTTPCheck, with the app's address as Host: healthy; want the app's 421")
	}
}
