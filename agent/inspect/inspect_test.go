package inspect_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/agent/inspect"
	"github.com/tunnelkit/tunnelkit/internal/testnet"
)

// The inspector's tests put a forward.HTTP with an Inspector in front of
// a real app on loopback, and serve the Inspector's handler on loopback
// too, as the example agent does.

// inspected is a forwarder with an inspector and the inspector's server.
type inspected struct {
	insp *inspect.Inspector
	fwd  string       // the forwarder's address, where the edge's conns come
	ui   string       // the inspector's URL, "http://127.0.0.1:port/"
	stop func() error // stops the forwarder
}

// startInspected forwards to app through a forwarder with insp, and
// serves insp; h2c makes the app and the forwarder speak h2c.
func startInspected(t testing.TB, app http.Handler, insp *inspect.Inspector, h2c bool) *inspected {
	t.Helper()
	fwd, stop := startForwarder(t, forward.HTTP{To: testnet.ServeHTTP(t, app, h2c), AppProtocol: appProtocol(h2c), Recorder: insp})
	return &inspected{insp: insp, fwd: fwd, ui: serveInspector(t, insp), stop: stop}
}

// startForwarder serves a loopback listener with f and returns its
// address, and stop, which closes the listener and returns what Serve
// returned. The test's end stops it too and wants nil.
func startForwarder(t testing.TB, f forward.HTTP) (addr string, stop func() error) {
	t.Helper()
	ln := testnet.Listen(t)
	done := make(chan error, 1)
	go func() { done <- f.Serve(ln) }()
	stop = sync.OnceValue(func() error {
		ln.Close()
		return <-done
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), stop
}

func client(t testing.TB, addr string, h2c bool) *http.Client {
	return testnet.HTTPClient(t, addr, h2c)
}

// modes are the two ways the edge speaks to an app: the forwarder's
// AppProtocol, and so the protocol of the client standing for the edge
// and of the app.
var modes = []struct {
	name string
	h2c  bool
}{{"http1", false}, {"h2c", true}}

func appProtocol(h2c bool) string {
	if h2c {
		return "h2c"
	}
	return "http1"
}

// serveInspector serves insp on loopback and returns its URL.
func serveInspector(t testing.TB, insp *inspect.Inspector) string {
	t.Helper()
	ln := testnet.Listen(t)
	srv := &http.Server{Handler: insp}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	// Close ends the event streams too.
	t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + ln.Addr().String() + "/"
}

// sseStream is a client of the inspector's event stream.
type sseStream struct {
	ch   chan sseEvent
	body io.Closer
}

type sseEvent struct {
	id uint64
	ex inspect.Exchange
}

// openEvents subscribes to the events at url, with the request's header
// h; the stream is open when it returns, so that it gets each change
// after.
func openEvents(t testing.TB, url string, h http.Header) *sseStream {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	ev := &sseStream{ch: make(chan sseEvent, 1000), body: resp.Body}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ev.ch)
		var e sseEvent
		var typ, data string
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch k, v, _ := strings.Cut(line, ": "); k {
			case "id":
				e.id, _ = strconv.ParseUint(v, 10, 64)
			case "event":
				typ = v
			case "data":
				data = v
			case "":
				if typ == "exchange" {
					if err := json.Unmarshal([]byte(data), &e.ex); err != nil {
						t.Errorf("event %q: %v", data, err)
					}
					ev.ch <- e
				}
				e, typ, data = sseEvent{}, "", ""
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close(); <-done })
	return ev
}

// next returns the next event, within d.
func (ev *sseStream) next(t testing.TB, d time.Duration) sseEvent {
	t.Helper()
	select {
	case e, ok := <-ev.ch:
		if !ok {
			t.Fatal("the event stream ended")
		}
		return e
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
		return sseEvent{}
	}
}

// done waits for the events that say the exchanges ids are done.
func (ev *sseStream) done(t testing.TB, ids ...uint64) {
	t.Helper()
	want := map[uint64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for len(want) > 0 {
		if e := ev.next(t, 10*time.Second); e.ex.Done {
			delete(want, e.ex.ID)
		}
	}
}

// getJSON gets ui+path into v and returns the status.
func getJSON(t testing.TB, ui, path string, v any) int {
	t.Helper()
	resp, err := http.Get(ui + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == 200 {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	return resp.StatusCode
}

func exchange(t testing.TB, ui string, id uint64) inspect.Exchange {
	t.Helper()
	var x inspect.Exchange
	if code := getJSON(t, ui, fmt.Sprint("api/requests/", id), &x); code != 200 {
		t.Fatalf("exchange %d: status %d", id, code)
	}
	return x
}

type exchangeList struct {
	Max       int                `json:"max"`
	Version   uint64             `json:"version"`
	Exchanges []inspect.Exchange `json:"exchanges"`
}

func ids(xs []inspect.Exchange) []uint64 {
	var out []uint64
	for _, x := range xs {
		out = append(out, x.ID)
	}
	return out
}

// pattern returns n bytes that differ from one offset to the next.
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed)})
	r.Read(b)
	return b
}

