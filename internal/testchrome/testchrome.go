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
// The test's end closes the browser and waits for it to exit. Tests of
// one package that need the same flags share a Browser, which starts
// Chromium once and gives each test a page in a browser context of its
// own:
//
//	var browser = testchrome.Browser{Args: []string{"--ignore-certificate-errors"}}
//	page := browser.Page(t, url) // in a test; TestMain calls browser.Close
package testchrome

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	d, err := dialWS(wsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

// dialWS connects to a DevTools WebSocket; close ends the connection.
func dialWS(wsURL string) (*Page, error) {
	cfg, err := websocket.NewConfig(wsURL, devtoolsOrigin)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := cfg.DialContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("DevTools %s: %w", wsURL, err)
	}
	ws.MaxPayloadBytes = 64 << 20
	d := &Page{ws: ws, calls: map[int64]chan message{}, events: make(chan message, 1000), done: make(chan struct{})}
	go d.read()
	return d, nil
}

func (d *Page) close() { d.ws.Close(); <-d.done }

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

// flags are Chromium's flags here, before those of a caller.
var flags = []string{
	"--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
	"--disable-extensions", "--disable-background-networking", "--disable-sync", "--mute-audio", "--hide-scrollbars",
	"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
	"--remote-allow-origins=" + devtoolsOrigin,
	"--window-size=1280,900",
}

// Start runs headless Chromium with args added to its own flags (such as
// "--host-resolver-rules=MAP *.example.test 127.0.0.1" or
// "--ignore-certificate-errors"), opens url in it, and returns the page's
// DevTools once the page has loaded. Page errors are collected in
// window.tunnelkitTestErrors. The test's end closes the browser. Check for
// Chromium first (testtools.Need). Tests whose flags are the same share a
// Browser instead.
func Start(t testing.TB, url string, args ...string) *Page {
	t.Helper()
	p, err := start(append(flags[:len(flags):len(flags)], args...), t.TempDir)
	if err != nil {
		t.Fatal(err)
	}
	var browser *Page
	t.Cleanup(func() {
		if err := p.close(browser); err != nil {
			t.Error(err)
		}
	})
	if browser, err = dialWS(p.wsURL); err != nil {
		t.Fatal(err)
	}

	// The page target, the tab Chromium opened, at the same server.
	var r struct {
		TargetInfos []struct {
			TargetID string `json:"targetId"`
			Type     string `json:"type"`
		} `json:"targetInfos"`
	}
	json.Unmarshal(browser.Call(t, "Target.getTargets", nil), &r)
	var targetID string
	for _, ti := range r.TargetInfos {
		if ti.Type == "page" {
			targetID = ti.TargetID
			break
		}
	}
	if targetID == "" {
		t.Fatalf("no page in Chromium: %+v", r)
	}
	page := dial(t, pageURL(p.wsURL, targetID))
	page.open(t, url)
	return page
}

// pageURL is the DevTools WebSocket of a target, at the browser's server.
func pageURL(browserURL, targetID string) string {
	return browserURL[:strings.Index(browserURL, "/devtools/")] + "/devtools/page/" + targetID
}

// open readies a new page (events, the error collector, the window's
// size) and loads url in it.
func (d *Page) open(t testing.TB, url string) {
	t.Helper()
	d.Call(t, "Page.enable", nil)
	d.Call(t, "Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": `
		window.tunnelkitTestErrors = [];
		window.addEventListener('error', (e) => window.tunnelkitTestErrors.push(String(e.message)));
		window.addEventListener('unhandledrejection', (e) => window.tunnelkitTestErrors.push(String(e.reason)));
		document.addEventListener('securitypolicyviolation', (e) => window.tunnelkitTestErrors.push('CSP: ' + e.violatedDirective));
	`})
	d.Call(t, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false})
	d.Call(t, "Page.navigate", map[string]any{"url": url})
	d.WaitEvent(t, "Page.loadEventFired", 30*time.Second)
}

// Browser is one headless Chromium that the tests of a test binary share,
// started at its first Page: Chromium costs more to start than a page
// does (about 1.3 CPU-s). Each Page is in a browser context of its own,
// with its own cookies, cache and connections. The zero value has no
// flags but Chromium's own here; a package's TestMain closes it after
// its tests.
type Browser struct {
	// Args are added to Chromium's own flags, as Start's are.
	Args []string

	once   sync.Once
	err    error
	dir    string
	p      *process
	conn   *Page // the browser target
	closed sync.Once
}

