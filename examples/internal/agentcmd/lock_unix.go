//go:build unix

package agentcmd

import (
	"errors"
	"os"
	"syscall"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
)

// lockFile takes an exclusive lock on the file at path, created if
// missing, and returns the func that releases it. The lock goes with the
// process: a killed agent holds it no more.
func lockFile(path string) (unlock func(), err error) {
	f, err := safefile.OpenOwn(path, os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errStateBusy
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