// TestInspectorRecords sends a small request and a large one through the
// forwarder: the exchanges hold their method, URL, host, headers, status,
// timing, client and bodies, the first 64 KiB of the large ones, which
// the app and the client get whole.
func TestInspectorRecords(t *testing.T) {
	big, bigResp := pattern(200<<10, 1), pattern(300<<10, 2)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if r.URL.Path == "/big" {
			if !bytes.Equal(body, big) {
				http.Error(w, fmt.Sprintf("the app got %d bytes, not the client's %d", len(body), len(big)), 500)
				return
			}
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write(bigResp)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-App", "yes")
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"got":%q}`, body)
	})
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			in := startInspected(t, app, new(inspect.Inspector), m.h2c)
			ev := openEvents(t, in.ui+"api/events", nil)
			c := client(t, in.fwd, m.h2c)
			before := time.Now()

			req, _ := http.NewRequest("POST", "http://app.example.test/echo?x=1&y=%20", strings.NewReader(`{"hello":"world"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header["X-Custom"] = []string{"one", "two"}
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 201 || string(body) != `{"got":"{\"hello\":\"world\"}"}` {
				t.Fatalf("response %d %q", resp.StatusCode, body)
			}
			ev.done(t, 1)
			x := exchange(t, in.ui, 1)
			proto := "HTTP/1.1"
			if m.h2c {
				proto = "HTTP/2.0"
			}
			if x.ID != 1 || x.ReplayOf != 0 || !x.Done || x.Method != "POST" || x.URL != "/echo?x=1&y=%20" || x.Host != "app.example.test" || x.Proto != proto || x.Status != 201 || x.Error != "" || x.HeaderTruncated {
				t.Errorf("exchange: %+v", x)
			}
			if h, _, err := net.SplitHostPort(x.Client); err != nil || h != "127.0.0.1" {
				t.Errorf("client %q, want 127.0.0.1:port", x.Client)
			}
			if x.Start.Before(before) || time.Since(x.Start) > time.Minute || x.Duration <= 0 || x.Start.Add(x.Duration).After(time.Now()) {
				t.Errorf("start %v, duration %v; the test began at %v", x.Start, x.Duration, before)
			}
			if got := x.RequestHeader["X-Custom"]; !reflect.DeepEqual(got, []string{"one", "two"}) || x.RequestHeader.Get("X-Forwarded-For") != "203.0.113.7" || x.RequestHeader.Get("Content-Type") != "application/json" {
				t.Errorf("request header %v", x.RequestHeader)
			}
			if x.ResponseHeader.Get("X-App") != "yes" || x.ResponseHeader.Get("Content-Type") != "application/json" {
				t.Errorf("response header %v", x.ResponseHeader)
			}
			if want := (inspect.Body{Data: []byte(`{"hello":"world"}`), Size: 17}); !reflect.DeepEqual(x.RequestBody, want) {
				t.Errorf("request body %+v, want %+v", x.RequestBody, want)
			}
			if string(x.ResponseBody.Data) != string(body) || x.ResponseBody.Size != int64(len(body)) || x.ResponseBody.Truncated {
				t.Errorf("response body %+v, want %q", x.ResponseBody, body)
			}

			resp, err = c.Post("http://app.example.test/big", "application/octet-stream", bytes.NewReader(big))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || sha256.Sum256(got) != sha256.Sum256(bigResp) {
				t.Fatalf("big: %d, %d bytes, %v: want 200 and the app's %d bytes", resp.StatusCode, len(got), err, len(bigResp))
			}
			ev.done(t, 2)
			x = exchange(t, in.ui, 2)
			if rb := x.RequestBody; rb.Size != int64(len(big)) || !rb.Truncated || !bytes.Equal(rb.Data, big[:64<<10]) {
				t.Errorf("big request body: %d bytes of %d kept, truncated %v; want the first 64 KiB of %d", len(rb.Data), rb.Size, rb.Truncated, len(big))
			}
			if rb := x.ResponseBody; rb.Size != int64(len(bigResp)) || !rb.Truncated || !bytes.Equal(rb.Data, bigResp[:64<<10]) {
				t.Errorf("big response body: %d bytes of %d kept, truncated %v; want the first 64 KiB of %d", len(rb.Data), rb.Size, rb.Truncated, len(bigResp))
			}

			// The list: newest first, without headers or bodies.
			var raw struct {
				Max       int               `json:"max"`
				Exchanges []json.RawMessage `json:"exchanges"`
			}
			getJSON(t, in.ui, "api/requests", &raw)
			var l exchangeList
			getJSON(t, in.ui, "api/requests", &l)
			if raw.Max != 100 || !reflect.DeepEqual(ids(l.Exchanges), []uint64{2, 1}) {
				t.Errorf("list: max %d, ids %v; want 100, [2 1]", raw.Max, ids(l.Exchanges))
			}
			for _, r := range raw.Exchanges {
				if s := string(r); strings.Contains(s, "header") || strings.Contains(s, "data") {
					t.Errorf("list entry with headers or data: %s", s)
				}
			}
			if l.Exchanges[1].RequestBody.Size != 17 || l.Exchanges[0].ResponseBody.Size != int64(len(bigResp)) {
				t.Errorf("list: body sizes %+v", l.Exchanges)
			}
			if xs := in.insp.Exchanges(); !reflect.DeepEqual(ids(xs), []uint64{2, 1}) || xs[1].Status != 201 {
				t.Errorf("Exchanges: %+v", xs)
			}
		})
	}
}

