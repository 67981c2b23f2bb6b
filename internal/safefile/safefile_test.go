//go:build unix

package safefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// within runs f, and fails the test if it has not returned within 30 s:
// a read that blocks on a named pipe would hang the test otherwise.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s blocked", what)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
}

// A link planted at the name of the temporary file is not followed:
// WriteFile takes another name, and the link's target is untouched.
func TestWriteFileLinkAtTempName(t *testing.T) {
	target, untouched := testtools.LinkTarget(t)
	dir := t.TempDir()
	planted := filepath.Join(dir, ".state.json.planted.tmp")
	if err := os.Symlink(target, planted); err != nil {
		t.Fatal(err)
	}
	names := 0
	random := tempName
	tempName = func(base string) string {
		names++
		if names == 1 {
			return filepath.Base(planted)
		}
		return random(base)
	}
	t.Cleanup(func() { tempName = random })

	path := filepath.Join(dir, "state.json")
	if err := WriteFile(path, []byte("state")); err != nil {
		t.Fatal(err)
	}
	untouched()
	if names != 2 {
		t.Errorf("WriteFile tried %d names, want the planted one then another", names)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "state" {
		t.Errorf("the file: %q, %v", b, err)
	}
	if info, err := os.Lstat(planted); err != nil || info.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the planted link: %v, %v", info, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("the directory holds %d entries, want the file and the planted link (no temporary file left)", len(entries))
	}
}

// A link or a special file at the target itself is refused, named, and
// left as it is.
func TestWriteFileRefusesWhatIsNotAFile(t *testing.T) {
	target, untouched := testtools.LinkTarget(t)
	dir := t.TempDir()
	link := filepath.Join(dir, "state.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(link, []byte("state"))
	if !errors.Is(err, ErrSymlink) || !strings.HasPrefix(err.Error(), link+" is a symbolic link") {
		t.Errorf("WriteFile over a link: %v, want ErrSymlink naming %s", err, link)
	}
	untouched()
	if info, err := os.Lstat(link); err != nil || info.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v, %v", info, err)
	}

	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	within(t, "WriteFile over a named pipe", func() {
		if err := WriteFile(fifo, []byte("state")); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), fifo+" is not a regular file (a named pipe)") {
			t.Errorf("WriteFile over a named pipe: %v", err)
		}
	})
	if err := WriteFile(dir, []byte("state")); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "(a directory)") {
		t.Errorf("WriteFile over a directory: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("the directory holds %d entries, want the link and the pipe", len(entries))
	}
}

// WriteFile replaces a file, private, and leaves no temporary file.
func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "names.jsonl")
	for _, content := range []string{"one\n", "two\n"} {
		if err := WriteFile(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != content {
			t.Fatalf("after writing %q: %q, %v", content, b, err)
		}
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("the file's mode: %v, %v; want 0600", info.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone", len(entries))
	}
}

// CreateFile creates a file exclusively: a file there is kept, a link
// there (to a file, or to none) is neither followed nor replaced.
func TestCreateFile(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "ticket.key")
	if err := CreateFile(key, []byte("k1")); err != nil {
		t.Fatal(err)
	}
	if err := CreateFile(key, []byte("k2")); !errors.Is(err, fs.ErrExist) {
		t.Errorf("CreateFile over a file: %v, want fs.ErrExist", err)
	}
	if b, _ := os.ReadFile(key); string(b) != "k1" {
		t.Errorf("the file was overwritten: %q", b)
	}

	target, untouched := testtools.LinkTarget(t)
	link := filepath.Join(dir, "link.key")
	os.Symlink(target, link)
	if err := CreateFile(link, []byte("k")); !errors.Is(err, ErrSymlink) || !errors.Is(err, fs.ErrExist) || !strings.HasPrefix(err.Error(), link) {
		t.Errorf("CreateFile over a link: %v, want ErrSymlink naming it", err)
	}
	untouched()

	missing := filepath.Join(t.TempDir(), "not-yet")
	dangling := filepath.Join(dir, "dangling.key")
	os.Symlink(missing, dangling)
	if err := CreateFile(dangling, []byte("k")); !errors.Is(err, ErrSymlink) {
		t.Errorf("CreateFile over a dangling link: %v, want ErrSymlink", err)
	}
	if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dangling link's target was created: %v", err)
	}
}

// A named pipe or a device is refused without blocking, by every read.
func TestReadRefusesSpecialFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "token")
	mkfifo(t, fifo)
	for _, path := range []string{fifo, os.DevNull} {
		reads := map[string]func() error{
			"Read":        func() error { _, _, err := Read(path, 4096); return err },
			"ReadOwn":     func() error { _, _, err := ReadOwn(path, 4096); return err },
			"ReadPrivate": func() error { _, err := ReadPrivate(path, 4096, "a secret"); return err },
			"OpenOwn":     func() error { _, err := OpenOwn(path, os.O_RDWR|os.O_CREATE); return err },
		}
		for name, read := range reads {
			within(t, name+" of "+path, func() {
				if err := read(); !errors.Is(err, ErrNotRegular) || !strings.HasPrefix(err.Error(), path+" is not a regular file") {
					t.Errorf("%s(%s): %v, want ErrNotRegular naming it", name, path, err)
				}
			})
		}
	}
}

