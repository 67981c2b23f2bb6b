package edgecmd

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/examples/internal/admin"
	"github.com/tunnelkit/tunnelkit/policy"
)

// What the edge takes from its settings while it runs. A SIGHUP reads the
// flags and the -config file again, checks everything, and swaps in at once
// what changed of these, or keeps every one as it was; the other settings
// take a restart, and the SIGHUP names those that changed.

// live is the part of the settings that a SIGHUP applies.
type live struct {
	tokensGiven bool       // -token, -tokens or the file's tokens: agents need one
	ids         identities // the tokens (none: every agent is refused)
	hasPolicy   bool       // -policy, -policy-kinds, -policy-actions, -oidc-issuer-allowed or the file's policy
	op          policy.Operator
	limits      edge.Limits
	adminToken  [32]byte // zero: no -admin-token-file
	level       slog.Level
}

// liveFlags are the flags whose changes a SIGHUP applies.
var liveFlags = []string{
	"token", "tokens", "policy", "policy-kinds", "policy-actions", "oidc-issuer-allowed", "admin-token-file", "log-level",
	"max-pending", "max-pending-per-source", "max-sessions-per-identity", "max-endpoints", "max-endpoints-per-identity",
	"max-endpoints-per-source", "max-endpoints-total", "max-reservations", "max-reservations-per-identity",
	"max-auth-failures", "max-refused-binds", "client-share", "conns-per-source", "handshakes-per-source",
	"agent-handshakes",
}

// limitsOf returns the edge's Limits as the flags of fs say.
func limitsOf(fs *flag.FlagSet) edge.Limits {
	return edge.Limits{
		SessionsPerIdentity:      intFlag(fs, "max-sessions-per-identity"),
		PendingSessions:          intFlag(fs, "max-pending"),
		PendingSessionsPerSource: intFlag(fs, "max-pending-per-source"),
		EndpointsPerSession:      intFlag(fs, "max-endpoints"),
		EndpointsPerIdentity:     intFlag(fs, "max-endpoints-per-identity"),
		EndpointsPerSource:       intFlag(fs, "max-endpoints-per-source"),
		Endpoints:                intFlag(fs, "max-endpoints-total"),
		Reservations:             intFlag(fs, "max-reservations"),
		ReservationsPerIdentity:  intFlag(fs, "max-reservations-per-identity"),
		AuthFailures:             intFlag(fs, "max-auth-failures"),
		RefusedBinds:             intFlag(fs, "max-refused-binds"),
		ClientShare:              fs.Lookup("client-share").Value.(flag.Getter).Get().(float64),
		ConnsPerSource:           intFlag(fs, "conns-per-source"),
		HandshakesPerSource:      intFlag(fs, "handshakes-per-source"),
		Handshakes:               intFlag(fs, "agent-handshakes"),
	}
}

func intFlag(fs *flag.FlagSet, name string) int {
	return fs.Lookup(name).Value.(flag.Getter).Get().(int)
}

func stringFlag(fs *flag.FlagSet, name string) string { return fs.Lookup(name).Value.String() }

// readLive reads what a SIGHUP applies from fs and the -config file's
// file, checking all of it.
func readLive(fs *flag.FlagSet, file *fileConfig) (*live, error) {
	l := &live{limits: limitsOf(fs)}
	token, tokensFile := stringFlag(fs, "token"), stringFlag(fs, "tokens")
	l.tokensGiven = token != "" || tokensFile != "" || file.tokensGiven
	l.ids = identities{}
	if token != "" {
		if err := l.ids.add(token, "token"); err != nil {
			return nil, fmt.Errorf("-token: %w", err)
		}
	}
	if tokensFile != "" {
		if err := l.ids.load(tokensFile); err != nil {
			return nil, err
		}
	}
	for _, t := range file.tokens {
		if _, dup := l.ids[hashToken(t.Token)]; dup {
			return nil, fmt.Errorf("%s: tokens: a token given twice (identity %s)", file.path, t.Identity)
		}
		if err := l.ids.add(t.Token, t.Identity); err != nil {
			return nil, fmt.Errorf("%s: tokens: %w", file.path, err)
		}
	}
	issuers := fs.Lookup("oidc-issuer-allowed").Value.(flag.Getter).Get().([]string)
	var err error
	l.op, l.hasPolicy, err = operatorPolicy(stringFlag(fs, "policy"), file.policy, stringFlag(fs, "policy-kinds"), stringFlag(fs, "policy-actions"), issuers)
	if err != nil {
		return nil, err
	}
	if path := stringFlag(fs, "admin-token-file"); path != "" {
		if stringFlag(fs, "admin") == "" {
			return nil, fmt.Errorf("-admin-token-file is the token of -admin's API: give -admin too")
		}
		if l.adminToken, err = admin.LoadToken(path); err != nil {
			return nil, fmt.Errorf("-admin-token-file: %w", err)
		}
	}
	if err := l.level.UnmarshalText([]byte(stringFlag(fs, "log-level"))); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", stringFlag(fs, "log-level"))
	}
	return l, nil
}

