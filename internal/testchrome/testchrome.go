// Package testchrome runs headless Chromium for tests and drives one page
// of it over the DevTools protocol: evaluate script, wait for a condition
// at each change of the DOM or at each page load, click as a mouse does,
// take screenshots. It is for tests only (it fails the test on any error)
// and is shared by the tests that need a real browser, in this module and
// in the nested ones (policy/oidc).
//
// Typical use:
//
//	testtools.Need(t, "chromium")
//	page := testchrome.Start(t, url, "--ignore-certificate-errors")
//	page.WaitFor(t, `document.querySelector('#ready')`, 10*time.Second)
//	page.Click(t, `#submit`)
//
// The test's end closes the browser and waits for it to exit.
package testchrome

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

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

// Page is a client of Chromium's DevTools protocol, over a WebSocket to
// one target: the browser, or a page of it. Its methods may be called from
// one goroutine at a time.
type Page struct {
	// Dump is a JavaScript expression whose value WaitFor's failure
	// message shows. Empty: the start of the document's HTML.
	Dump string

	ws     *websocket.Conn
	mu     sync.Mutex
	nextID int64
	calls  map[int64]chan message
	events chan message
	done   chan struct{} // the reader ended
}

type message struct {
	ID     int64           `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// devtoolsOrigin is the Origin of the DevTools WebSockets, which Chromium
// is told to allow.
const devtoolsOrigin = "http://127.0.0.1"

func dial(t testing.TB, wsURL string) *Page {
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
	d := &Page{ws: ws, calls: map[int64]chan message{}, events: make(chan message, 1000), done: make(chan struct{})}
	go d.read()
	t.Cleanup(func() { ws.Close(); <-d.done })
	return d
}

// read hands responses to their calls and queues events.
func (d *Page) read() {
	defer close(d.done)
	for {
		var m message
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

// Call sends a DevTools command (params nil for none) and returns its
// result.
func (d *Page) Call(t testing.TB, method string, params any) json.RawMessage {
	t.Helper()
	d.mu.Lock()
	d.nextID++
	id := d.nextID
	ch := make(chan message, 1)
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

// WaitEvent waits for the event method, dropping the events before it.
func (d *Page) WaitEvent(t testing.TB, method string, timeout time.Duration) {
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

// Eval evaluates expr in the page, awaiting a promise, and returns its
// value as JSON.
func (d *Page) Eval(t testing.TB, expr string) string {
	t.Helper()
	v, err := d.evaluate(t, expr)
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// evaluate is Eval, returning the script's exception as an error.
func (d *Page) evaluate(t testing.TB, expr string) (string, error) {
	t.Helper()
	res := d.Call(t, "Runtime.evaluate", map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true})
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
		return "", fmt.Errorf("%s %s", e.Text, e.Exception.Description)
	}
	return string(r.Result.Value), nil
}

// WaitFor waits, in the page, until cond (a JavaScript expression) is
// true, checking it at each change of the DOM. The page must stay: see
// WaitLoad for a condition that holds after navigations.
func (d *Page) WaitFor(t testing.TB, cond string, timeout time.Duration) {
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
	if got := d.Eval(t, js); got != "true" {
		t.Fatalf("not within %v: %s\nDOM: %s", timeout, cond, d.Eval(t, d.dump()))
	}
}

func (d *Page) dump() string {
	if d.Dump != "" {
		return d.Dump
	}
	return `document.documentElement.outerHTML.slice(0, 4000)`
}

// WaitLoad waits until cond (a JavaScript expression) is true in the page
// once it has loaded, checking it now and after each load of a document
// (a navigation, a form's submission, the redirects that follow), for up
// to timeout.
func (d *Page) WaitLoad(t testing.TB, cond string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	check := fmt.Sprintf(`(() => { try { return document.readyState === 'complete' && !!(%s); } catch (e) { return false; } })()`, cond)
	for {
		// A navigation may destroy the context of an evaluation under
		// way: that is no answer, and the next load tells again.
		if v, err := d.evaluate(t, check); err == nil && v == "true" {
			return
		}
		for loaded := false; !loaded; {
			select {
			case m := <-d.events:
				loaded = m.Method == "Page.loadEventFired"
			case <-deadline:
				v, _ := d.evaluate(t, `location.href + '\n' + `+d.dump())
				t.Fatalf("not within %v: %s\nat %s", timeout, cond, v)
			}
		}
	}
}

// Navigate opens url in the page and waits for it to load.
func (d *Page) Navigate(t testing.TB, url string) {
	t.Helper()
	d.drain()
	d.Call(t, "Page.navigate", map[string]any{"url": url})
	d.WaitEvent(t, "Page.loadEventFired", 30*time.Second)
}

// drain drops the events queued so far.
func (d *Page) drain() {
	for {
		select {
		case <-d.events:
		default:
			return
		}
	}
}

// Click clicks the middle of the element that selector finds, as a mouse
// would.
func (d *Page) Click(t testing.TB, selector string) {
	t.Helper()
	sel, _ := json.Marshal(selector)
	var at *struct{ X, Y float64 }
	if err := json.Unmarshal([]byte(d.Eval(t, fmt.Sprintf(`(() => {
		const e = document.querySelector(%s);
		if (!e) return null;
		e.scrollIntoView({ block: 'center' });
		const r = e.getBoundingClientRect();
		return { X: r.left + r.width / 2, Y: r.top + r.height / 2 };
	})()`, sel))), &at); err != nil || at == nil {
		t.Fatalf("click: no %s (%v)", selector, err)
	}
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		d.Call(t, "Input.dispatchMouseEvent", map[string]any{"type": typ, "x": at.X, "y": at.Y, "button": "left", "clickCount": 1})
	}
}

// Screenshot returns a PNG of the page as it is shown.
func (d *Page) Screenshot(t testing.TB) []byte {
	t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	json.Unmarshal(d.Call(t, "Page.captureScreenshot", map[string]any{"format": "png"}), &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil || len(png) == 0 {
		t.Fatalf("screenshot: %v", err)
	}
	return png
}

// Start runs headless Chromium with args added to its own flags (such as
// "--host-resolver-rules=MAP *.example.test 127.0.0.1" or
// "--ignore-certificate-errors"), opens url in it, and returns the page's
// DevTools once the page has loaded. Page errors are collected in
// window.tunnelkitTestErrors. The test's end closes the browser. Check for
// Chromium first (testtools.Need).
func Start(t testing.TB, url string, args ...string) *Page {
	t.Helper()
	flags := append([]string{
		"--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
		"--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio", "--hide-scrollbars",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--remote-allow-origins=" + devtoolsOrigin,
		"--window-size=1280,900",
	}, args...)
	wsURL, err := launch(t, flags)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		// Chromium crashes at its start now and then (it segfaulted
		// once in a run of the whole suite): once more.
		t.Logf("once more after this: %v", err)
		wsURL, err = launch(t, flags)
	}
	if err != nil {
		t.Fatal(err)
	}
	browser := dial(t, wsURL)
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
	json.Unmarshal(browser.Call(t, "Target.getTargets", nil), &r)
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
	page := dial(t, pageURL)
	page.Call(t, "Page.enable", nil)
	page.Call(t, "Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": `
		window.tunnelkitTestErrors = [];
		window.addEventListener('error', (e) => window.tunnelkitTestErrors.push(String(e.message)));
		window.addEventListener('unhandledrejection', (e) => window.tunnelkitTestErrors.push(String(e.reason)));
		document.addEventListener('securitypolicyviolation', (e) => window.tunnelkitTestErrors.push('CSP: ' + e.violatedDirective));
	`})
	page.Call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false})
	page.Call(t, "Page.navigate", map[string]any{"url": url})
	page.WaitEvent(t, "Page.loadEventFired", 30*time.Second)
	return page
}

// launch starts Chromium with flags and a profile of its own, has the
// test's end wait for it to exit, and returns the URL of its DevTools
// server. If Chromium exits before it listens, the error wraps its
// *exec.ExitError.
func launch(t testing.TB, flags []string) (string, error) {
	flags = append(flags[:len(flags):len(flags)], "--user-data-dir="+t.TempDir(), "about:blank")
	cmd := exec.Command("chromium", flags...)
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
		return "", err
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
	select {
	case wsURL := <-browserURL:
		return wsURL, nil
	case <-exited:
		return "", fmt.Errorf("Chromium exited: %w\n%s", waitErr, log.String())
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("Chromium did not start its DevTools server:\n%s", log.String())
	}
}
