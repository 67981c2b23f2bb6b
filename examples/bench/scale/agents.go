//go:build unix

package main

// The agents role: one process holding many agent.Client sessions, each
// with one HTTP endpoint served by a tiny app of its own, and a status
// server the harness asks what they are doing.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchpki"
	"github.com/tunnelkit/tunnelkit/examples/bench/internal/benchproc"
)

// member is one agent of the process: a Client with its one endpoint.
type member struct {
	i    int
	name string
	c    *agent.Client
	l    *agent.Listener
	url0 string // the URL of the first bind

	mu     sync.Mutex
	up     bool      // a session is open and the endpoint bound on it
	edge   string    // the edge of that session
	upAt   time.Time // when it opened (or the agent moved to it)
	downs  int       // sessions that ended
	marked string    // the edge it was on when the harness marked it
}

// event records a session's change of state.
func (m *member) event(e agent.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch e.Kind {
	case agent.Connected:
		m.up, m.edge, m.upAt = true, e.Addr, time.Now()
	case agent.Disconnected:
		m.up = false
		m.downs++
	}
}

// agentsRole runs the agents of [first, first+count) until ctx ends.
func agentsRole(ctx context.Context, ctl *benchproc.Control, args []string) error {
	fs := flag.NewFlagSet("agents", flag.ContinueOnError)
	edges := fs.String("edges", "", "the edges' agent addresses, comma-separated")
	first := fs.Int("first", 0, "the index of the first agent")
	count := fs.Int("count", 0, "how many agents")
	token := fs.String("token", "", "the agents' token")
	caFile := fs.String("ca", "", "PEM file of the CA of the edges' certificates")
	workers := fs.Int("workers", 32, "agents binding at once")
	heartbeat := fs.Duration("heartbeat", 0, "the agents' heartbeat interval (0: the default)")
	seed := fs.Uint64("seed", 1, "seed of the order each agent tries the edges in")
	logLevel := fs.String("log-level", "error", "the least level of the agents' log lines (debug, info, warn, error), on stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addrs := strings.Split(*edges, ",")
	if *edges == "" || *count <= 0 {
		return errors.New("agents: -edges and -count are required")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	roots, err := benchpki.LoadRoots(*caFile)
	if err != nil {
		return err
	}
	tlsConfig := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS13}
	// Each agent's home edge is one of the edges in turn; after it, the
	// others in an order of its own, so that the agents of an edge that
	// dies spread over the rest.
	rng := rand.New(rand.NewPCG(*seed, uint64(*first)))
	ms := make([]*member, *count)
	for k := range ms {
		i := *first + k
		order := []string{addrs[i%len(addrs)]}
		for _, j := range rng.Perm(len(addrs)) {
			if j != i%len(addrs) {
				order = append(order, addrs[j])
			}
		}
		m := &member{i: i, name: agentName(i)}
		m.c = &agent.Client{
			Addrs:             order,
			Token:             *token,
			TLSConfig:         tlsConfig,
			HeartbeatInterval: *heartbeat,
			OnEvent:           m.event,
			Logger:            logger.With("agent", m.name),
		}
		ms[k] = m
	}
	st := &agentsStatus{ms: ms}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: st, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	ctl.Ready("status=" + ln.Addr().String())

	// Bind them, workers at a time, each until it is bound or ctx ends:
	// a bind that fails is tried again after a second.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for k := int(next.Add(1)) - 1; k < len(ms); k = int(next.Add(1)) - 1 {
				m := ms[k]
				for ctx.Err() == nil {
					l, err := m.c.Listen(ctx, "http://"+m.name+"."+domain)
					if err == nil {
						st.bind(m, l)
						break
					}
					st.failed.Add(1)
					fmt.Fprintf(os.Stderr, "agent %s: %v\n", m.name, err)
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
				}
			}
		})
	}
	wg.Wait()
	<-ctx.Done()
	for _, m := range ms {
		m.c.Close()
	}
	return nil
}

// agentName is the name of agent i's endpoint.
func agentName(i int) string { return "a" + strconv.Itoa(i) }

// agentsStatus answers the harness.
type agentsStatus struct {
	ms     []*member
	failed atomic.Int64 // binds that failed and were tried again
	mu     sync.Mutex   // guards the members' l and url0
}

// bind serves l, the endpoint of m: its app answers every request with
// the endpoint's name.
func (st *agentsStatus) bind(m *member, l *agent.Listener) {
	st.mu.Lock()
	m.l, m.url0 = l, l.URL()
	st.mu.Unlock()
	body := []byte(m.name)
	app := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go app.Serve(l)
}

// agentsReport is the answer to GET /status.
type agentsReport struct {
	Total      int            `json:"total"`
	Listening  int            `json:"listening"`   // Listen returned
	Up         int            `json:"up"`          // listening, and a session open
	SameURL    int            `json:"same_url"`    // listening with the URL of its first bind
	Failed     int64          `json:"failed"`      // binds tried again
	Downs      int            `json:"downs"`       // sessions that ended
	ByEdge     map[string]int `json:"by_edge"`     // up, by edge
	MarkedOn   int            `json:"marked"`      // marked by /mark
	Rebound    int            `json:"rebound"`     // marked, and up on another edge since
	ReboundMs  []float64      `json:"rebound_ms"`  // each one's wait after since
	MarkedURLs int            `json:"marked_urls"` // marked, rebound, with the URL of its first bind
	Names      []int          `json:"names,omitempty"`
}

// ServeHTTP answers GET /status (?since=UNIXNANO: the marked agents'
// rebinding after that time) and POST /mark?edge=ADDR, which marks the
// agents up on that edge and returns their indices.
func (st *agentsStatus) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rep agentsReport
	switch r.URL.Path {
	case "/status":
		since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
		rep = st.report(time.Unix(0, since))
	case "/mark":
		edge := r.URL.Query().Get("edge")
		for _, m := range st.ms {
			m.mu.Lock()
			m.marked = ""
			if m.up && m.edge == edge {
				m.marked = edge
				rep.Names = append(rep.Names, m.i)
			}
			m.mu.Unlock()
		}
		rep.MarkedOn = len(rep.Names)
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(rep)
}

func (st *agentsStatus) report(since time.Time) agentsReport {
	rep := agentsReport{Total: len(st.ms), Failed: st.failed.Load(), ByEdge: map[string]int{}}
	for _, m := range st.ms {
		st.mu.Lock()
		l, url0 := m.l, m.url0
		st.mu.Unlock()
		m.mu.Lock()
		up, edge, upAt, marked := m.up, m.edge, m.upAt, m.marked
		rep.Downs += m.downs
		m.mu.Unlock()
		if l == nil {
			continue
		}
		rep.Listening++
		same := l.URL() == url0
		if same {
			rep.SameURL++
		}
		if up {
			rep.Up++
			rep.ByEdge[edge]++
		}
		if marked != "" {
			rep.MarkedOn++
			if up && edge != marked && upAt.After(since) {
				rep.Rebound++
				rep.ReboundMs = append(rep.ReboundMs, float64(upAt.Sub(since))/float64(time.Millisecond))
				if same {
					rep.MarkedURLs++
				}
			}
		}
	}
	return rep
}

// getJSON GETs (or, with post, POSTs) url and decodes its JSON answer
// into v.
func getJSON(ctx context.Context, client *http.Client, url string, post bool, v any) error {
	method := http.MethodGet
	if post {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
