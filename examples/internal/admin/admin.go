// Package admin is the example edge's admin API (its -admin flag): a
// health check for load balancers, and under /v1/ a control plane's
// view of the edge and its levers, behind a bearer token.
//
//	GET    /healthz                              200 while serving, 503 while draining (no token)
//	GET    /v1/sessions                          {"sessions":[{"id","identity","remote","version","since","endpoints":[...]}]}
//	GET    /v1/endpoints                         {"endpoints":[{"url","proto","identity","session","requests","conns","bytes_in","bytes_out",...}]}
//	POST   /v1/identities/{identity}/disconnect  {"disconnected":N}; ?free=true frees its names at once,
//	                                             and revokes an anonymous identity's tickets (edge.Server.Disconnect)
//	GET    /v1/reservations                      {"reservations":[{"name","identity","warning"}]}
//	PUT    /v1/reservations/{name}               {"identity":"..."}: {"name","identity","warning"}
//	DELETE /v1/reservations/{name}               {"name"}
//	POST   /v1/drain                             202: the edge drains, then exits
//
// A request under /v1/ without the token (Authorization: Bearer TOKEN)
// gets 401. Errors are {"error":"..."}, with "name" under /v1/reservations/.
//
// A reservation's {name} is spelled as the edge stores it in every answer
// (edge.Server.ReservationName): in lower case, without a trailing dot,
// one label standing for the name under the edge's domain (so "com" is
// com.DOMAIN); PUT and DELETE take any spelling of it ("shop", "SHOP",
// "shop.example.test.").
// A reservation for an identity that KnownIdentity does not know carries
// a "warning" (no agent can bind the name until one has that identity). PUT
// answers 400 for a name or identity the edge refuses (a public suffix
// such as co.uk; an identity of spaces, control characters, or more than
// edge.MaxIdentity bytes), 409 for a name another identity holds, and 409
// too past the edge's bound on reservations (edge.Limits.Reservations,
// ReservationsPerIdentity; the error says which): the edge holds as many as
// it takes, and the call succeeds once some are removed, not by waiting.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/edge/view"
	"github.com/tunnelkit/tunnelkit/internal/safefile"
	"github.com/tunnelkit/tunnelkit/router"
)

// MinToken is the shortest token LoadToken takes, in bytes.
const MinToken = 16

// MaxTokenFile is the longest token file LoadToken takes, in bytes.
const MaxTokenFile = 4096

// API is the admin API of one edge. It is an http.Handler.
type API struct {
	// Server is the edge. Required.
	Server *edge.Server

	// Token is the SHA-256 of the bearer token of /v1/ (see LoadToken),
	// until SetToken. Zero: /v1/ is off (404), and /healthz alone is
	// served.
	Token [32]byte

	// Drain starts the edge's drain, as the command's SIGTERM does, and
	// returns at once. Nil: POST /v1/drain is refused (501).
	Drain func()

	// Logger receives a line per change made through the API. Nil: none.
	Logger *slog.Logger

	// KnownIdentity reports whether some agent can have identity (a token
	// names it): a reservation for one it does not know is made, with a
	// warning in the answer. Nil: no warning.
	KnownIdentity func(identity string) bool

	token atomic.Pointer[[32]byte] // SetToken's, in Token's place
}

// SetToken makes t the SHA-256 of the token of /v1/ from now on, in
// Token's place (zero: /v1/ is off), while the API serves: the requests
// under way finish with the token they were let in with.
func (a *API) SetToken(t [32]byte) { a.token.Store(&t) }

// currentToken is SetToken's token, or Token.
func (a *API) currentToken() [32]byte {
	if t := a.token.Load(); t != nil {
		return *t
	}
	return a.Token
}

// LoadToken reads the bearer token of path, its first line, and returns
// its SHA-256. It refuses a file that anyone but its owner may read or
// write (a token to the whole edge: chmod 600 it), one that is not a
// regular file (a named pipe, without waiting for a writer), one over
// MaxTokenFile bytes (never cut), and a token shorter than MinToken
// bytes.
func LoadToken(path string) ([32]byte, error) {
	b, err := safefile.ReadPrivate(path, MaxTokenFile, "the token gives the whole edge away")
	if err != nil {
		return [32]byte{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	token := strings.TrimSpace(line)
	if len(token) < MinToken {
		return [32]byte{}, fmt.Errorf("%s: want a token of at least %d bytes on its first line", path, MinToken)
	}
	return sha256.Sum256([]byte(token)), nil
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		a.healthz(w, r)
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/v1/") {
		answer(w, http.StatusNotFound, errorBody("not found: /healthz, and /v1/ with a token"))
		return
	}
	if a.currentToken() == ([32]byte{}) {
		answer(w, http.StatusNotFound, errorBody("the admin API is off: give the edge -admin-token-file"))
		return
	}
	if !a.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tunnelkit edge"`)
		answer(w, http.StatusUnauthorized, errorBody("unauthorized: want Authorization: Bearer and the token of -admin-token-file"))
		return
	}
	a.v1().ServeHTTP(w, r)
}

