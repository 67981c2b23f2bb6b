// Package benchload sends HTTP load for benchmarks: a number of GET
// requests from concurrent keep-alive clients, every response checked.
package benchload

import (
	"bytes"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Target is a URL to load, the client whose connections reach it, and the
// body every response must have.
type Target struct {
	URL    string
	Client *http.Client
	Body   string
}

// Load sends n GET requests to t from workers concurrent clients and
// returns the time they took. Each response must be 200 with t.Body;
// otherwise tb fails.
func Load(tb testing.TB, t Target, n, workers int) time.Duration {
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			var body bytes.Buffer
			for next.Add(1) <= int64(n) && !failed.Load() {
				if err := t.get(&body); err != nil {
					if !failed.Swap(true) {
						tb.Error(err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	if failed.Load() {
		tb.FailNow()
	}
	return d
}

func (t Target) get(body *bytes.Buffer) error {
	resp, err := t.Client.Get(t.URL)
	if err != nil {
		return err
	}
	body.Reset()
	_, err = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("GET %s: body: %w", t.URL, err)
	}
	if resp.StatusCode != http.StatusOK || body.String() != t.Body {
		return fmt.Errorf("GET %s: %d %q, want 200 %q", t.URL, resp.StatusCode, body.Bytes(), t.Body)
	}
	return nil
}
