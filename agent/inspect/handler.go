package inspect

import (
	"cmp"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// inspectorPage is the page the Inspector serves: one file, its CSS and
// JavaScript inline.
//
//go:embed inspect.html
var inspectorPage []byte

// inspectorCSP returns the page's Content-Security-Policy: its own inline
// script and style, by their hashes, and requests to its own origin,
// nothing else; no framing.
var inspectorCSP = sync.OnceValue(func() string {
	hash := func(open, close string) string {
		s := string(inspectorPage)
		i := strings.Index(s, open)
		j := strings.Index(s, close)
		if i < 0 || j < i {
			panic("inspect: inspect.html has no " + open)
		}
		sum := sha256.Sum256([]byte(s[i+len(open) : j]))
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	return "default-src 'none'; script-src " + hash("<script>", "</script>") +
		"; style-src " + hash("<style>", "</style>") +
		"; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
})

// inspectorHeader is the header that the page's requests carry, and that
// a replay needs: a page of another origin cannot send it without a CORS
// preflight, which the inspector never approves.
const inspectorHeader = "X-Tunnelkit-Inspector"

// eventsBatch is how long an event stream lets changes gather before it
// sends them.
const eventsBatch = 50 * time.Millisecond

// initHandler sets up the page and the API, at the first request: an
// Inspector that records only needs neither.
func (in *Inspector) initHandler() {
	in.csrf = http.NewCrossOriginProtection()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", in.servePage)
	mux.HandleFunc("GET /api/requests", in.serveList)
	mux.HandleFunc("GET /api/requests/{id}", in.serveExchange)
	mux.HandleFunc("GET /api/events", in.serveEvents)
	mux.HandleFunc("POST /api/requests/{id}/replay", in.serveReplay)
	in.mux = mux
}

// ServeHTTP serves the inspector's page and API; see [Inspector].
func (in *Inspector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in.init()
	in.handlerOnce.Do(in.initHandler)
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if !in.hostAllowed(r.Host) {
		httpError(w, http.StatusForbidden, fmt.Sprintf("host %q is not the inspector's: serve it on loopback and browse to it by address or as localhost, or add the name to Inspector.Hosts", r.Host))
		return
	}
	in.mux.ServeHTTP(w, r)
}

// hostAllowed tells whether host, a request's Host, names the inspector:
// an IP address, which a page of another origin cannot have, or
// localhost, or one of in.Hosts. Another name may be a web page's whose
// DNS now answers 127.0.0.1.
func (in *Inspector) hostAllowed(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return slices.ContainsFunc(in.Hosts, func(h string) bool { return strings.EqualFold(h, host) })
}

func (in *Inspector) servePage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", inspectorCSP())
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	w.Write(inspectorPage)
}

// exchangeList is the JSON of GET /api/requests.
type exchangeList struct {
	Max       int        `json:"max"`
	Version   uint64     `json:"version"`
	Exchanges []Exchange `json:"exchanges"`
}

func (in *Inspector) serveList(w http.ResponseWriter, r *http.Request) {
	in.mu.Lock()
	l := exchangeList{Max: len(in.ring), Version: in.version, Exchanges: make([]Exchange, 0, len(in.ring))}
	for e := range in.newestFirst() {
		l.Exchanges = append(l.Exchanges, e.summary())
	}
	in.mu.Unlock()
	writeJSON(w, http.StatusOK, l)
}

// entryOf returns the entry that r's {id} names, or answers 404.
func (in *Inspector) entryOf(w http.ResponseWriter, r *http.Request) *entry {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	if e := in.lookup(id); err == nil && e != nil {
		return e
	}
	httpError(w, http.StatusNotFound, fmt.Sprintf("no exchange %q is kept", r.PathValue("id")))
	return nil
}

func (in *Inspector) serveExchange(w http.ResponseWriter, r *http.Request) {
	if e := in.entryOf(w, r); e != nil {
		writeJSON(w, http.StatusOK, e.ex)
	}
}

// serveEvents streams the changes, as server-sent events, until the
// client goes away.
func (in *Inspector) serveEvents(w http.ResponseWriter, r *http.Request) {
	since, err := strconv.ParseUint(r.Header.Get("Last-Event-ID"), 10, 64)
	if err != nil {
		since, err = strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
	}
	wake := make(chan struct{}, 1)
	in.mu.Lock()
	if err != nil {
		since = in.version
	} else if since > in.version {
		// A version of another inspector (the agent restarted): all of
		// this one's is new.
		since = 0
	}
	in.subs[wake] = struct{}{}
	in.mu.Unlock()
	defer func() {
		in.mu.Lock()
		delete(in.subs, wake)
		in.mu.Unlock()
	}()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	// Reconnect soon when the stream breaks: the agent restarts.
	if _, err := fmt.Fprint(w, "retry: 1000\n\n"); err != nil {
		return
	}
	var (
		changed []*entry
		buf     []byte
	)
	for {
		changed = changed[:0]
		in.mu.Lock()
		for e := range in.newestFirst() {
			if e.version > since {
				changed = append(changed, e)
			}
		}
		in.mu.Unlock()
		slices.SortFunc(changed, func(a, b *entry) int { return cmp.Compare(a.version, b.version) })
		for _, e := range changed {
			data, err := json.Marshal(e.summary())
			if err != nil {
				return
			}
			buf = fmt.Appendf(buf[:0], "id: %d\nevent: exchange\ndata: %s\n\n", e.version, data)
			if _, err := w.Write(buf); err != nil {
				return
			}
			since = e.version
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-wake:
		case <-r.Context().Done():
			return
		}
		// Let the changes of a moment come together: an exchange changes
		// three times in a millisecond, and a busy app has many.
		select {
		case <-time.After(eventsBatch):
		case <-r.Context().Done():
			return
		}
	}
}

// serveReplay replays the exchange that r's {id} names, when r is the
// inspector page's own.
func (in *Inspector) serveReplay(w http.ResponseWriter, r *http.Request) {
	if err := in.csrf.Check(r); err != nil {
		httpError(w, http.StatusForbidden, "replay refused: "+err.Error())
		return
	}
	if r.Header.Get(inspectorHeader) != "1" {
		httpError(w, http.StatusForbidden, "replay refused: the request has no "+inspectorHeader+": 1 header, which the inspector's page sends")
		return
	}
	e := in.entryOf(w, r)
	if e == nil {
		return
	}
	var edit replayEdit
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&edit); err != nil && !errors.Is(err, io.EOF) {
		httpError(w, http.StatusBadRequest, "replay: the edit is not JSON: "+err.Error())
		return
	}
	x, err := in.replay(r.Context(), e, &edit, r.RemoteAddr)
	if err != nil {
		var re *replayError
		if errors.As(err, &re) {
			httpError(w, re.status, err.Error())
		} else {
			httpError(w, http.StatusBadGateway, err.Error())
		}
		return
	}
	writeJSON(w, http.StatusOK, x)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	b, err := json.Marshal(v)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.WriteHeader(status)
	w.Write(b)
}

// httpError answers with status and {"error": msg}.
func httpError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{"inspector: " + msg})
	w.Write(b)
}
