package metrics_test

import (
	"net/http"
	"os"
	"testing"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// TestMain fails the run when goroutines outlive the tests: every edge,
// agent, app and metrics server a test starts must be closed and waited
// for by its cleanup.
func TestMain(m *testing.M) {
	// The scrapes' connections are idle, not leaked.
	os.Exit(testwait.Main(m, http.DefaultClient.CloseIdleConnections))
}