// TestInspectorRing sends Max+10 requests with 100 KiB bodies each way:
// the newest Max stay, and the bodies of the others are garbage.
func TestInspectorRing(t *testing.T) {
	const max = 5
	payload := pattern(100<<10, 3)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(payload)
	})
	in := startInspected(t, app, &inspect.Inspector{Max: max}, false)
	ev := openEvents(t, in.ui+"api/events", nil)
	c := client(t, in.fwd, false)
	send := func(i int) {
		resp, err := c.Post(fmt.Sprint("http://app.example.test/", i), "application/octet-stream", bytes.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != int64(len(payload)) {
			t.Fatalf("request %d: %d bytes of response", i, n)
		}
	}
	for i := 1; i <= max; i++ {
		send(i)
	}
	ev.done(t, 1, 2, 3, 4, 5)

	// The first Max exchanges' bodies: each a 64 KiB array, watched
	// until the garbage collector frees it.
	freed := make(chan int, 2*max)
	for _, x := range in.insp.Exchanges() {
		for _, b := range []inspect.Body{x.RequestBody, x.ResponseBody} {
			if len(b.Data) != 64<<10 {
				t.Fatalf("exchange %d keeps %d bytes of a body", x.ID, len(b.Data))
			}
			runtime.AddCleanup(&b.Data[0], func(id int) { freed <- id }, int(x.ID))
		}
	}

	for i := max + 1; i <= max+10; i++ {
		send(i)
	}
	ev.done(t, 11, 12, 13, 14, 15)
	var l exchangeList
	getJSON(t, in.ui, "api/requests", &l)
	if want := []uint64{15, 14, 13, 12, 11}; l.Max != max || !reflect.DeepEqual(ids(l.Exchanges), want) {
		t.Errorf("list: max %d, ids %v; want %d, %v", l.Max, ids(l.Exchanges), max, want)
	}
	var x inspect.Exchange
	if code := getJSON(t, in.ui, "api/requests/10", &x); code != http.StatusNotFound {
		t.Errorf("exchange 10: status %d, want 404", code)
	}
	if x := exchange(t, in.ui, 11); x.RequestBody.Size != int64(len(payload)) {
		t.Errorf("exchange 11: %+v", x.RequestBody)
	}

	// Nothing holds the pushed-out bodies.
	deadline := time.After(10 * time.Second)
	for n := 0; n < 2*max; {
		runtime.GC()
		select {
		case <-freed:
			n++
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("%d of the %d bodies of the pushed-out exchanges are still held", 2*max-n, 2*max)
		}
	}
}

