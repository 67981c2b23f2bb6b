package metrics_test

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the run when goroutines outlive the tests: every edge,
// agent, app and metrics server a test starts must be closed and waited
// for by its cleanup.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	http.DefaultClient.CloseIdleConnections() // the scrapes' connections
	deadline := time.Now().Add(5 * time.Second)
	for code == 0 && runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			fmt.Fprintf(os.Stderr, "%d goroutines outlived the tests (%d before):\n%s\n", runtime.NumGoroutine()-before, before, buf[:runtime.Stack(buf, true)])
			code = 1
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	os.Exit(code)
}
