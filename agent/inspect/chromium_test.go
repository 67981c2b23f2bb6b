package inspect_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/internal/testchrome"
	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// TestInspectorChromium opens the inspector's page in headless Chromium,
// driven over the DevTools protocol, and then sends a request through the
// forwarder: the page shows it within a second, without reloading (the
// events); a click on Replay, and then on Edit and replay, makes the app
// get the request again, and the page shows the replays. It saves a
// screenshot, and one in dark mode, in the test's temporary directory,
// and copies them to the file that TUNNELKIT_INSPECTOR_SCREENSHOT names,
// if set (and to its name with -dark).
func TestInspectorChromium(t *testing.T) {
	testtools.Need(t, "chromium")
	var count atomic.Int64
	seen := make(chan seenRequest, 100)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasPrefix(r.URL.Path, "/api/orders") {
			count.Add(1)
			seen <- seenRequest{r.Method, r.RequestURI, r.Host, r.Header.Get("X-Custom"), r.Header.Get("X-Forwarded-For"), string(body)}
		}
		h := w.Header()
		switch r.URL.Path {
		case "/api/orders":
			h.Set("Content-Type", "application/json")
			h.Set("Location", "/api/orders/1042")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, `{"id":1042,"status":"confirmed","customer":{"name":"Ada Lovelace","email":"ada@example.com"},"items":[{"sku":"TK-001","qty":2,"price":19.5},{"sku":"TK-007","qty":1,"price":42}],"total":81,"paid":true,"coupon":null}`)
		case "/login":
			h.Set("Content-Type", "application/json")
			h.Set("WWW-Authenticate", `Bearer realm="app"`)
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"invalid_token"}`)
		case "/old":
			http.Redirect(w, r, "/new", http.StatusMovedPermanently)
		case "/boom":
			http.Error(w, "database is locked", http.StatusInternalServerError)
		case "/":
			h.Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, "<!doctype html><title>My app</title><h1>Hello from the app</h1>\n")
		default:
			if strings.HasPrefix(r.URL.Path, "/api/orders/") {
				h.Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"updated":true,"method":%q}`, r.Method)
				return
			}
			http.NotFound(w, r)
		}
	})
	in := startInspected(t, app, new(inspect.Inspector), false)
	page := testchrome.Start(t, in.ui)
	page.Dump = `document.getElementById('list').innerHTML.slice(0, 4000)`

	// The page is up, its event stream open.
	page.WaitFor(t, `document.body.dataset.live === '1' && document.getElementById('empty').hidden === false`, 10*time.Second)
	page.Eval(t, `window.tunnelkitTestMark = 'not reloaded'`)

	// A request through the tunnel, once the page is open.
	c := client(t, in.fwd, false)
	start := time.Now()
	req, _ := http.NewRequest("POST", "http://shop.example.test/api/orders?notify=email", strings.NewReader(`{"customer":"ada@example.com","items":[{"sku":"TK-001","qty":2},{"sku":"TK-007","qty":1}],"coupon":null}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Authorization", "Bearer eyJhbGciOiJIUzI1NiJ9.demo")
	req.Header.Set("X-Custom", "from the client")
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("User-Agent", "curl/8.5.0")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	orig := <-seen
	page.WaitFor(t, `(() => { const r = document.querySelector('#list .row[data-id="1"]'); return r && r.textContent.includes('/api/orders?notify=email'); })()`, time.Second)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the request appeared on the page %v after it was sent; want within 1 s", d)
	} else {
		t.Logf("the request appeared on the page %v after it was sent", d.Round(time.Millisecond))
	}
	if got := page.Eval(t, `window.tunnelkitTestMark + ' ' + performance.getEntriesByType('navigation').length`); got != `"not reloaded 1"` {
		t.Errorf("the page reloaded: %s", got)
	}
	page.WaitFor(t, `document.querySelector('#list .row[data-id="1"][data-done="1"] .status.s2')`, 5*time.Second)

	// Its details, JSON bodies by default; Hex shows a dump.
	page.Click(t, `#list .row[data-id="1"]`)
	page.WaitFor(t, `document.querySelector('#detail[data-id="1"] [data-side="response"] [data-mode="json"] .j-key')`, 5*time.Second)
	if txt := page.Eval(t, `document.getElementById('d-panels').textContent`); !strings.Contains(txt, "Ada Lovelace") || !strings.Contains(txt, "Bearer eyJhbGciOiJIUzI1NiJ9.demo") {
		t.Errorf("details: %s", txt)
	}
	page.Click(t, `#detail [data-side="response"] .seg button[data-mode="hex"]`)
	page.WaitFor(t, `(() => { const p = document.querySelector('#detail [data-side="response"] pre.body.hex'); return p && p.textContent.startsWith('00000000  7b 22 69 64'); })()`, 5*time.Second)
	page.Click(t, `#detail [data-side="response"] .seg button[data-mode="json"]`)

	// Replay: the app gets the request again, the page shows the replay.
	page.Click(t, `#replay`)
	select {
	case again := <-seen:
		if again != orig {
			t.Errorf("the replay reached the app as %+v, want %+v", again, orig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not get the replay")
	}
	page.WaitFor(t, `document.querySelector('#list .row[data-id="2"][data-replay-of="1"][data-done="1"]') && document.querySelector('#detail[data-id="2"]')`, 5*time.Second)
	if txt := page.Eval(t, `document.getElementById('d-meta').textContent`); !strings.Contains(txt, "replay of #1") || !strings.Contains(txt, "201 Created") {
		t.Errorf("replay's details: %s", txt)
	}

	// Edit and replay.
	page.Click(t, `#list .row[data-id="1"]`)
	page.WaitFor(t, `document.querySelector('#detail[data-id="1"]')`, 5*time.Second)
	page.Click(t, `#edit`)
	page.WaitFor(t, `!document.getElementById('edit-card').hidden && document.getElementById('edit-url').value === '/api/orders?notify=email'`, 5*time.Second)
	page.Eval(t, `(() => {
		const set = (id, v) => { const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('input')); };
		set('edit-method', 'PATCH');
		set('edit-url', '/api/orders/1042?notify=none');
		set('edit-headers', document.getElementById('edit-headers').value.replace('X-Custom: from the client', 'X-Custom: edited'));
		set('edit-body', '{"status":"shipped"}');
	})()`)
	page.Click(t, `#edit-send`)
	select {
	case got := <-seen:
		want := seenRequest{"PATCH", "/api/orders/1042?notify=none", "shop.example.test", "edited", "203.0.113.7", `{"status":"shipped"}`}
		if got != want {
			t.Errorf("the edited replay reached the app as %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not get the edited replay")
	}
	page.WaitFor(t, `(() => { const r = document.querySelector('#list .row[data-id="3"][data-replay-of="1"][data-done="1"]'); return r && r.textContent.startsWith('PATCH'); })()`, 5*time.Second)
	if n := count.Load(); n != 3 {
		t.Errorf("the app got %d requests, want 3", n)
	}

	// More traffic, for the list's colours and the screenshot.
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, p := range []string{"/", "/old", "/login", "/missing.png", "/boom"} {
		resp, err := c.Get("http://shop.example.test" + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	page.WaitFor(t, `['s2', 's3', 's4', 's4', 's5'].every((s, i) => document.querySelector('#list .row[data-id="' + (4 + i) + '"][data-done="1"] .status.' + s))`, 5*time.Second)
	if got := page.Eval(t, `[...document.querySelectorAll('#list .row')].map(r => r.dataset.id).join(',')`); got != `"8,7,6,5,4,3,2,1"` {
		t.Errorf("rows %s, want newest first", got)
	}

	page.Click(t, `#list .row[data-id="1"]`)
	page.WaitFor(t, `document.querySelector('#detail[data-id="1"] [data-side="response"] [data-mode="json"] .j-key')`, 5*time.Second)
	// No flash of new rows, no toast.
	page.Eval(t, `document.querySelectorAll('.fresh').forEach((r) => r.classList.remove('fresh')); document.getElementById('toast').remove()`)
	png := page.Screenshot(t)
	// And in the dark.
	page.Call(t, "Emulation.setEmulatedMedia", map[string]any{"features": []map[string]string{{"name": "prefers-color-scheme", "value": "dark"}}})
	dark := page.Screenshot(t)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"inspector.png": png, "inspector-dark.png": dark} {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", file, len(b))
	}
	if copyTo := os.Getenv("TUNNELKIT_INSPECTOR_SCREENSHOT"); copyTo != "" {
		if err := os.WriteFile(copyTo, png, 0o644); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(strings.TrimSuffix(copyTo, ".png")+"-dark.png", dark, 0o644); err != nil {
			t.Error(err)
		}
	}
	if errs := page.Eval(t, `JSON.stringify(window.tunnelkitTestErrors || [])`); errs != `"[]"` {
		t.Errorf("page errors: %s", errs)
	}
}
