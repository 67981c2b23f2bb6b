package inspect_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/tunnelkit/tunnelkit/agent/inspect"
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
	page := startChromium(t, in.ui)

	// The page is up, its event stream open.
	page.waitFor(t, `document.body.dataset.live === '1' && document.getElementById('empty').hidden === false`, 10*time.Second)
	page.eval(t, `window.tunnelkitTestMark = 'not reloaded'`)

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
	page.waitFor(t, `(() => { const r = document.querySelector('#list .row[data-id="1"]'); return r && r.textContent.includes('/api/orders?notify=email'); })()`, time.Second)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the request appeared on the page %v after it was sent; want within 1 s", d)
	} else {
		t.Logf("the request appeared on the page %v after it was sent", d.Round(time.Millisecond))
	}
	if got := page.eval(t, `window.tunnelkitTestMark + ' ' + performance.getEntriesByType('navigation').length`); got != `"not reloaded 1"` {
		t.Errorf("the page reloaded: %s", got)
	}
	page.waitFor(t, `document.querySelector('#list .row[data-id="1"][data-done="1"] .status.s2')`, 5*time.Second)

	// Its details, JSON bodies by default; Hex shows a dump.
	page.click(t, `#list .row[data-id="1"]`)
	page.waitFor(t, `document.querySelector('#detail[data-id="1"] [data-side="response"] [data-mode="json"] .j-key')`, 5*time.Second)
	if txt := page.eval(t, `document.getElementById('d-panels').textContent`); !strings.Contains(txt, "Ada Lovelace") || !strings.Contains(txt, "Bearer eyJhbGciOiJIUzI1NiJ9.demo") {
		t.Errorf("details: %s", txt)
	}
	page.click(t, `#detail [data-side="response"] .seg button[data-mode="hex"]`)
	page.waitFor(t, `(() => { const p = document.querySelector('#detail [data-side="response"] pre.body.hex'); return p && p.textContent.startsWith('00000000  7b 22 69 64'); })()`, 5*time.Second)
	page.click(t, `#detail [data-side="response"] .seg button[data-mode="json"]`)

	// Replay: the app gets the request again, the page shows the replay.
	page.click(t, `#replay`)
	select {
	case again := <-seen:
		if again != orig {
			t.Errorf("the replay reached the app as %+v, want %+v", again, orig)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not get the replay")
	}
	page.waitFor(t, `document.querySelector('#list .row[data-id="2"][data-replay-of="1"][data-done="1"]') && document.querySelector('#detail[data-id="2"]')`, 5*time.Second)
	if txt := page.eval(t, `document.getElementById('d-meta').textContent`); !strings.Contains(txt, "replay of #1") || !strings.Contains(txt, "201 Created") {
		t.Errorf("replay's details: %s", txt)
	}

	// Edit and replay.
	page.click(t, `#list .row[data-id="1"]`)
	page.waitFor(t, `document.querySelector('#detail[data-id="1"]')`, 5*time.Second)
	page.click(t, `#edit`)
	page.waitFor(t, `!document.getElementById('edit-card').hidden && document.getElementById('edit-url').value === '/api/orders?notify=email'`, 5*time.Second)
	page.eval(t, `(() => {
		const set = (id, v) => { const e = document.getElementById(id); e.value = v; e.dispatchEvent(new Event('input')); };
		set('edit-method', 'PATCH');
		set('edit-url', '/api/orders/1042?notify=none');
		set('edit-headers', document.getElementById('edit-headers').value.replace('X-Custom: from the client', 'X-Custom: edited'));
		set('edit-body', '{"status":"shipped"}');
	})()`)
	page.click(t, `#edit-send`)
	select {
	case got := <-seen:
		want := seenRequest{"PATCH", "/api/orders/1042?notify=none", "shop.example.test", "edited", "203.0.113.7", `{"status":"shipped"}`}
		if got != want {
			t.Errorf("the edited replay reached the app as %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the app did not get the edited replay")
	}
	page.waitFor(t, `(() => { const r = document.querySelector('#list .row[data-id="3"][data-replay-of="1"][data-done="1"]'); return r && r.textContent.startsWith('PATCH'); })()`, 5*time.Second)
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
	page.waitFor(t, `['s2', 's3', 's4', 's4', 's5'].every((s, i) => document.querySelector('#list .row[data-id="' + (4 + i) + '"][data-done="1"] .status.' + s))`, 5*time.Second)
	if got := page.eval(t, `[...document.querySelectorAll('#list .row')].map(r => r.dataset.id).join(',')`); got != `"8,7,6,5,4,3,2,1"` {
		t.Errorf("rows %s, want newest first", got)
	}

	page.click(t, `#list .row[data-id="1"]`)
	page.waitFor(t, `document.querySelector('#detail[data-id="1"] [data-side="response"] [data-mode="json"] .j-key')`, 5*time.Second)
	// No flash of new rows, no toast.
	page.eval(t, `document.querySelectorAll('.fresh').forEach((r) => r.classList.remove('fresh')); document.getElementById('toast').remove()`)
	png := page.screenshot(t)
	// And in the dark.
	page.call(t, "Emulation.setEmulatedMedia", map[string]any{"features": []map[string]string{{"name": "prefers-color-scheme", "value": "dark"}}})
	dark := page.screenshot(t)
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
	if errs := page.eval(t, `JSON.stringify(window.tunnelkitTestErrors || [])`); errs != `"[]"` {
		t.Errorf("page errors: %s", errs)
	}
}

var devtoolsListening = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

// lineWriter keeps what is written, and calls line with each line.
type lineWriter struct {
	testtools.Buffer
	mu      sync.Mutex
	partial []byte
	line    func(string)
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.Buffer.Write(b)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.line(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
}

// devtools is a client of Chromium's DevTools protocol, over a WebSocket
// to one target.
type devtools struct {
	ws     *websocket.Conn
	mu     sync.Mutex
	nextID int64
	calls  map[int64]chan cdpMessage
	events chan cdpMessage
	done   chan struct{} // the reader ended
}

type cdpMessage struct {
	ID     int64           `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// devtoolsOrigin is the Origin of the test's WebSockets, which Chromium
// is told to allow.
const devtoolsOrigin = "http://127.0.0.1"

func dialDevtools(t testing.TB, wsURL string) *devtools {
	t.Helper()
	cfg, err := websocket.NewConfig(wsURL, devtoolsOrigin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := cfg.DialContext(ctx)
	if err != nil {
		t.Fatalf("DevTools %s: %v", wsURL, err)
	}
	ws.MaxPayloadBytes = 64 << 20
	d := &devtools{ws: ws, calls: map[int64]chan cdpMessage{}, events: make(chan cdpMessage, 1000), done: make(chan struct{})}
	go d.read()
	t.Cleanup(func() { ws.Close(); <-d.done })
	return d
}

// read hands responses to their calls and queues events.
func (d *devtools) read() {
	defer close(d.done)
	for {
		var m cdpMessage
		if err := websocket.JSON.Receive(d.ws, &m); err != nil {
			return
		}
		if m.ID == 0 {
			select {
			case d.events <- m:
			default:
			}
			continue
		}
		d.mu.Lock()
		ch := d.calls[m.ID]
		delete(d.calls, m.ID)
		d.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

// call sends a command and returns its result.
func (d *devtools) call(t testing.TB, method string, params any) json.RawMessage {
	t.Helper()
	d.mu.Lock()
	d.nextID++
	id := d.nextID
	ch := make(chan cdpMessage, 1)
	d.calls[id] = ch
	d.mu.Unlock()
	if params == nil {
		params = struct{}{}
	}
	if err := websocket.JSON.Send(d.ws, map[string]any{"id": id, "method": method, "params": params}); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			t.Fatalf("%s: %s", method, m.Error.Message)
		}
		return m.Result
	case <-d.done:
		t.Fatalf("%s: DevTools connection closed", method)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer in 30 s", method)
	}
	return nil
}

// waitEvent waits for the event method.
func (d *devtools) waitEvent(t testing.TB, method string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m := <-d.events:
			if m.Method == method {
				return
			}
		case <-deadline:
			t.Fatalf("no %s within %v", method, timeout)
		}
	}
}

// eval evaluates expr in the page, awaiting a promise, and returns its
// value as JSON.
func (d *devtools) eval(t testing.TB, expr string) string {
	t.Helper()
	res := d.call(t, "Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true})
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		t.Fatal(err)
	}
	if e := r.ExceptionDetails; e != nil {
		t.Fatalf("evaluating %s: %s %s", expr, e.Text, e.Exception.Description)
	}
	return string(r.Result.Value)
}

// waitFor waits, in the page, until cond (a JavaScript expression) is
// true, checking it at each change of the DOM.
func (d *devtools) waitFor(t testing.TB, cond string, timeout time.Duration) {
	t.Helper()
	js := fmt.Sprintf(`new Promise((resolve) => {
		let obs, timer;
		const finish = (v) => { if (obs) obs.disconnect(); clearTimeout(timer); resolve(v); };
		const check = () => { try { if (%s) { finish(true); return true; } } catch (e) {} return false; };
		if (check()) return;
		obs = new MutationObserver(check);
		obs.observe(document, { subtree: true, childList: true, attributes: true, characterData: true });
		timer = setTimeout(() => finish(false), %d);
	})`, cond, timeout.Milliseconds())
	if got := d.eval(t, js); got != "true" {
		t.Fatalf("not within %v: %s\nDOM: %s", timeout, cond, d.eval(t, `document.getElementById('list').innerHTML.slice(0, 4000)`))
	}
}

// click clicks the middle of the element that selector finds, as a
// mouse would.
func (d *devtools) click(t testing.TB, selector string) {
	t.Helper()
	sel, _ := json.Marshal(selector)
	var at *struct{ X, Y float64 }
	if err := json.Unmarshal([]byte(d.eval(t, fmt.Sprintf(`(() => {
		const e = document.querySelector(%s);
		if (!e) return null;
		e.scrollIntoView({ block: 'center' });
		const r = e.getBoundingClientRect();
		return { X: r.left + r.width / 2, Y: r.top + r.height / 2 };
	})()`, sel))), &at); err != nil || at == nil {
		t.Fatalf("click: no %s (%v)", selector, err)
	}
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		d.call(t, "Input.dispatchMouseEvent", map[string]any{"type": typ, "x": at.X, "y": at.Y, "button": "left", "clickCount": 1})
	}
}

func (d *devtools) screenshot(t testing.TB) []byte {
	t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	json.Unmarshal(d.call(t, "Page.captureScreenshot", map[string]any{"format": "png"}), &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil || len(png) == 0 {
		t.Fatalf("screenshot: %v", err)
	}
	return png
}

// startChromium runs headless Chromium, opens url in it, and returns the
// page's DevTools once the page has loaded. Page errors are collected in
// window.tunnelkitTestErrors. The test's end closes the browser.
func startChromium(t testing.TB, url string) *devtools {
	t.Helper()
	cmd := exec.Command("chromium",
		"--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
		"--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio", "--hide-scrollbars",
		"--user-data-dir="+t.TempDir(),
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--remote-allow-origins="+devtoolsOrigin,
		"--window-size=1280,900",
		"about:blank")
	browserURL := make(chan string, 1)
	log := &lineWriter{line: func(l string) {
		if m := devtoolsListening.FindStringSubmatch(l); m != nil {
			select {
			case browserURL <- m[1]:
			default:
			}
		}
	}}
	cmd.Stderr = log
	// Wait need not wait for the output of children that outlive the
	// browser.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("Chromium did not exit after Browser.close; killing it\n%s", log.String())
			cmd.Process.Kill()
			<-exited
		}
	})

	var wsURL string
	select {
	case wsURL = <-browserURL:
	case <-exited:
		t.Fatalf("Chromium exited: %v\n%s", waitErr, log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("Chromium did not start its DevTools server:\n%s", log.String())
	}
	browser := dialDevtools(t, wsURL)
	// Before the test's end closes the browser's DevTools connection.
	t.Cleanup(func() {
		websocket.JSON.Send(browser.ws, map[string]any{"id": 1 << 30, "method": "Browser.close"})
	})

	// The page target, the tab Chromium opened, at the same server.
	var r struct {
		TargetInfos []struct {
			TargetID string `json:"targetId"`
			Type     string `json:"type"`
		} `json:"targetInfos"`
	}
	json.Unmarshal(browser.call(t, "Target.getTargets", nil), &r)
	var pageURL string
	for _, ti := range r.TargetInfos {
		if ti.Type == "page" {
			pageURL = wsURL[:strings.Index(wsURL, "/devtools/")] + "/devtools/page/" + ti.TargetID
			break
		}
	}
	if pageURL == "" {
		t.Fatalf("no page in Chromium: %+v", r)
	}
	page := dialDevtools(t, pageURL)
	page.call(t, "Page.enable", nil)
	page.call(t, "Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": `
		window.tunnelkitTestErrors = [];
		window.addEventListener('error', (e) => window.tunnelkitTestErrors.push(String(e.message)));
		window.addEventListener('unhandledrejection', (e) => window.tunnelkitTestErrors.push(String(e.reason)));
		document.addEventListener('securitypolicyviolation', (e) => window.tunnelkitTestErrors.push('CSP: ' + e.violatedDirective));
	`})
	page.call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false})
	page.call(t, "Page.navigate", map[string]any{"url": url})
	page.waitEvent(t, "Page.loadEventFired", 30*time.Second)
	return page
}
