// Package names keeps who holds which name on an edge beyond a session:
// the record of holders that an edge restarted reads back (Record), and
// the tickets that agents keep and present back (Signer).
package names

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
)

// The edge's record of who holds which name (Server.StateDir), for its
// in-memory router, which forgets every name when the process ends: a
// restart reads it and reserves each name for the identity that held it
// when the edge stopped, as the end of a session does, so that the name
// goes back to that identity and to no one else.
//
// The record is a journal of JSON lines in StateDir, one per change of a
// name's holder: who holds it, and until when a reservation keeps it
// (none while it has routes); or that nobody does. The operator's
// reservations (router.Reserver) have lines of their own, each written
// before the reservation is granted, and outlive every restart (until
// removed, or until the record is lost). So do the identities revoked
// (router.Revoker: Server.Disconnect), each a line saying until when,
// dropped at the first snapshot after that time. A clean stop ends it
// with a line saying when. Each start rewrites it as a snapshot of what it
// restored, and it is compacted so whenever it grows past twice what it
// describes. A line is written when the change is made, before the agent
// hears of it, so a crash loses nothing the edge answered.

// recordFile is the record's name in StateDir.
const recordFile = "names.jsonl"

// maxRecord bounds the record an edge reads back: far more than the
// lines of the most names an edge holds.
const maxRecord = 1 << 30

// recordLine is one line of the record.
type recordLine struct {
	Reserved string    `json:"reserved,omitempty"` // a name the operator reserved for Identity; none: removed
	Revoked  string    `json:"revoked,omitempty"`  // an identity revoked until Until
	Proto    string    `json:"proto,omitempty"`
	Name     string    `json:"name,omitempty"`
	Identity string    `json:"identity,omitempty"` // empty: nobody holds the name
	Until    time.Time `json:"until,omitzero"`     // reserved until; zero: it has routes
	Stopped  time.Time `json:"stopped,omitzero"`   // the edge stopped cleanly then
}

// Endpoint is an endpoint: a protocol and a name pattern.
type Endpoint struct{ Proto, Name string }

// Holding is who holds a name: an identity, and until when a reservation
// keeps it for them (zero while it has routes).
type Holding struct {
	Identity string
	Until    time.Time
}

// restoredName is a name kept, at a restart, for the identity that held
// it when the edge stopped.
type restoredName struct{ name, identity string }

// Record is an edge's in-memory router, writing each change of who holds
// a name to the record in a directory (Server.StateDir). Make one with
// Open; a nil *Record does nothing.
type Record struct {
	*router.MemoryRouter
	path string
	log  *slog.Logger
	now  func() time.Time // Server.Clock

	// What the start restored, until restoredUntil. Read-only after the
	// start.
	restored      map[baseKey]restoredName
	restoredHeld  map[Endpoint]Holding
	restoredUntil time.Time

	mu      sync.Mutex
	f       *os.File             // nil once stopped, or once writing failed
	held    map[Endpoint]Holding // guarded by mu once Open returned
	revoked map[string]time.Time // the identities revoked, until when
	lines   int                  // written since the last snapshot
}

// Open reads the record in dir, reserves in mem, for grace, each name
// it says was held when the edge stopped, and starts a new record of mem.
// No record is a first start: nothing is reserved. now is the edge's
// clock.
func Open(dir string, mem *router.MemoryRouter, grace time.Duration, log *slog.Logger, now func() time.Time) (*Record, error) {
	if err := safefile.PrivateDir(dir); err != nil {
		return nil, err
	}
	n := &Record{MemoryRouter: mem, path: filepath.Join(dir, recordFile), log: log, now: now, restored: map[baseKey]restoredName{}, held: map[Endpoint]Holding{}, revoked: map[string]time.Time{}}
	read, err := readRecordFile(n.path)
	before, reserved, revoked := read.held, read.reserved, read.revoked
	switch {
	case errors.Is(err, fs.ErrNotExist):
		log.Info("first start: no record of names held before", "record", n.path)
	case err != nil:
		return nil, err
	}
	for name, id := range reserved {
		if err := mem.AddReservation(context.Background(), router.Reservation{Name: name, Identity: id}); err != nil {
			log.Error("a reservation of the record not restored", "name", name, "identity", id, "err", err)
		}
	}
	for id, until := range revoked {
		if until.After(now()) {
			mem.Revoke(context.Background(), id, until)
			n.revoked[id] = until
		}
	}
	n.restoredUntil = now().Add(grace)
	for k, h := range before {
		r := router.Route{Proto: k.Proto, Name: k.Name, Identity: h.Identity}
		if grace <= 0 {
			break // nothing is kept
		}
		if err := mem.Reserve(context.Background(), r, grace); err != nil {
			log.Warn("a name of the record not restored", "proto", k.Proto, "name", k.Name, "err", err)
			continue
		}
		n.held[k] = Holding{h.Identity, n.restoredUntil}
		n.restored[baseOf(k.Proto, k.Name)] = restoredName{k.Name, h.Identity}
	}
	n.restoredHeld = maps.Clone(n.held)
	switch {
	case err != nil:
	case grace <= 0:
		log.Info("restart: names held before are not kept (Timeouts.RestartGrace or Grace is negative)", "record", n.path)
	default:
		log.Info("restart: names held when the edge stopped are kept for their holders", "names", len(n.held), "until", n.restoredUntil.UTC().Format(time.TimeOnly), "record", n.path)
	}
	if err := n.snapshotLocked(); err != nil {
		return nil, err
	}
	return n, nil
}

