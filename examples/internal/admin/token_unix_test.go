//go:build unix

package admin

import (
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
)

// A named pipe given as the token file is refused at once: LoadToken
// does not wait for a writer (the edge's start, and its SIGTERM, hung
// there).
func TestLoadTokenNamedPipe(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "admin.token")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := LoadToken(fifo)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, safefile.ErrNotRegular) || !strings.HasPrefix(err.Error(), fifo+" is not a regular file (a named pipe)") {
			t.Errorf("LoadToken of a named pipe: %v, want it refused, named", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("LoadToken of a named pipe blocked")
	}
}

// A token file over MaxTokenFile bytes is refused with a message, never
// cut to its first MaxTokenFile bytes; one of MaxTokenFile is taken.
func TestLoadTokenTooLong(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "admin.token")
	long := strings.Repeat("t", MaxTokenFile)
	os.WriteFile(path, []byte(long), 0o600)
	if got, err := LoadToken(path); err != nil || got != sha256.Sum256([]byte(long)) {
		t.Errorf("a token of %d bytes: %v", MaxTokenFile, err)
	}
	os.WriteFile(path, []byte(long+"x"), 0o600)
	if got, err := LoadToken(path); !errors.Is(err, safefile.ErrTooLarge) || !strings.HasPrefix(err.Error(), path+" is too large: more than 4096 bytes") {
		t.Errorf("a token of %d bytes: %x, %v; want it refused as too large", MaxTokenFile+1, got, err)
	}
}
