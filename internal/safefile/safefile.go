// Package safefile reads and writes the files that the edge and the agent
// keep: state, records and secrets. It holds the rules those files share,
// in one place:
//
//   - A file is written through a new temporary file in its directory,
//     created exclusively (O_EXCL, O_NOFOLLOW: a symbolic link planted at
//     its name is never followed), synced, then renamed over the file, and
//     the directory synced: a crash leaves the old file or the new one,
//     and nobody who can plant a link makes the program write elsewhere.
//   - A symbolic link, or anything but a regular file, where a file the
//     program writes should be is refused (ErrSymlink, ErrNotRegular).
//   - A read never blocks on a named pipe or a device: the path is opened
//     with O_NONBLOCK and checked with fstat before a byte is read; a file
//     over the caller's bound is refused (ErrTooLarge), never cut.
//   - A secret is private: a file that group or others may read or write
//     is refused (ErrOpenToOthers), as is a state directory that they may
//     write to; the message names the file and says to chmod it.
//
// Typical use:
//
//	if err := safefile.PrivateDir(dir); err != nil {
//		return err
//	}
//	b, _, err := safefile.ReadOwn(path, 1<<20) // a state file: no link
//	...
//	err = safefile.WriteFile(path, newState)
//
//	token, err := safefile.ReadPrivate(tokenFile, 4096, "the token gives the whole edge away")
//
// The permission rules hold where files have Unix permissions; elsewhere
// (Windows) they are not checked.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
)

// The errors of this package, each wrapped in one that names the file.
var (
	// ErrSymlink is a symbolic link where the program reads or writes a
	// file of its own.
	ErrSymlink = errors.New("a symbolic link")

	// ErrNotRegular is a named pipe, a device, a directory or a socket
	// where a regular file should be.
	ErrNotRegular = errors.New("not a regular file")

	// ErrOpenToOthers is a secret that group or others may read or
	// write, or a directory of state that they may write to.
	ErrOpenToOthers = errors.New("open to others")

	// ErrTooLarge is a file longer than the caller reads.
	ErrTooLarge = errors.New("too large")
)

// Read returns the content of the regular file at path, following a
// symbolic link, and its FileInfo. A file that is not regular is refused
// before it is opened, and again by fstat once it is (opened without
// blocking); one over max bytes is ErrTooLarge. A missing file is an
// error that wraps fs.ErrNotExist.
func Read(path string, max int64) ([]byte, fs.FileInfo, error) {
	return read(path, max, true)
}

// ReadOwn is Read of a file the program writes itself (a state file, a
// record): a symbolic link at path is refused (ErrSymlink), not followed.
func ReadOwn(path string, max int64) ([]byte, fs.FileInfo, error) {
	return read(path, max, false)
}

// ReadPrivate is Read of a secret: a file that group or others may read
// or write is refused (see Private, which why goes to).
func ReadPrivate(path string, max int64, why string) ([]byte, error) {
	b, info, err := Read(path, max)
	if err != nil {
		return nil, err
	}
	if err := Private(path, info, why); err != nil {
		return nil, err
	}
	return b, nil
}

// Private returns ErrOpenToOthers, in a message that names path and says
// why it must be private ("the token gives the whole edge away") and what
// to do, when info's mode lets group or others read or write the file:
//
//	/etc/edge/tokens is open to others (mode 0644): the tokens give agents their names; chmod 600 it
//
// Where files have no Unix permissions, it returns nil.
func Private(path string, info fs.FileInfo, why string) error {
	if perm := info.Mode().Perm(); unixPerms && perm&0o077 != 0 {
		return fmt.Errorf("%s is %w (mode %04o): %s; chmod 600 it", path, ErrOpenToOthers, perm, why)
	}
	return nil
}

// PrivateDir creates the directory dir (mode 0700) if it is missing, and
// refuses it, with ErrOpenToOthers, when group or others may write to it:
// they could put a file or a link of their own in the place of one kept
// there.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	info, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if perm := info.Mode().Perm(); unixPerms && perm&0o022 != 0 {
		return fmt.Errorf("%s is %w (mode %04o): whoever may write to it may replace the files kept there; chmod go-w it", dir, ErrOpenToOthers, perm)
	}
	return nil
}