// readRecord returns the names a record says were held when the edge
// stopped (when its last line says so, or else when the file was last
// written), and the operator's reservations, identities by name. A line
// cut short by a crash is skipped.
func readRecord(path string) (held map[Endpoint]Holding, reserved map[string]string, err error) {
	r, err := readRecordFile(path)
	return r.held, r.reserved, err
}

// recordRead is what a record says: readRecord's, and the identities
// revoked, until when.
type recordRead struct {
	held     map[Endpoint]Holding
	reserved map[string]string
	revoked  map[string]time.Time
}

// readRecordFile reads the record at path (see readRecord).
func readRecordFile(path string) (recordRead, error) {
	b, info, err := safefile.ReadOwn(path, maxRecord)
	if err != nil {
		return recordRead{}, err
	}
	held, reserved, revoked := map[Endpoint]Holding{}, map[string]string{}, map[string]time.Time{}
	var stopped time.Time
	for line := range bytes.Lines(b) {
		var l recordLine
		if json.Unmarshal(line, &l) != nil {
			continue
		}
		stopped = l.Stopped
		switch k := (Endpoint{l.Proto, l.Name}); {
		case l.Revoked != "":
			if l.Until.After(revoked[l.Revoked]) {
				revoked[l.Revoked] = l.Until
			}
		case l.Reserved != "" && l.Identity == "":
			delete(reserved, l.Reserved)
		case l.Reserved != "":
			reserved[l.Reserved] = l.Identity
		case l.Proto == "" || l.Name == "":
		case l.Identity == "":
			delete(held, k)
		default:
			held[k] = Holding{l.Identity, l.Until}
		}
	}
	if stopped.IsZero() {
		stopped = info.ModTime()
	}
	for k, h := range held {
		if !h.Until.IsZero() && h.Until.Before(stopped) {
			delete(held, k) // lapsed before the edge stopped
		}
	}
	return recordRead{held, reserved, revoked}, nil
}

// baseKey is a name's place in the ownership rules: its namespace (host
// names, or TCP ports) and its base, the name without "*.".
type baseKey struct {
	tcp  bool
	base string
}

func baseOf(proto, name string) baseKey {
	return baseKey{proto == wire.ProtoTCP, strings.TrimPrefix(name, "*.")}
}

// Bind implements router.Router: the MemoryRouter's, recorded.
func (n *Record) Bind(ctx context.Context, r router.Route) error {
	if err := n.MemoryRouter.Bind(ctx, r); err != nil {
		return n.explain(err, r)
	}
	n.note(r.Proto, r.Name)
	return nil
}

// Move implements router.Mover: the MemoryRouter's, recorded and
// explained as Bind is (the embedded MemoryRouter's would be neither).
func (n *Record) Move(ctx context.Context, r router.Route, from string) error {
	if err := n.MemoryRouter.Move(ctx, r, from); err != nil {
		return n.explain(err, r)
	}
	n.note(r.Proto, r.Name)
	return nil
}

// Unbind implements router.Router: the MemoryRouter's, recorded.
func (n *Record) Unbind(ctx context.Context, r router.Route, reserve time.Duration) error {
	err := n.MemoryRouter.Unbind(ctx, r, reserve)
	n.note(r.Proto, r.Name)
	return err
}

// explain adds to a refusal of r that the name it conflicts with, r's
// own or one above it, was kept at the restart for the identity that held
// it when the edge stopped.
func (n *Record) explain(err error, r router.Route) error {
	if !errors.Is(err, router.ErrNameTaken) || len(n.restored) == 0 || !n.now().Before(n.restoredUntil) {
		return err
	}
	for k := baseOf(r.Proto, r.Name); ; {
		if h, ok := n.restored[k]; ok && h.identity != r.Identity {
			return fmt.Errorf("%w, who held %s when the edge stopped: it is kept for them until %s UTC (an endpoint ticket from before it changed hands does not count)",
				err, h.name, n.restoredUntil.UTC().Format(time.TimeOnly))
		}
		_, above, ok := strings.Cut(k.base, ".")
		if k.tcp || !ok {
			return err
		}
		k.base = above
	}
}

