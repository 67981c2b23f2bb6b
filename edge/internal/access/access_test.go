package access_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tunnelkit/tunnelkit/edge/internal/access"
)

// TestWriter: what a Writer keeps of responses that a real server sends.
func TestWriter(t *testing.T) {
	for _, c := range []struct {
		name   string
		handle func(w http.ResponseWriter)
		status int // the Writer's
		out    int64
		got    int // the client's
	}{
		{"nothing written", func(w http.ResponseWriter) {}, 0, 0, 200},
		{"a body alone", func(w http.ResponseWriter) { io.WriteString(w, "hello") }, 200, 5, 200},
		{"an informational status first", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "gone")
		}, 404, 4, 404},
		{"a second status", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusBadGateway)
			w.WriteHeader(http.StatusOK)
		}, 502, 0, 502},
		{"flushed through a ResponseController", func(w http.ResponseWriter) {
			io.WriteString(w, "a")
			if err := http.NewResponseController(w).Flush(); err != nil {
				panic(err)
			}
		}, 200, 1, 200},
		{"upgraded", func(w http.ResponseWriter) { w.(*access.Writer).Upgraded() }, 101, 0, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			kept := make(chan *access.Writer, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				a := access.NewWriter(w)
				c.handle(a)
				kept <- a
			}))
			defer srv.Close()
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			a := <-kept
			if resp.StatusCode != c.got || a.Status != c.status || a.Out.Load() != c.out || a.Start.IsZero() {
				t.Errorf("the client got %d; status %d, out %d, start %v; want %d; %d, %d, set", resp.StatusCode, a.Status, a.Out.Load(), a.Start, c.got, c.status, c.out)
			}
		})
	}
}
