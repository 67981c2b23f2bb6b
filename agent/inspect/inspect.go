// Package inspect records the HTTP exchanges that go through a tunnel's
// HTTP forwarder and shows them on a web page that updates live and
// replays a request to the app in one click, as it was or edited: a tool
// for developing an app behind a tunnel, kept out of the apps that only
// serve one.
//
// Typical use, with a forward.HTTP:
//
//	insp := new(inspect.Inspector)
//	go http.ListenAndServe("127.0.0.1:4040", insp) // loopback only: see Inspector
//	return forward.HTTP{To: "127.0.0.1:3000", Recorder: insp}.Serve(l)
//
// An Inspector is a [forward.Recorder]: the forwarder hands it each
// exchange as the exchange's bytes pass, and the func with which to
// replay one. Another forwarder records through [Inspector.Record] the
// same way.
package inspect

import (
	"iter"
	"net/http"
	"sync"
)

// Inspector records the HTTP exchanges that a forwarder (a forward.HTTP
// whose Recorder it is) hands it, and serves them, as an
// http.Handler, on a web page that updates live and replays a request to
// the app in one click, as it was or edited.
//
// It keeps the newest Max exchanges in a ring: method, URL, host, headers,
// status, timing, the client's address, and the first BodyLimit bytes of
// each body, the request's and the response's. The bodies themselves pass
// through whole and unchanged, as they arrive; the inspector keeps a copy
// of their first bytes only, and drops it with the exchange when Max newer
// ones have come. Several forwarders may share one Inspector; it is safe
// for concurrent use. The zero value is ready to use; an Inspector must
// not be copied after first use.
//
// Typical use, next to a forward.HTTP:
//
//	insp := new(inspect.Inspector)
//	go http.ListenAndServe("127.0.0.1:4040", insp) // loopback only: see below
//	return forward.HTTP{To: "127.0.0.1:3000", Recorder: insp}.Serve(l)
//
// or under a path of the app's own mux, on loopback:
//
//	mux.Handle("/inspect/", http.StripPrefix("/inspect", insp))
//
// The handler answers, relative to where it is mounted:
//
//	GET  /                            the page: HTML, CSS and JavaScript in one
//	                                  response, which loads nothing else
//	GET  /api/requests                {"max": Max, "version": V, "exchanges": [...]},
//	                                  newest first, without headers or body data
//	GET  /api/requests/{id}           one Exchange, whole
//	GET  /api/events                  server-sent events: an "exchange" event, whose
//	                                  data is the exchange as in the list, each time
//	                                  one arrives or changes (its response's header,
//	                                  its end); the event's id is the version V the
//	                                  change made, and the stream starts after the
//	                                  Last-Event-ID header's version, else after the
//	                                  since=V query parameter's, else now; the
//	                                  changes of 50 ms go together
//	POST /api/requests/{id}/replay    sends the request again and answers with the
//	                                  new Exchange, when its response has ended
//
// A replay sends the recorded request through the forwarder that recorded
// it (the replay func it gave Record), to the app, as the edge would:
// recorded, with ReplayOf set, and logged. Its POST body is empty to send the request as
// it was, or a JSON object whose members, each optional, replace the
// recorded ones:
//
//	{"method": "PUT", "url": "/path?query", "host": "app.example.com",
//	 "header": {"Name": ["value"]}, "body": "sent as its UTF-8 bytes"}
//
// A request whose body was longer than BodyLimit, or whose exchange is
// not done, replays only with a new body. A replay needs its forwarder's
// Serve running (503 otherwise).
//
// Security: the exchanges hold what clients sent (cookies, tokens), and a
// replay acts as them, so serve the handler on loopback only, never on a
// public address. Against the web pages of the developer's own browser,
// it answers only requests whose Host is an IP address, localhost or a
// name in Hosts (a page on a name that resolves to 127.0.0.1 is not the
// inspector's: DNS rebinding), and it replays only same-origin requests
// (as [http.CrossOriginProtection] tells) that carry the header
// X-Tunnelkit-Inspector: 1, which a page of another origin cannot send
// without the inspector's consent, which it never gives. Its page may not
// be framed.
type Inspector struct {
	// Max is how many exchanges are kept: the newest. Zero: 100. Read
	// when the first exchange is recorded.
	Max int

	// BodyLimit is how many bytes of each body, the request's and the
	// response's, an exchange keeps: the first. Zero: 64 KiB. Negative:
	// none. Read when the first exchange is recorded.
	BodyLimit int

	// Hosts are the host names, besides IP addresses, localhost and
	// *.localhost, that the handler answers under: the names of the
	// loopback address it is served on, if the browser reaches it by
	// another. Nil: none.
	Hosts []string

	once      sync.Once // init: the ring and limits
	bodyLimit int

	handlerOnce sync.Once // initHandler: the page and API
	mux         *http.ServeMux
	csrf        *http.CrossOriginProtection

	mu      sync.Mutex
	ring    []*entry // the exchange whose ID is id sits at (id-1) % len(ring)
	lastID  uint64
	version uint64                     // counts the changes: each new entry is one
	subs    map[chan struct{}]struct{} // of the event streams, woken by a change
}

