package names

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/router"
)

// readRecord keeps what was held when the edge stopped: the last line of
// each name counts, a reservation that lapsed before the stop is gone,
// and a line cut short or garbled is skipped.
func TestReadRecord(t *testing.T) {
	t.Parallel()
	stop := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), recordFile)
	lines := `{"proto":"http","name":"live.example.test","identity":"alice"}
{"proto":"http","name":"freed.example.test","identity":"bob"}
{"proto":"http","name":"freed.example.test"}
{"proto":"tls","name":"moved.example.test","identity":"bob"}
not json at all
{"proto":"tls","name":"moved.example.test","identity":"alice"}
{"proto":"http","name":"lapsed.example.test","identity":"bob","until":"2026-12-01T11:59:00Z"}
{"proto":"tcp","name":"20001","identity":"bob","until":"2026-12-01T12:00:20Z"}
{"stopped":"2026-12-01T12:00:00Z"}
`
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	held, _, err := readRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[Endpoint]Holding{
		{"http", "live.example.test"}: {"alice", time.Time{}},
		{"tls", "moved.example.test"}: {"alice", time.Time{}},
		{"tcp", "20001"}:              {"bob", stop.Add(20 * time.Second)},
	}
	if len(held) != len(want) {
		t.Fatalf("held %v, want %v", held, want)
	}
	for k, h := range want {
		if got := held[k]; got.Identity != h.Identity || !got.Until.Equal(h.Until) {
			t.Errorf("%v: %+v, want %+v", k, got, h)
		}
	}

	// No line says when the edge stopped (it crashed): the file's time
	// does, and a line cut short at the end is skipped.
	crashed := `{"proto":"http","name":"a.example.test","identity":"alice","until":"2026-12-01T11:00:00Z"}
{"proto":"http","name":"b.example.test","identity":"alice","until":"2026-12-01T13:00:00Z"}
{"proto":"http","name":"c.exa`
	if err := os.WriteFile(path, []byte(crashed), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, stop, stop); err != nil {
		t.Fatal(err)
	}
	held, _, err = readRecord(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[Endpoint{"http", "b.example.test"}].Identity != "alice" {
		t.Fatalf("after a crash: %v, want b.example.test alone", held)
	}
}

// The record stays about as large as what it describes, however often
// names change hands, and says the last of it.
func TestRecordCompacts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	keep := router.Route{Proto: "http", Name: "keep.example.test", Identity: "alice", SessionID: "s", TunnelID: "k"}
	if err := n.Bind(ctx, keep); err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		r := router.Route{Proto: "http", Name: "churn.example.test", Identity: fmt.Sprint("id", i%3), SessionID: "s", TunnelID: fmt.Sprint(i)}
		if err := n.Bind(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := n.Unbind(ctx, r, 0); err != nil {
			t.Fatal(err)
		}
	}
	n.Stop()
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		t.Fatal(err)
	}
	if lines := bytes.Count(b, []byte("\n")); lines > 1100 {
		t.Fatalf("the record has %d lines for one name held", lines)
	}
	held, _, err := readRecord(filepath.Join(dir, recordFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[Endpoint{"http", "keep.example.test"}].Identity != "alice" {
		t.Fatalf("the record says %v, want keep.example.test held by alice", held)
	}
}

// A record that cannot be written is removed, so that the next start is a
// first start rather than one that believes a record missing changes.
func TestRecordFailureRemovesIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var logged bytes.Buffer
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, slog.New(slog.NewTextHandler(&logged, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	n.f.Close()
	n.f, err = os.Open(filepath.Join(dir, recordFile)) // read-only: the next write fails
	n.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Bind(context.Background(), router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s", TunnelID: "t"}); err != nil {
		t.Fatalf("a bind when the record fails: %v, want it granted", err)
	}
	if _, err := os.Stat(filepath.Join(dir, recordFile)); !os.IsNotExist(err) {
		t.Fatalf("the failed record is still there: %v", err)
	}
	if !bytes.Contains(logged.Bytes(), []byte("level=ERROR")) {
		t.Fatalf("no error logged: %s", logged.String())
	}
	n.Stop()
}

// A Move is recorded as a Bind is: the name it binds is in the record,
// and, refused for a name kept at a restart, it says so.
func TestRecordMove(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	moved := router.Route{Proto: "http", Name: "moved.example.test", Identity: "alice", SessionID: "s2", TunnelID: "t2"}
	if err := n.Move(ctx, moved, "s1"); err != nil {
		t.Fatal(err)
	}
	n.Stop()
	n, err = Open(dir, new(router.MemoryRouter), time.Minute, log, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	if h := n.Restored()[Endpoint{"http", "moved.example.test"}]; h.Identity != "alice" {
		t.Errorf("after a restart, the record holds %+v for the name moved into, want alice's", h)
	}
	err = n.Move(ctx, router.Route{Proto: "http", Name: "moved.example.test", Identity: "bob", SessionID: "s3", TunnelID: "t3"}, "s2")
	if err == nil || !strings.Contains(err.Error(), "when the edge stopped") {
		t.Errorf("bob's Move into alice's kept name: %v, want it refused, saying it was kept", err)
	}
}