// ReadOwn refuses a link; Read follows it.
func TestReadOwnRefusesALink(t *testing.T) {
	target, untouched := testtools.LinkTarget(t)
	link := filepath.Join(t.TempDir(), "state.json")
	os.Symlink(target, link)
	if _, _, err := ReadOwn(link, 4096); !errors.Is(err, ErrSymlink) || !strings.HasPrefix(err.Error(), link+" is a symbolic link") {
		t.Errorf("ReadOwn of a link: %v, want ErrSymlink naming it", err)
	}
	if _, err := OpenOwn(link, os.O_WRONLY|os.O_APPEND); !errors.Is(err, ErrSymlink) {
		t.Errorf("OpenOwn of a link: %v, want ErrSymlink", err)
	}
	if b, _, err := Read(link, 4096); err != nil || string(b) != "the victim's own bytes\n" {
		t.Errorf("Read of a link: %q, %v", b, err)
	}
	untouched()
}

// ReadPrivate takes a file of its owner's alone, and refuses one that
// group or others may read or write, naming it, its mode and what to do.
func TestReadPrivateModes(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		mode fs.FileMode
		ok   bool
	}{
		{0o600, true}, {0o400, true}, {0o700, true},
		{0o644, false}, {0o640, false}, {0o620, false}, {0o604, false}, {0o602, false}, {0o660, false},
	} {
		path := filepath.Join(dir, c.mode.String())
		if err := os.WriteFile(path, []byte("s3cret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		b, err := ReadPrivate(path, 4096, "the token gives the whole edge away")
		switch {
		case c.ok && (err != nil || string(b) != "s3cret"):
			t.Errorf("mode %04o: %q, %v; want the secret", c.mode, b, err)
		case !c.ok && !errors.Is(err, ErrOpenToOthers):
			t.Errorf("mode %04o: %v, want ErrOpenToOthers", c.mode, err)
		case !c.ok:
			want := path + " is open to others (mode " + octal(c.mode) + "): the token gives the whole edge away; chmod 600 it"
			if err.Error() != want {
				t.Errorf("mode %04o:\n%s\nwant\n%s", c.mode, err, want)
			}
		}
	}
}

func octal(m fs.FileMode) string {
	const digits = "01234567"
	p := m.Perm()
	return string([]byte{'0', digits[p>>6&7], digits[p>>3&7], digits[p&7]})
}

// A file of max bytes is read; one byte more is refused, not cut.
func TestReadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	os.WriteFile(path, []byte(strings.Repeat("t", 4096)), 0o600)
	if b, _, err := Read(path, 4096); err != nil || len(b) != 4096 {
		t.Errorf("4096 bytes, at most 4096: %d bytes, %v", len(b), err)
	}
	os.WriteFile(path, []byte(strings.Repeat("t", 4097)), 0o600)
	if b, err := ReadPrivate(path, 4096, "a secret"); !errors.Is(err, ErrTooLarge) || b != nil || !strings.HasPrefix(err.Error(), path+" is too large: more than 4096 bytes") {
		t.Errorf("4097 bytes, at most 4096: %d bytes, %v; want ErrTooLarge naming the file", len(b), err)
	}
}

// PrivateDir creates a missing directory for its owner alone, takes one
// that others may read, and refuses one that group or others may write
// to.
func TestPrivateDir(t *testing.T) {
	base := t.TempDir()
	made := filepath.Join(base, "a", "b")
	if err := PrivateDir(made); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(made); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("the directory made: %v, %v; want mode 0700", info.Mode(), err)
	}
	for _, c := range []struct {
		mode fs.FileMode
		ok   bool
	}{{0o700, true}, {0o755, true}, {0o775, false}, {0o757, false}, {0o777, false}, {0o1777, false}} {
		dir := filepath.Join(base, "mode")
		os.Mkdir(dir, 0o700)
		if err := os.Chmod(dir, c.mode); err != nil {
			t.Fatal(err)
		}
		err := PrivateDir(dir)
		switch {
		case c.ok && err != nil:
			t.Errorf("a directory of mode %04o: %v", c.mode, err)
		case !c.ok && (!errors.Is(err, ErrOpenToOthers) || !strings.HasPrefix(err.Error(), dir+" is open to others (mode "+octal(c.mode)+")") || !strings.HasSuffix(err.Error(), "chmod go-w it")):
			t.Errorf("a directory of mode %04o: %v, want ErrOpenToOthers naming it and chmod", c.mode, err)
		}
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o600)
	if err := PrivateDir(file); err == nil {
		t.Error("PrivateDir of a file: no error")
	}
}

// OpenOwn appends to a regular file, and creates one with O_CREATE.
func TestOpenOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.jsonl")
	if err := WriteFile(path, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	f, err := OpenOwn(path, os.O_WRONLY|os.O_APPEND)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("two\n")
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "one\ntwo\n" {
		t.Errorf("after appending: %q", b)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := OpenOwn(missing, os.O_WRONLY|os.O_APPEND); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("OpenOwn of a missing file: %v", err)
	}
	f, err = OpenOwn(missing, os.O_RDWR|os.O_CREATE)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if info, err := os.Lstat(missing); err != nil || info.Mode() != 0o600 {
		t.Errorf("OpenOwn with O_CREATE made %v, %v; want a file of mode 0600", info.Mode(), err)
	}
}