const (
	defaultInspectorMax = 100
	defaultBodyLimit    = 64 << 10
	// headLimit bounds what an exchange keeps of the URL and headers.
	headLimit = 64 << 10
)

func (in *Inspector) init() {
	in.once.Do(func() {
		n := in.Max
		if n <= 0 {
			n = defaultInspectorMax
		}
		in.ring = make([]*entry, n)
		switch {
		case in.BodyLimit == 0:
			in.bodyLimit = defaultBodyLimit
		case in.BodyLimit > 0:
			in.bodyLimit = in.BodyLimit
		}
		in.subs = map[chan struct{}]struct{}{}
	})
}

// Exchanges returns the exchanges kept, newest first. Their headers and
// Data are shared: they must not be modified.
func (in *Inspector) Exchanges() []Exchange {
	in.init()
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]Exchange, 0, len(in.ring))
	for e := range in.newestFirst() {
		out = append(out, e.ex)
	}
	return out
}

// entry is an exchange as the ring holds it. It does not change once
// published: a change publishes a new entry, which takes the old one's
// place if it is still there.
type entry struct {
	ex      Exchange
	version uint64                    // the change that made it
	replay  func(*http.Request) error // sends it again: the recording forwarder's; nil: none
	body    bool                      // the request has a body, which the exchange holds once done
}

// summary is the exchange without its headers and body data: what the
// list and the events carry.
func (e *entry) summary() Exchange {
	x := e.ex
	x.RequestHeader, x.ResponseHeader = nil, nil
	x.RequestBody.Data, x.ResponseBody.Data = nil, nil
	return x
}

// newestFirst yields the entries of the ring, newest first. in.mu is held.
func (in *Inspector) newestFirst() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		n := uint64(len(in.ring))
		for id := in.lastID; id > 0 && id+n > in.lastID; id-- {
			if e := in.ring[(id-1)%n]; e != nil && e.ex.ID == id && !yield(e) {
				return
			}
		}
	}
}

// lookup returns the entry of the exchange id, or nil when it is not kept.
func (in *Inspector) lookup(id uint64) *entry {
	in.mu.Lock()
	defer in.mu.Unlock()
	if id == 0 || len(in.ring) == 0 {
		return nil
	}
	if e := in.ring[(id-1)%uint64(len(in.ring))]; e != nil && e.ex.ID == id {
		return e
	}
	return nil
}

// publish puts rec's exchange in the ring as it is now, under a new ID
// when it has none, and wakes the event streams. It returns the entry.
func (in *Inspector) publish(rec *recording) *entry {
	in.mu.Lock()
	defer in.mu.Unlock()
	if rec.ex.ID == 0 {
		in.lastID++
		rec.ex.ID = in.lastID
	}
	in.version++
	e := &entry{ex: rec.ex, version: in.version, replay: rec.replay, body: rec.body}
	slot := &in.ring[(e.ex.ID-1)%uint64(len(in.ring))]
	// An exchange that newer ones pushed out stays out.
	if *slot == nil || (*slot).ex.ID <= e.ex.ID {
		*slot = e
	}
	for ch := range in.subs {
		select {
		case ch <- struct{}{}:
		default: // already woken
		}
	}
	return e
}
