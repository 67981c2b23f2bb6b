package safefile_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tunnelkit/tunnelkit/internal/safefile"
)

// A program keeps a state file in a directory of its own: it writes it
// whole each time, and reads it back at its next start.
func Example() {
	tmp, err := os.MkdirTemp("", "safefile-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "state")
	if err := safefile.PrivateDir(dir); err != nil {
		fmt.Println(err)
		return
	}
	path := filepath.Join(dir, "state.json")
	if err := safefile.WriteFile(path, []byte(`{"session":"t1"}`)); err != nil {
		fmt.Println(err)
		return
	}
	b, _, err := safefile.ReadOwn(path, 1<<20)
	fmt.Println(string(b), err)

	// A file longer than the reader takes is refused, not cut.
	_, _, err = safefile.ReadOwn(path, 8)
	fmt.Println(errors.Is(err, safefile.ErrTooLarge))
	// Output:
	// {"session":"t1"} <nil>
	// true
}
