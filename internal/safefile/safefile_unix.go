//go:build unix

package safefile

import (
	"errors"
	"os"
	"syscall"
)

const (
	noFollow  = syscall.O_NOFOLLOW
	nonBlock  = syscall.O_NONBLOCK
	unixPerms = true
)

// isLoop reports whether err is that of opening a symbolic link with
// O_NOFOLLOW.
func isLoop(err error) bool { return errors.Is(err, syscall.ELOOP) }

// syncDir syncs the directory dir, so that a rename in it outlives a
// crash; where a file system cannot, the rename stands as it is.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	d.Sync()
	d.Close()
}
