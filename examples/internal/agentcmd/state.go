package agentcmd

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
)

// The state file keeps what an agent needs to get its URLs back when it
// starts again, even after kill -9: the session ticket (which gives an
// agent without a token its identity back, and makes the edge hand over
// the earlier run's endpoints at once) and, for each endpoint, the URL
// the edge granted (a random name is asked for again by name) and its
// ticket. The agent writes it after each change, and holds a lock on it
// while it runs, so that two agents never share one session.

// stateVersion is the "version" of the files this agent writes.
const stateVersion = 1

// stateData is the file's content, JSON.
type stateData struct {
	Version   int                      `json:"version"`
	Session   string                   `json:"session,omitempty"`   // the session ticket
	Endpoints map[string]stateEndpoint `json:"endpoints,omitempty"` // by endpointSpec.stateKey
}

// stateEndpoint is what the state keeps of one endpoint.
type stateEndpoint struct {
	URL    string    `json:"url"`              // as the edge granted it
	Ticket string    `json:"ticket,omitempty"` // the endpoint ticket
	Since  time.Time `json:"since"`            // when it was granted
}

// stateFile is an agent's state file, locked while the agent runs. A nil
// *stateFile keeps nothing.
type stateFile struct {
	path   string
	unlock func()

	mu   sync.Mutex
	data stateData
}

// defaultStatePath returns where an agent keeps its state when -state is
// not given: $XDG_STATE_HOME/tunnelkit (~/.local/state/tunnelkit when the
// variable is not set), in a file of its own for each configuration file,
// or for each command line's edges and endpoint.
func defaultStatePath(key string) (string, error) {
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, ".local", "state")
	}
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, "tunnelkit", "agent-"+hex.EncodeToString(sum[:6])+".json"), nil
}

// errStateBusy is a state file another agent runs with.
var errStateBusy = errors.New("another agent runs with it")

// maxState bounds the state file read back: far more than the tickets of
// the endpoints one agent has.
const maxState = 64 << 20

// openState locks and reads the state file at path, creating its
// directory; a missing file is an empty state. A file that is not one is
// an error that names it: it is left for the user to look at. So are a
// link or a special file in its place, a file that group or others may
// read or write (the session's ticket gives the agent's names away), and
// a directory that they may write to.
func openState(path string) (*stateFile, error) {
	if err := safefile.PrivateDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	unlock, err := lockFile(path + ".lock")
	if err != nil {
		return nil, err
	}
	s := &stateFile{path: path, unlock: unlock}
	b, info, err := safefile.ReadOwn(path, maxState)
	if err == nil {
		err = safefile.Private(path, info, "its tickets give the agent's names away")
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, nil
	case err != nil:
		unlock()
		return nil, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s.data); err != nil {
		unlock()
		return nil, fmt.Errorf("%s is not an agent's state file (%v): move it away, or give -state another file", path, err)
	}
	if s.data.Version != stateVersion {
		unlock()
		return nil, fmt.Errorf("%s is the state file of another version of the agent (%d): move it away, or give -state another file", path, s.data.Version)
	}
	return s, nil
}

// close releases the lock.
func (s *stateFile) close() {
	if s != nil {
		s.unlock()
	}
}

// session returns the session ticket kept.
func (s *stateFile) session() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data.Session
}

// endpoint returns what is kept of the endpoint key.
func (s *stateFile) endpoint(key string) (stateEndpoint, bool) {
	if s == nil {
		return stateEndpoint{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.data.Endpoints[key]
	return e, ok
}

// update changes the state with f and writes it; a failure to write is
// returned, and the state kept in memory.
func (s *stateFile) update(f func(*stateData)) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.data)
	s.data.Version = stateVersion
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "http:// -> 3000" as it reads
	enc.SetIndent("", "  ")
	if err := enc.Encode(s.data); err != nil {
		return err
	}
	// A new file renamed over the old: a kill leaves one or the other.
	return safefile.WriteFile(s.path, []byte(b.String()))
}