// WriteFile replaces the file at path with data (mode 0600): through a new
// temporary file in the same directory, created exclusively without
// following a link, synced, renamed over path; then the directory is
// synced. A symbolic link or a file that is not regular at path is
// refused, and left as it is.
func WriteFile(path string, data []byte) error {
	if err := ownTarget(path); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := createTemp(dir, filepath.Base(path))
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	syncDir(dir)
	return nil
}

// CreateFile creates the file at path with data (mode 0600), exclusively
// and without following a link: a file or a link already at path is an
// error that wraps fs.ErrExist (ErrSymlink too, for a link), and is left
// as it is. The file is synced, and its directory.
func CreateFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
	if err != nil {
		if info, lerr := os.Lstat(path); errors.Is(err, fs.ErrExist) && lerr == nil && info.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("%w: %w", symlinkError(path), err)
		}
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

// OpenOwn opens a file the program keeps itself (a journal it appends
// to, a lock) with flag, as os.OpenFile does (mode 0600 when it creates
// it), without following a link and without blocking: a link or a file
// that is not regular at path is refused, and left as it is.
func OpenOwn(path string, flag int) (*os.File, error) {
	if err := ownTarget(path); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, flag|noFollow|nonBlock, 0o600)
	if err != nil {
		return nil, linkError(path, err)
	}
	if _, err := checkOpened(path, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// read is Read, following a link at path or refusing it.
func read(path string, max int64, follow bool) ([]byte, fs.FileInfo, error) {
	stat, flags := os.Stat, nonBlock
	if !follow {
		stat, flags = os.Lstat, flags|noFollow
	}
	info, err := stat(path)
	if err != nil {
		return nil, nil, err
	}
	if err := regular(path, info); err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|flags, 0)
	if err != nil {
		return nil, nil, linkError(path, err)
	}
	defer f.Close()
	if info, err = checkOpened(path, f); err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, nil, err
	}
	if int64(len(b)) > max {
		return nil, nil, fmt.Errorf("%s is %w: more than %d bytes; is it the right file?", path, ErrTooLarge, max)
	}
	return b, info, nil
}

// checkOpened checks with fstat that f, opened at path, is a regular
// file: what was there may have changed since it was looked at.
func checkOpened(path string, f *os.File) (fs.FileInfo, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return info, regular(path, info)
}

// ownTarget refuses what is at path, if anything, unless it is a regular
// file: the place of a file the program writes.
func ownTarget(path string) error {
	info, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	}
	return regular(path, info)
}

// regular returns an error naming path unless info is a regular file's.
func regular(path string, info fs.FileInfo) error {
	m := info.Mode()
	switch {
	case m.IsRegular():
		return nil
	case m&fs.ModeSymlink != 0:
		return symlinkError(path)
	}
	kind := "a special file"
	switch {
	case m&fs.ModeNamedPipe != 0:
		kind = "a named pipe"
	case m&fs.ModeDevice != 0:
		kind = "a device"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	case m.IsDir():
		kind = "a directory"
	}
	return fmt.Errorf("%s is %w (%s): give the path of a file", path, ErrNotRegular, kind)
}

func symlinkError(path string) error {
	return fmt.Errorf("%s is %w: the file is written in its place, never through a link; remove the link, or name the file itself", path, ErrSymlink)
}

// linkError turns the error of opening a link without following it
// (ELOOP) into ErrSymlink's.
func linkError(path string, err error) error {
	if isLoop(err) {
		return fmt.Errorf("%w: %w", symlinkError(path), err)
	}
	return err
}

// tempName returns the name of a temporary file for base; a test may
// change it.
var tempName = func(base string) string {
	return "." + base + "." + strconv.FormatUint(rand.Uint64(), 36) + ".tmp"
}

// createTemp creates a new file in dir for base's content, exclusively
// and without following a link: a name already taken, by a link or
// anything else, is skipped.
func createTemp(dir, base string) (*os.File, error) {
	var err error
	for range 100 {
		var f *os.File
		f, err = os.OpenFile(filepath.Join(dir, tempName(base)), os.O_RDWR|os.O_CREATE|os.O_EXCL|noFollow, 0o600)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) && !isLoop(err) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no temporary file for %s: %w", filepath.Join(dir, base), err)
}