// TestInspectorEvents opens the event stream, then sends a request that
// the app holds: an event shows it under way, another when it is done
// (TestInspectorChromium checks the page sees it within a second); a stream that resumes from Last-Event-ID, or from
// since, gets the changes after it.
func TestInspectorEvents(t *testing.T) {
	release := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		io.WriteString(w, "released")
	})
	in := startInspected(t, app, new(inspect.Inspector), false)
	ev := openEvents(t, in.ui+"api/events", nil)
	c := client(t, in.fwd, false)

	result := make(chan error, 1)
	go func() {
		resp, err := c.Get("http://app.example.test/held?a=1")
		if err == nil {
			resp.Body.Close()
		}
		result <- err
	}()
	e := ev.next(t, 5*time.Second)
	if x := e.ex; x.ID != 1 || x.Done || x.Status != 0 || x.Method != "GET" || x.URL != "/held?a=1" || x.Host != "app.example.test" {
		t.Errorf("first event: %+v; want exchange 1 under way", x)
	}
	if e.ex.RequestHeader != nil || e.id == 0 {
		t.Errorf("event id %d with header %v; want an id, no header", e.id, e.ex.RequestHeader)
	}
	first := e.id
	close(release)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	ev.done(t, 1)

	// Resuming after the first change: the later ones, up to the list's
	// version, the last one done.
	var l exchangeList
	getJSON(t, in.ui, "api/requests", &l)
	for name, resume := range map[string]*sseStream{
		"Last-Event-ID": openEvents(t, in.ui+"api/events", http.Header{"Last-Event-ID": {fmt.Sprint(first)}}),
		"since":         openEvents(t, in.ui+"api/events?since="+fmt.Sprint(first), nil),
	} {
		var last sseEvent
		for last.id < l.Version {
			last = resume.next(t, 5*time.Second)
			if last.id <= first {
				t.Errorf("%s: event %d, after %d", name, last.id, first)
			}
		}
		if !last.ex.Done || last.ex.ID != 1 || last.ex.Status != 200 || last.ex.ResponseBody.Size != 8 {
			t.Errorf("%s: last event %+v; want exchange 1 done", name, last.ex)
		}
	}
}

// replayResult posts a replay of id to ui with the header h and body
// body, and returns the status and the decoded exchange (or the error
// message).
func replayResult(t testing.TB, ui string, id uint64, h http.Header, body string) (int, inspect.Exchange, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", fmt.Sprint(ui, "api/requests/", id, "/replay"), strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	if h.Get("Host") != "" {
		req.Host = h.Get("Host")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var x inspect.Exchange
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(b, &x); err != nil {
			t.Fatalf("replay: %v: %s", err, b)
		}
	}
	return resp.StatusCode, x, string(b)
}

var inspectorHeader = http.Header{"X-Tunnelkit-Inspector": {"1"}}

// seenRequest is what the replay tests' app saw of a request.
type seenRequest struct {
	method, uri, host, custom, xff, body string
}

// recordingApp returns an app that sends what it sees to the channel,
// and counts the requests.
func recordingApp(n *atomic.Int64) (http.Handler, chan seenRequest) {
	seen := make(chan seenRequest, 100)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		body, _ := io.ReadAll(r.Body)
		seen <- seenRequest{r.Method, r.RequestURI, r.Host, strings.Join(r.Header["X-Custom"], ","), r.Header.Get("X-Forwarded-For"), string(body)}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "app saw %s %s", r.Method, r.RequestURI)
	}), seen
}

// TestInspectorReplay replays a request as it was, then edited: the app
// gets it again each time, and the replays are recorded as such.
func TestInspectorReplay(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var count atomic.Int64
			app, seen := recordingApp(&count)
			in := startInspected(t, app, new(inspect.Inspector), m.h2c)
			ev := openEvents(t, in.ui+"api/events", nil)
			req, _ := http.NewRequest("POST", "http://app.example.test/orig?q=1", strings.NewReader("payload"))
			req.Header.Set("X-Custom", "one")
			req.Header.Set("X-Forwarded-For", "203.0.113.7")
			resp, err := client(t, in.fwd, m.h2c).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			orig := <-seen
			if want := (seenRequest{"POST", "/orig?q=1", "app.example.test", "one", "203.0.113.7", "payload"}); orig != want {
				t.Fatalf("the app saw %+v, want %+v", orig, want)
			}
			ev.done(t, 1)

			code, x, msg := replayResult(t, in.ui, 1, inspectorHeader, "")
			if code != 200 {
				t.Fatalf("replay: %d %s", code, msg)
			}
			if again := <-seen; again != orig {
				t.Errorf("the replay reached the app as %+v, want %+v", again, orig)
			}
			if x.ID != 2 || x.ReplayOf != 1 || !x.Done || x.Status != 200 || x.Method != "POST" || x.URL != "/orig?q=1" || string(x.ResponseBody.Data) != "app saw POST /orig?q=1" || string(x.RequestBody.Data) != "payload" {
				t.Errorf("replay exchange: %+v", x)
			}
			if h, _, _ := net.SplitHostPort(x.Client); h != "127.0.0.1" {
				t.Errorf("replay's client %q: want the inspector's client", x.Client)
			}

			edit := `{"method":"PUT","url":"/edited?z=9","header":{"X-Custom":["two","three"],"X-Forwarded-For":["198.51.100.1"]},"body":"changed"}`
			code, x, msg = replayResult(t, in.ui, 1, inspectorHeader, edit)
			if code != 200 {
				t.Fatalf("edited replay: %d %s", code, msg)
			}
			if got, want := <-seen, (seenRequest{"PUT", "/edited?z=9", "app.example.test", "two,three", "198.51.100.1", "changed"}); got != want {
				t.Errorf("the edited replay reached the app as %+v, want %+v", got, want)
			}
			if x.ID != 3 || x.ReplayOf != 1 || x.Method != "PUT" || x.URL != "/edited?z=9" || x.RequestBody.Size != 7 || x.Status != 200 {
				t.Errorf("edited replay exchange: %+v", x)
			}
			// A replay of a replay.
			if code, x, msg = replayResult(t, in.ui, 3, inspectorHeader, `{"host":"other.example.test"}`); code != 200 || x.ReplayOf != 3 || x.Host != "other.example.test" {
				t.Errorf("replay of the replay: %d %+v %s", code, x, msg)
			}
			if got := <-seen; got.host != "other.example.test" || got.method != "PUT" {
				t.Errorf("the replay of the replay reached the app as %+v", got)
			}
			if n := count.Load(); n != 4 {
				t.Errorf("the app got %d requests, want 4", n)
			}
			var l exchangeList
			getJSON(t, in.ui, "api/requests", &l)
			var replayOf []uint64
			for _, x := range l.Exchanges {
				replayOf = append(replayOf, x.ReplayOf)
			}
			if !reflect.DeepEqual(ids(l.Exchanges), []uint64{4, 3, 2, 1}) || !reflect.DeepEqual(replayOf, []uint64{3, 1, 1, 0}) {
				t.Errorf("list: ids %v, replay_of %v", ids(l.Exchanges), replayOf)
			}
		})
	}
}

