//go:build unix

package names

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
	"github.com/tunnelkit/tunnelkit/router"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// A link planted where the record used to write its snapshot first
// (names.jsonl.tmp) is not followed: the record is a file of its own, the
// link's target untouched however often it is written.
func TestRecordLinkAtTemporaryName(t *testing.T) {
	t.Parallel()
	target, untouched := testtools.LinkTarget(t)
	dir := t.TempDir()
	if err := os.Symlink(target, filepath.Join(dir, recordFile+".tmp")); err != nil {
		t.Fatal(err)
	}
	n, err := Open(dir, new(router.MemoryRouter), time.Minute, slog.New(slog.DiscardHandler), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	r := router.Route{Proto: "http", Name: "app.example.test", Identity: "alice", SessionID: "s", TunnelID: "t"}
	if err := n.Bind(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	n.Stop()
	untouched()
	info, err := os.Lstat(filepath.Join(dir, recordFile))
	if err != nil || !info.Mode().IsRegular() {
		t.Fatalf("the record: %v, %v; want a regular file", info, err)
	}
	if held, _, err := readRecord(filepath.Join(dir, recordFile)); err != nil || held[Endpoint{"http", "app.example.test"}].Identity != "alice" {
		t.Errorf("the record holds %v, %v; want the name bound", held, err)
	}
}

// A link, or a named pipe, in the record's own place is refused, named,
// and left as it is (a pipe without blocking the start); so is a
// directory that others may write to.
func TestRecordRefusesWhatIsNotItsOwn(t *testing.T) {
	t.Parallel()
	open := func(dir string) error {
		done := make(chan error, 1)
		go func() {
			n, err := Open(dir, new(router.MemoryRouter), time.Minute, slog.New(slog.DiscardHandler), time.Now)
			if err == nil {
				n.Stop()
			}
			done <- err
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatalf("Open(%s) blocked", dir)
			return nil
		}
	}
	target, untouched := testtools.LinkTarget(t)
	missing := filepath.Join(t.TempDir(), "missing")
	for _, to := range []string{target, missing} {
		dir := t.TempDir()
		link := filepath.Join(dir, recordFile)
		os.Symlink(to, link)
		if err := open(dir); !errors.Is(err, safefile.ErrSymlink) || !strings.HasPrefix(err.Error(), link+" is a symbolic link") {
			t.Errorf("a link to %s as the record: %v, want ErrSymlink naming %s", to, err, link)
		}
		if info, err := os.Lstat(link); err != nil || info.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("the link was replaced: %v, %v", info, err)
		}
	}
	untouched()
	if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the missing target of a link was created: %v", err)
	}

	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, recordFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open(dir); !errors.Is(err, safefile.ErrNotRegular) || !strings.Contains(err.Error(), "(a named pipe)") {
		t.Errorf("a named pipe as the record: %v, want ErrNotRegular", err)
	}

	dir = t.TempDir()
	os.Chmod(dir, 0o770)
	if err := open(dir); !errors.Is(err, safefile.ErrOpenToOthers) || !strings.Contains(err.Error(), "chmod go-w") {
		t.Errorf("a directory of mode 0770: %v, want ErrOpenToOthers saying chmod go-w", err)
	}
}