// reloader applies the settings of each SIGHUP to a running edge.
type reloader struct {
	srv    *edge.Server
	log    *slog.Logger
	level  *slog.LevelVar
	tokens *atomic.Pointer[identities]      // the edge's Authenticate reads it; nil: it takes any agent
	op     *atomic.Pointer[policy.Operator] // the edge's Policy reads it; nil: it has none
	api    *admin.API                       // nil: no -admin
	args   []string                         // the command line
	start  *flag.FlagSet                    // as the edge started
	cur    *live
}

// reload reads the settings again and applies what changed of those that
// change live; it names the others that changed, which take a restart.
// Settings that do not read, or do not check, change nothing.
func (r *reloader) reload() {
	fs, file, err := reparse(r.start, r.args)
	var next *live
	if err == nil {
		next, err = readLive(fs, file)
	}
	if err != nil {
		r.log.Error("SIGHUP: the settings were not read again; every one stays as it was", "err", err)
		return
	}
	var restart []string
	for _, name := range changedFlags(r.start, fs) {
		if !slices.Contains(liveFlags, name) {
			restart = append(restart, name)
		}
	}
	var applied []string
	switch {
	case next.tokensGiven != (r.tokens != nil):
		restart = append(restart, "tokens (to take any agent, or to need a token)")
	case r.tokens != nil && !maps.Equal(next.ids, r.cur.ids):
		r.tokens.Store(&next.ids)
		applied = append(applied, fmt.Sprintf("tokens (%d)", len(next.ids)))
		if len(next.ids) == 0 {
			r.log.Warn("SIGHUP: no tokens: every agent is refused until one is given")
		}
	}
	if r.tokens == nil || next.tokensGiven != (r.tokens != nil) {
		next.ids, next.tokensGiven = r.cur.ids, r.cur.tokensGiven
	}
	switch {
	case r.op == nil && next.hasPolicy:
		restart = append(restart, "policy (the edge started without an operator policy: start it with one, even {}, to change it live)")
		next.op, next.hasPolicy = r.cur.op, r.cur.hasPolicy
	case r.op != nil && !reflect.DeepEqual(next.op, r.cur.op):
		r.op.Store(&next.op)
		r.srv.PolicyChanged()
		applied = append(applied, "policy")
	}
	if next.limits != r.cur.limits {
		if err := r.srv.SetLimits(next.limits); err != nil {
			r.log.Error("SIGHUP: limits not changed", "err", err)
			next.limits = r.cur.limits
		} else {
			applied = append(applied, "limits")
		}
	}
	if next.adminToken != r.cur.adminToken {
		if r.api == nil {
			restart = append(restart, "admin-token-file (the edge started without -admin)")
			next.adminToken = r.cur.adminToken
		} else {
			r.api.SetToken(next.adminToken)
			applied = append(applied, "admin-token-file")
		}
	}
	if next.level != r.cur.level {
		r.level.Set(next.level)
		applied = append(applied, "log-level "+strings.ToLower(next.level.String()))
	}
	r.cur = next
	if len(restart) > 0 {
		r.log.Warn("SIGHUP: changed, but taking a restart; the edge goes on with them as they were", "settings", strings.Join(restart, ", "))
	}
	r.log.Info("SIGHUP: the settings were read again", "applied", strings.Join(applied, ", "))
}

// reparse parses args again into a new flag set of start's flags, each
// from its default, and reads the -config file again into it.
func reparse(start *flag.FlagSet, args []string) (*flag.FlagSet, *fileConfig, error) {
	fs := flag.NewFlagSet(start.Name(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	start.VisitAll(func(f *flag.Flag) {
		v := f.Value
		if t := reflect.TypeOf(v); t.Kind() == reflect.Pointer {
			v = reflect.New(t.Elem()).Interface().(flag.Value)
			if _, repeats := v.(interface{ repeats() }); !repeats {
				v.Set(f.DefValue) // what the flag took at first: it takes it again
			}
		}
		fs.Var(v, f.Name, f.Usage)
	})
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	file := &fileConfig{}
	if path := stringFlag(fs, "config"); path != "" {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		var err error
		if file, err = applyConfig(fs, path, given); err != nil {
			return nil, nil, err
		}
	}
	return fs, file, nil
}

// changedFlags names the flags whose values differ between a and b, of
// the same flags.
func changedFlags(a, b *flag.FlagSet) []string {
	var names []string
	a.VisitAll(func(f *flag.Flag) {
		if g := b.Lookup(f.Name); g != nil && g.Value.String() != f.Value.String() {
			names = append(names, f.Name)
		}
	})
	return names
}