// TestInspectorRefuses checks that the inspector refuses to replay for a
// page of another origin, answers no host but its own, and says why it
// cannot replay what it cannot.
func TestInspectorRefuses(t *testing.T) {
	var count atomic.Int64
	app, _ := recordingApp(&count)
	in := startInspected(t, app, &inspect.Inspector{BodyLimit: 4, Hosts: []string{"inspector.test"}}, false)
	ev := openEvents(t, in.ui+"api/events", nil)
	c := client(t, in.fwd, false)
	for _, body := range []string{"abc", "longer than 4"} {
		resp, err := c.Post("http://app.example.test/", "text/plain", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ev.done(t, 1, 2)
	self := strings.TrimSuffix(in.ui, "/")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(self, "http://"))

	for _, c := range []struct {
		name string
		id   uint64
		h    http.Header
		body string
		want int
	}{
		// A form or fetch from a page of another origin.
		{"foreign Origin", 1, http.Header{"X-Tunnelkit-Inspector": {"1"}, "Origin": {"http://evil.example"}}, "", 403},
		{"cross-site fetch", 1, http.Header{"X-Tunnelkit-Inspector": {"1"}, "Sec-Fetch-Site": {"cross-site"}}, "", 403},
		{"same-site fetch", 1, http.Header{"X-Tunnelkit-Inspector": {"1"}, "Sec-Fetch-Site": {"same-site"}}, "", 403},
		{"form without the header", 1, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Origin": {self}}, "a=b", 403},
		{"no header", 1, nil, "", 403},
		// A page whose name now resolves to loopback: DNS rebinding.
		{"foreign Host", 1, http.Header{"X-Tunnelkit-Inspector": {"1"}, "Host": {"evil.example:" + port}, "Origin": {"http://evil.example:" + port}}, "", 403},
		{"unknown exchange", 9, inspectorHeader, "", 404},
		{"truncated body", 2, inspectorHeader, "", 409},
		{"bad method", 1, inspectorHeader, `{"method":"GET X"}`, 400},
		{"bad URL", 1, inspectorHeader, `{"url":"http://elsewhere.example/"}`, 400},
		{"bad header", 1, inspectorHeader, `{"header":{"X-A":["a\r\nX-B: b"]}}`, 400},
		{"not JSON", 1, inspectorHeader, `{`, 400},
	} {
		if code, _, msg := replayResult(t, in.ui, c.id, c.h, c.body); code != c.want {
			t.Errorf("%s: status %d (%s), want %d", c.name, code, msg, c.want)
		}
	}
	if n := count.Load(); n != 2 {
		t.Fatalf("the app got %d requests after the refused replays, want 2", n)
	}

	// The page's own requests, from the inspector's origin under each of
	// its names, and those of a client that is not a browser.
	for i, h := range []http.Header{
		{"X-Tunnelkit-Inspector": {"1"}, "Origin": {self}, "Sec-Fetch-Site": {"same-origin"}},
		{"X-Tunnelkit-Inspector": {"1"}, "Origin": {"http://localhost:" + port}, "Host": {"localhost:" + port}},
		{"X-Tunnelkit-Inspector": {"1"}, "Host": {"inspector.test:" + port}},
		{"X-Tunnelkit-Inspector": {"1"}, "Host": {"[::1]:" + port}},
	} {
		if code, _, msg := replayResult(t, in.ui, 1, h, ""); code != 200 {
			t.Errorf("replay %d with %v: %d %s", i, h, code, msg)
		}
	}
	if code, _, msg := replayResult(t, in.ui, 2, inspectorHeader, `{"body":"new body"}`); code != 200 {
		t.Errorf("truncated body, replaced: %d %s", code, msg)
	}
	if n := count.Load(); n != 7 {
		t.Errorf("the app got %d requests, want 7", n)
	}

	// Reading is refused to a foreign host too.
	req, _ := http.NewRequest("GET", in.ui+"api/requests", nil)
	req.Host = "evil.example:" + port
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("list for a foreign host: %d, want 403", resp.StatusCode)
	}

	// Without the forwarder, a replay has nowhere to go.
	if err := in.stop(); err != nil {
		t.Fatal(err)
	}
	if code, _, msg := replayResult(t, in.ui, 1, inspectorHeader, ""); code != http.StatusServiceUnavailable {
		t.Errorf("replay after the forwarder stopped: %d %s, want 503", code, msg)
	}
}

// TestInspectorReplayUnderWay: an exchange under way replays at once
// when its request had no body, and only with a new body when it had one,
// which is not all known yet.
func TestInspectorReplayUnderWay(t *testing.T) {
	var count atomic.Int64
	release := make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count.Add(1)
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hold" {
			<-release
		}
	})
	in := startInspected(t, app, new(inspect.Inspector), false)
	ev := openEvents(t, in.ui+"api/events", nil)
	c := client(t, in.fwd, false)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	for _, method := range []string{"GET", "POST"} {
		wg.Go(func() {
			req, _ := http.NewRequest(method, "http://app.example.test/hold", strings.NewReader("body"))
			if method == "GET" {
				req.Body, req.ContentLength = nil, 0
			}
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	seen := map[string]uint64{}
	for len(seen) < 2 {
		if e := ev.next(t, 5*time.Second); !e.ex.Done {
			seen[e.ex.Method] = e.ex.ID
		}
	}
	if code, x, msg := replayResult(t, in.ui, seen["GET"], inspectorHeader, `{"url":"/now"}`); code != 200 || x.Method != "GET" || x.URL != "/now" {
		t.Errorf("replay of a GET under way: %d %s", code, msg)
	}
	if code, _, msg := replayResult(t, in.ui, seen["POST"], inspectorHeader, `{"url":"/now"}`); code != http.StatusConflict {
		t.Errorf("replay of a POST under way: %d %s; want 409", code, msg)
	}
	if code, x, msg := replayResult(t, in.ui, seen["POST"], inspectorHeader, `{"url":"/now","body":"new"}`); code != 200 || x.RequestBody.Size != 3 {
		t.Errorf("replay of a POST under way with a body: %d %s", code, msg)
	}
	if n := count.Load(); n != 4 {
		t.Errorf("the app got %d requests, want 4", n)
	}
}

// TestInspectorAborted: a response that breaks off is recorded so.
func TestInspectorAborted(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		io.WriteString(w, "0123456789")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	in := startInspected(t, app, new(inspect.Inspector), false)
	ev := openEvents(t, in.ui+"api/events", nil)
	resp, err := client(t, in.fwd, false).Get("http://app.example.test/")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Error("the client got the whole response; want an error")
	}
	ev.done(t, 1)
	if x := exchange(t, in.ui, 1); x.Error != "aborted" || x.Status != 200 || x.ResponseBody.Size != 10 {
		t.Errorf("exchange: error %q, status %d, body %+v; want aborted, 200, 10 bytes", x.Error, x.Status, x.ResponseBody)
	}
}

// TestInspectorUpgrade: a protocol switch is recorded as 101, under way
// while the upgraded connection is open, with the app's 101 header.
func TestInspectorUpgrade(t *testing.T) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\nX-App: yes\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	})
	in := startInspected(t, app, new(inspect.Inspector), false)
	ev := openEvents(t, in.ui+"api/events", nil)
	c, err := net.Dial("tcp", in.fwd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: app.example.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v", err)
	}
	for {
		if e := ev.next(t, 5*time.Second); e.ex.Status == http.StatusSwitchingProtocols {
			if e.ex.Done {
				t.Fatal("the exchange is done while the upgraded connection is open")
			}
			break
		}
	}
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(br); string(got) != "ping" || err != nil {
		t.Fatalf("echoed %q, %v", got, err)
	}
	ev.done(t, 1)
	if x := exchange(t, in.ui, 1); x.Status != http.StatusSwitchingProtocols || x.ResponseHeader.Get("Upgrade") != "echo" || x.ResponseHeader.Get("X-App") != "yes" || x.Error != "" {
		t.Errorf("exchange: status %d, header %v, error %q", x.Status, x.ResponseHeader, x.Error)
	}
}