// note records who holds proto's name now, if that changed. Asking the
// router and writing happen under one lock, so the record's last line for
// a name is the router's answer after the last change to it.
func (n *Record) note(proto, name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.f == nil {
		return
	}
	k := Endpoint{proto, name}
	id, until, ok := n.Holder(proto, name)
	h, had := n.held[k]
	if ok == had && h == (Holding{id, until}) {
		return
	}
	if ok {
		n.held[k] = Holding{id, until}
	} else {
		delete(n.held, k)
	}
	n.writeLocked(recordLine{Proto: proto, Name: name, Identity: id, Until: until})
	if n.f != nil && n.lines > 2*len(n.held)+1024 {
		if err := n.snapshotLocked(); err != nil {
			n.failLocked(err)
		}
	}
}

// writeLocked appends a line to the record.
func (n *Record) writeLocked(l recordLine) {
	b, err := json.Marshal(l)
	if err == nil {
		_, err = n.f.Write(append(b, '\n'))
	}
	if err != nil {
		n.failLocked(err)
		return
	}
	n.lines++
}

// snapshotLocked replaces the record with one line per name held now, and
// goes on appending to it.
func (n *Record) snapshotLocked() error {
	if n.f != nil {
		n.f.Close()
		n.f = nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	now := n.now()
	reserved, _ := n.MemoryRouter.Reservations(context.Background())
	for _, r := range reserved {
		enc.Encode(recordLine{Reserved: r.Name, Identity: r.Identity})
	}
	for k, h := range n.held {
		if !h.Until.IsZero() && h.Until.Before(now) {
			delete(n.held, k) // lapsed
			continue
		}
		enc.Encode(recordLine{Proto: k.Proto, Name: k.Name, Identity: h.Identity, Until: h.Until})
	}
	for id, until := range n.revoked {
		if !until.After(now) {
			delete(n.revoked, id) // lapsed
			continue
		}
		enc.Encode(recordLine{Revoked: id, Until: until})
	}
	// A new file in the record's place: a crash leaves the old one or
	// the new one, and a link in either place is not followed.
	err := safefile.WriteFile(n.path, b.Bytes())
	if err == nil {
		n.f, err = safefile.OpenOwn(n.path, os.O_WRONLY|os.O_APPEND)
	}
	if err != nil {
		return err
	}
	n.lines = 0
	return nil
}

// failLocked gives the record up after a write failed: it is removed, so
// that the next start is a first start rather than one that believes a
// record missing the latest changes.
func (n *Record) failLocked(err error) {
	n.log.Error("the record of who holds which name failed; it is removed, and the next start gives names to whoever asks first", "record", n.path, "err", err)
	if n.f != nil {
		n.f.Close()
		n.f = nil
	}
	os.Remove(n.path)
}

// errNotRecording refuses a reservation that the record cannot keep.
var errNotRecording = errors.New("names: the record of names is not written (it failed, or the edge stopped): a reservation would not outlive a restart")

// AddReservation implements router.Reserver: the MemoryRouter's, written
// to the record before it is granted; refused when the record cannot be
// written.
func (n *Record) AddReservation(ctx context.Context, r router.Reservation) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.f == nil {
		return errNotRecording
	}
	before, had, _ := n.MemoryRouter.Reservation(ctx, r.Name)
	if err := n.MemoryRouter.AddReservation(ctx, r); err != nil || had && before.Identity == r.Identity {
		return err
	}
	name, _ := router.Normalise(r.Name)
	if n.writeLocked(recordLine{Reserved: name, Identity: r.Identity}); n.f == nil {
		n.MemoryRouter.RemoveReservation(ctx, name)
		return errNotRecording
	}
	return nil
}

// RemoveReservation implements router.Reserver: the MemoryRouter's,
// recorded.
func (n *Record) RemoveReservation(ctx context.Context, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.MemoryRouter.RemoveReservation(ctx, name); err != nil || n.f == nil {
		return err
	}
	name, _ = router.Normalise(name)
	n.writeLocked(recordLine{Reserved: name})
	return nil
}

// Revoke implements router.Revoker: the MemoryRouter's, written to the
// record. A revocation the record cannot keep holds until the edge stops,
// and Revoke says so.
func (n *Record) Revoke(ctx context.Context, identity string, until time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.MemoryRouter.Revoke(ctx, identity, until); err != nil || !until.After(n.now()) || !until.After(n.revoked[identity]) {
		return err
	}
	n.revoked[identity] = until
	if n.f != nil {
		n.writeLocked(recordLine{Revoked: identity, Until: until})
	}
	if n.f == nil {
		return errors.New("names: the record of names is not written (it failed, or the edge stopped): the revocation ends with the process")
	}
	return nil
}

// Restored returns the names that Open restored, and until when each is
// kept for its holder.
func (n *Record) Restored() map[Endpoint]Holding { return maps.Clone(n.restoredHeld) }

// Stop ends the record with the time the edge stopped. Only the first
// call does anything.
func (n *Record) Stop() {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.f == nil {
		return
	}
	n.writeLocked(recordLine{Stopped: n.now()})
	if n.f == nil {
		return
	}
	if err := n.f.Sync(); err != nil {
		n.failLocked(err)
		return
	}
	n.f.Close()
	n.f = nil
}
