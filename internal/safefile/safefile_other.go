//go:build !unix

package safefile

// Without O_NOFOLLOW and O_NONBLOCK, a link or a special file is refused
// by looking at it before it is opened; without Unix permissions, the
// rules of Private and PrivateDir are not checked.
const (
	noFollow  = 0
	nonBlock  = 0
	unixPerms = false
)

func isLoop(error) bool { return false }

func syncDir(string) {}