// TestInspectorPage: the page is one self-contained response that loads
// nothing, and that may run only its own script.
func TestInspectorPage(t *testing.T) {
	ui := serveInspector(t, new(inspect.Inspector))
	resp, err := http.Get(ui)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(page), "<script>") {
		t.Fatalf("page: %s, %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{"default-src 'none'", "script-src 'sha256-", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	if ext := regexp.MustCompile(`(?i)(src|href|url)\s*[=(]\s*["']?(https?:)?//|@import`).Find(page); ext != nil {
		t.Errorf("the page loads %q from elsewhere", ext)
	}
	if resp, err := http.Get(ui + "nothing"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /nothing: %v %v", resp.Status, err)
	}
}

// BenchmarkInspector measures the inspector's cost on requests through
// the forwarder: one request at a time, in turn through a forwarder
// without and one with an inspector, to the same app, so that both see
// the same machine; it reports their latencies and the ratio
// (overhead: 1.05 is 5% slower with the inspector). get is a small GET;
// post a 16 KiB POST answered with 16 KiB; watched a small GET while a
// page follows the events.
func BenchmarkInspector(b *testing.B) {
	resp16k := pattern(16<<10, 4)
	app := testnet.ServeHTTP(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		if r.Method == "POST" {
			w.Write(resp16k)
			return
		}
		io.WriteString(w, "hello, world\n")
	}), false)
	body16k := pattern(16<<10, 5)
	do := func(b *testing.B, c *http.Client, post bool) {
		var resp *http.Response
		var err error
		if post {
			resp, err = c.Post("http://app.example.test/upload", "application/octet-stream", bytes.NewReader(body16k))
		} else {
			resp, err = c.Get("http://app.example.test/")
		}
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, bc := range []struct {
		name          string
		post, watched bool
	}{{"get", false, false}, {"post", true, false}, {"watched", false, true}} {
		b.Run(bc.name, func(b *testing.B) {
			insp := new(inspect.Inspector)
			offAddr, _ := startForwarder(b, forward.HTTP{To: app})
			onAddr, _ := startForwarder(b, forward.HTTP{To: app, Recorder: insp})
			if bc.watched {
				ev := openEvents(b, serveInspector(b, insp)+"api/events", nil)
				var wg sync.WaitGroup
				wg.Go(func() {
					for range ev.ch {
					}
				})
				b.Cleanup(func() { ev.body.Close(); wg.Wait() })
			}
			off, on := client(b, offAddr, false), client(b, onAddr, false)
			do(b, off, bc.post)
			do(b, on, bc.post)
			var inOff, inOn time.Duration
			b.ResetTimer()
			for i := range b.N {
				// Alternate which goes first.
				first, second := off, on
				if i%2 == 1 {
					first, second = on, off
				}
				t0 := time.Now()
				do(b, first, bc.post)
				t1 := time.Now()
				do(b, second, bc.post)
				t2 := time.Now()
				if first == off {
					inOff, inOn = inOff+t1.Sub(t0), inOn+t2.Sub(t1)
				} else {
					inOn, inOff = inOn+t1.Sub(t0), inOff+t2.Sub(t1)
				}
			}
			b.ReportMetric(float64(inOff.Nanoseconds())/float64(b.N), "off-ns/req")
			b.ReportMetric(float64(inOn.Nanoseconds())/float64(b.N), "on-ns/req")
			b.ReportMetric(float64(inOn)/float64(inOff), "overhead")
		})
	}
}