// authorized reports whether r carries the token, compared in constant
// time (as digests, of one length whatever was sent).
func (a *API) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	want := a.currentToken()
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// healthz answers 200 while the edge serves, 503 once it drains.
func (a *API) healthz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		answer(w, http.StatusMethodNotAllowed, errorBody("GET /healthz"))
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	if a.Server.Draining() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}

// v1 routes the API's requests.
func (a *API) v1() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		sessions := a.Server.Sessions()
		if sessions == nil {
			sessions = []view.Session{}
		}
		answer(w, http.StatusOK, map[string]any{"sessions": sessions})
	})
	mux.HandleFunc("GET /v1/endpoints", func(w http.ResponseWriter, r *http.Request) {
		endpoints := a.Server.Endpoints()
		if endpoints == nil {
			endpoints = []view.Endpoint{}
		}
		answer(w, http.StatusOK, map[string]any{"endpoints": endpoints})
	})
	mux.HandleFunc("POST /v1/identities/{identity}/disconnect", func(w http.ResponseWriter, r *http.Request) {
		identity, free := r.PathValue("identity"), r.URL.Query().Get("free") == "true"
		n := a.Server.Disconnect(identity, free)
		a.log("disconnected", "identity", identity, "sessions", n, "free", free)
		answer(w, http.StatusOK, map[string]int{"disconnected": n})
	})
	mux.HandleFunc("GET /v1/reservations", func(w http.ResponseWriter, r *http.Request) {
		res, err := a.Server.Reservations(r.Context())
		if err != nil {
			a.fail(w, err)
			return
		}
		out := make([]reservation, 0, len(res))
		for _, r := range res {
			out = append(out, a.reservation(r.Name, r.Identity))
		}
		answer(w, http.StatusOK, map[string]any{"reservations": out})
	})
	mux.HandleFunc("PUT /v1/reservations/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := a.storedName(r.PathValue("name"))
		var body struct {
			Identity string `json:"identity"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.Identity == "" {
			answer(w, http.StatusBadRequest, map[string]string{"error": `want a body {"identity":"..."}`, "name": name})
			return
		}
		if err := a.Server.Reserve(r.Context(), r.PathValue("name"), body.Identity); err != nil {
			a.fail(w, err, name)
			return
		}
		res := a.reservation(name, body.Identity)
		a.log("reserved", "name", name, "identity", body.Identity, "warning", res.Warning)
		answer(w, http.StatusOK, res)
	})
	mux.HandleFunc("DELETE /v1/reservations/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := a.storedName(r.PathValue("name"))
		if err := a.Server.Unreserve(r.Context(), r.PathValue("name")); err != nil {
			a.fail(w, err, name)
			return
		}
		a.log("unreserved", "name", name)
		answer(w, http.StatusOK, map[string]string{"name": name})
	})
	mux.HandleFunc("POST /v1/drain", func(w http.ResponseWriter, r *http.Request) {
		if a.Drain == nil {
			answer(w, http.StatusNotImplemented, errorBody("this edge cannot be drained through its API"))
			return
		}
		a.log("drain asked")
		a.Drain()
		answer(w, http.StatusAccepted, map[string]string{"status": "draining"})
	})
	return mux
}

// reservation is a router.Reservation in the API's JSON, with a warning
// when no agent can have its identity.
type reservation struct {
	Name     string `json:"name"`
	Identity string `json:"identity"`
	Warning  string `json:"warning,omitempty"`
}

// reservation returns the reservation of name for identity in the API's
// JSON.
func (a *API) reservation(name, identity string) reservation {
	res := reservation{Name: name, Identity: identity}
	if a.KnownIdentity != nil && !a.KnownIdentity(identity) {
		res.Warning = fmt.Sprintf("no token of this edge names the identity %q: no agent can bind %s until one does", identity, name)
	}
	return res
}

// storedName returns name of a request's path as the edge stores a
// reservation of it, or as it came (its first 253 bytes) when it is no
// host name.
func (a *API) storedName(name string) string {
	if stored, ok := a.Server.ReservationName(name); ok {
		return stored
	}
	return strings.ToValidUTF8(name[:min(len(name), 253)], "?")
}

// fail answers the error of a call to the edge with its status; with the
// name of the reservation asked for, when there is one.
func (a *API) fail(w http.ResponseWriter, err error, name ...string) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, router.ErrNameTaken), errors.Is(err, edge.ErrReservationLimit):
		code = http.StatusConflict
	case errors.Is(err, router.ErrNoReservation):
		code = http.StatusNotFound
	case errors.Is(err, edge.ErrInvalidReservation):
		code = http.StatusBadRequest
	case errors.Is(err, edge.ErrReservationsUnsupported):
		code = http.StatusNotImplemented
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	}
	body := errorBody(strings.TrimPrefix(err.Error(), "edge: "))
	if len(name) > 0 {
		body["name"] = name[0]
	}
	answer(w, code, body)
}

func (a *API) log(msg string, args ...any) {
	if a.Logger != nil {
		a.Logger.Info("admin: "+msg, args...)
	}
}

func errorBody(msg string) map[string]string { return map[string]string{"error": msg} }

// answer writes v as JSON with code.
func answer(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// NewServer returns the http.Server of the API, with bounds on slow
// clients.
func NewServer(a *API) *http.Server {
	return &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
}
