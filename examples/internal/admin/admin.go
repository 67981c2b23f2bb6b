// Package admin is the example edge's admin API (its -admin flag): a
// health check for load balancers, and under /v1/ a control plane's
// view of the edge and its levers, behind a bearer token.
//
//	GET    /healthz                              200 while serving, 503 while draining (no token)
//	GET    /v1/sessions                          {"sessions":[{"id","identity","remote","version","since","endpoints":[...]}]}
//	GET    /v1/endpoints                         {"endpoints":[{"url","proto","identity","session","requests","conns","bytes_in","bytes_out",...}]}
//	POST   /v1/identities/{identity}/disconnect  {"disconnected":N}; ?free=true frees its names at once
//	GET    /v1/reservations                      {"reservations":[{"name","identity"}]}
//	PUT    /v1/reservations/{name}               {"identity":"..."}
//	DELETE /v1/reservations/{name}
//	POST   /v1/drain                             202: the edge drains, then exits
//
// A request under /v1/ without the token (Authorization: Bearer TOKEN)
// gets 401. Errors are {"error":"..."}.
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

	// Token is the SHA-256 of the bearer token of /v1/ (see LoadToken).
	// Zero: /v1/ is off (404), and /healthz alone is served.
	Token [32]byte

	// Drain starts the edge's drain, as the command's SIGTERM does, and
	// returns at once. Nil: POST /v1/drain is refused (501).
	Drain func()

	// Logger receives a line per change made through the API. Nil: none.
	Logger *slog.Logger
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
	if a.Token == ([32]byte{}) {
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
	return subtle.ConstantTimeCompare(got[:], a.Token[:]) == 1
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
			out = append(out, reservation(r))
		}
		answer(w, http.StatusOK, map[string]any{"reservations": out})
	})
	mux.HandleFunc("PUT /v1/reservations/{name}", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Identity string `json:"identity"`
		}
		dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.Identity == "" {
			answer(w, http.StatusBadRequest, errorBody(`want a body {"identity":"..."}`))
			return
		}
		name := r.PathValue("name")
		if err := a.Server.Reserve(r.Context(), name, body.Identity); err != nil {
			a.fail(w, err)
			return
		}
		a.log("reserved", "name", name, "identity", body.Identity)
		answer(w, http.StatusOK, reservation{name, body.Identity})
	})
	mux.HandleFunc("DELETE /v1/reservations/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if err := a.Server.Unreserve(r.Context(), name); err != nil {
			a.fail(w, err)
			return
		}
		a.log("unreserved", "name", name)
		w.WriteHeader(http.StatusNoContent)
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

// reservation is a router.Reservation in the API's JSON.
type reservation struct {
	Name     string `json:"name"`
	Identity string `json:"identity"`
}

// fail answers the error of a call to the edge with its status.
func (a *API) fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, router.ErrNameTaken):
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
	answer(w, code, errorBody(strings.TrimPrefix(err.Error(), "edge: ")))
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