// Page opens url in a new page of b, in a browser context of its own
// which the test's end closes, and returns the page's DevTools once it has
// loaded. Check for Chromium first (testtools.Need).
func (b *Browser) Page(t testing.TB, url string) *Page {
	t.Helper()
	b.once.Do(b.start)
	if b.err != nil {
		t.Fatal(b.err)
	}
	var bc struct {
		ID string `json:"browserContextId"`
	}
	json.Unmarshal(b.conn.Call(t, "Target.createBrowserContext", nil), &bc)
	t.Cleanup(func() {
		b.conn.Call(t, "Target.disposeBrowserContext", map[string]any{"browserContextId": bc.ID})
	})
	var target struct {
		ID string `json:"targetId"`
	}
	json.Unmarshal(b.conn.Call(t, "Target.createTarget", map[string]any{"url": "about:blank", "browserContextId": bc.ID}), &target)
	page := dial(t, pageURL(b.p.wsURL, target.ID))
	page.open(t, url)
	return page
}

func (b *Browser) start() {
	b.dir, b.err = os.MkdirTemp("", "testchrome")
	if b.err != nil {
		return
	}
	n := 0
	b.p, b.err = start(append(flags[:len(flags):len(flags)], b.Args...), func() string {
		n++
		return filepath.Join(b.dir, strconv.Itoa(n))
	})
	if b.err != nil {
		return
	}
	if b.conn, b.err = dialWS(b.p.wsURL); b.err != nil {
		b.p.close(nil)
	}
}

// Close ends the browser, if it was started, and waits for it. It may be
// called more than once.
func (b *Browser) Close() error {
	var err error
	b.closed.Do(func() {
		b.once.Do(func() { b.err = errors.New("testchrome: Browser closed") })
		if b.conn != nil {
			err = b.p.close(b.conn)
		}
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	})
	return err
}

// process is a Chromium that runs.
type process struct {
	cmd     *exec.Cmd
	log     *lineWriter
	exited  chan struct{}
	waitErr error
	wsURL   string // the browser's DevTools WebSocket
}

// start launches Chromium with flags and a profile in a new directory of
// dir's, and returns it once its DevTools server listens. A Chromium that
// crashes before that (it segfaulted at its start once in a run of the
// whole suite) is launched once more, with a profile of its own.
func start(flags []string, dir func() string) (*process, error) {
	p, err := launch(flags, dir())
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		p, err = launch(flags, dir())
		if err != nil {
			err = fmt.Errorf("twice: %w", err)
		}
	}
	return p, err
}

// launch starts Chromium with flags and the profile in dir. If Chromium
// exits before its DevTools server listens, the error wraps its
// *exec.ExitError; if it does not listen within 30 s, it is killed.
func launch(flags []string, dir string) (*process, error) {
	cmd := exec.Command("chromium", append(flags[:len(flags):len(flags)], "--user-data-dir="+dir, "about:blank")...)
	browserURL := make(chan string, 1)
	p := &process{cmd: cmd, exited: make(chan struct{})}
	p.log = &lineWriter{line: func(l string) {
		if m := devtoolsListening.FindStringSubmatch(l); m != nil {
			select {
			case browserURL <- m[1]:
			default:
			}
		}
	}}
	cmd.Stderr = p.log
	// Wait need not wait for the output of children that outlive the
	// browser.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	select {
	case p.wsURL = <-browserURL:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("chromium exited: %w\n%s", p.waitErr, p.log.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-p.exited
		return nil, fmt.Errorf("chromium did not start its DevTools server:\n%s", p.log.String())
	}
}

// close asks Chromium to close over conn, its DevTools connection, waits
// up to 10 s for it to exit, then kills it, and ends conn. Without conn
// (nil), it kills Chromium at once.
func (p *process) close(conn *Page) error {
	if conn == nil {
		p.wait(0)
		return nil
	}
	defer conn.close()
	websocket.JSON.Send(conn.ws, map[string]any{"id": 1 << 30, "method": "Browser.close"})
	if !p.wait(10 * time.Second) {
		return fmt.Errorf("chromium did not exit after Browser.close; killed it\n%s", p.log.String())
	}
	return nil
}

// wait waits up to timeout for Chromium to exit, then kills it; it
// reports whether Chromium exited by itself.
func (p *process) wait(timeout time.Duration) bool {
	select {
	case <-p.exited:
		return true
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		<-p.exited
		return false
	}
}