// TestInspectorForwardsBytes sends a request whose header names are not
// in canonical case, with hop-by-hop fields, through a forwarder with an
// inspector to an app that answers the same way: the app gets the
// client's bytes, and the client the app's, byte for byte, as without an
// inspector; the inspector records the exchange.
func TestInspectorForwardsBytes(t *testing.T) {
	const (
		request = "POST /p?q=1 HTTP/1.1\r\nHost: app.example.test\r\nx-lower: one\r\nX-UPPER: two\r\n" +
			"Connection: keep-alive, x-hop\r\nx-hop: kept\r\nContent-Length: 4\r\n\r\nbody"
		response = "HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\nx-App-CASE: Yes\r\n" +
			"Connection: x-hop\r\nx-hop: kept\r\nContent-Length: 5\r\n\r\nhello"
	)
	got := make(chan string, 1)
	app := testnet.Serve(t, testnet.Listen(t), func(c net.Conn) {
		// The head, to its blank line, and the body's 4 bytes.
		var b []byte
		br := bufio.NewReader(c)
		for !bytes.HasSuffix(b, []byte("\r\n\r\n")) {
			line, err := br.ReadSlice('\n')
			b = append(b, line...)
			if err != nil {
				got <- string(b)
				return
			}
		}
		body := make([]byte, 4)
		_, err := io.ReadFull(br, body)
		got <- string(append(b, body...))
		if err == nil {
			io.WriteString(c, response)
		}
		io.Copy(io.Discard, c)
	})
	insp := new(inspect.Inspector)
	fwd, _ := startForwarder(t, forward.HTTP{To: app, Recorder: insp})
	ui := serveInspector(t, insp)
	ev := openEvents(t, ui+"api/events", nil)
	c, err := net.Dial("tcp", fwd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	var rb bytes.Buffer
	io.WriteString(c, request)
	if s := <-got; s != request {
		t.Errorf("the app got\n%q\nwant the client's\n%q", s, request)
	}
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(c, &rb)), nil)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
	}
	if err != nil || rb.String() != response {
		t.Errorf("the client got\n%q (%v)\nwant the app's\n%q", rb.String(), err, response)
	}
	ev.done(t, 1)
	x := exchange(t, ui, 1)
	if x.Method != "POST" || x.URL != "/p?q=1" || x.Host != "app.example.test" || x.Status != 201 || x.To != app ||
		x.RequestHeader.Get("X-Lower") != "one" || x.RequestHeader.Get("X-Hop") != "kept" || x.ResponseHeader.Get("X-App-Case") != "Yes" ||
		string(x.RequestBody.Data) != "body" || string(x.ResponseBody.Data) != "hello" || x.Error != "" {
		t.Errorf("exchange: %+v", x)
	}
}

// TestInspectorNil: a nil *Inspector records nothing, and a forwarder
// whose Recorder it is forwards as without one.
func TestInspectorNil(t *testing.T) {
	var insp *inspect.Inspector
	if rec := insp.Record(httptest.NewRequest("GET", "/", nil), nil); rec != nil {
		t.Errorf("a nil Inspector's Record returned %v", rec)
	}
	app := testnet.ServeHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), false)
	fwd, _ := startForwarder(t, forward.HTTP{To: app, Recorder: insp})
	resp, err := client(t, fwd, false).Get("http://app.example.test/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Errorf("%s %q", resp.Status, body)
	}
}

// TestInspectorAppUnreachable: for an app that cannot be reached, the
// exchange holds the forwarder's answer, 502 with its Tunnelkit-Error
// header and body, as the client got it, and keeps its request ID and
// the detail that the client was not shown (the dial's error, naming the
// app's address); its replay is answered and recorded so too.
func TestInspectorAppUnreachable(t *testing.T) {
	ln := testnet.Listen(t)
	down := ln.Addr().String()
	ln.Close()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			insp := new(inspect.Inspector)
			fwd, _ := startForwarder(t, forward.HTTP{To: down, AppProtocol: appProtocol(m.h2c), Recorder: insp})
			ui := serveInspector(t, insp)
			ev := openEvents(t, ui+"api/events", nil)
			resp, err := client(t, fwd, m.h2c).Post("http://app.example.test/orders", "text/plain", strings.NewReader("order"))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ev.done(t, 1)
			x := exchange(t, ui, 1)
			if x.Status != http.StatusBadGateway || x.ResponseHeader.Get("Tunnelkit-Error") != "app_unreachable" || string(x.ResponseBody.Data) != string(body) || x.To != down {
				t.Errorf("exchange: %+v; the client got %s %q", x, resp.Status, body)
			}
			if id := resp.Header.Get("Tunnelkit-Request-Id"); x.RequestID != id || id == "" || x.Error != "app_unreachable: dial tcp "+down+": connect: connection refused" || strings.Contains(string(body), down) {
				t.Errorf("exchange: request ID %q, error %q; want the answer's, %q, and the dial's error; the client got %q", x.RequestID, x.Error, id, body)
			}
			code, rx, msg := replayResult(t, ui, 1, inspectorHeader, `{"body":"again"}`)
			if code != 200 || rx.ReplayOf != 1 || rx.Status != http.StatusBadGateway || rx.ResponseHeader.Get("Tunnelkit-Error") != "app_unreachable" {
				t.Errorf("replay: %d %+v %s", code, rx, msg)
			}
		})
	}
}
