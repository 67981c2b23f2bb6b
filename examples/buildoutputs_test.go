package examples_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBuildOutputsIgnored checks .gitignore against what the go command
// writes into a clone: every main package's binary, named after its
// folder, wherever `go build` puts it (its own folder when run there,
// examples/ after `go build ./bench/datapath` there, the root after `go
// build ./examples/demo` there), a test binary (`go test -c`), and
// profiles. Each must be ignored, and no tracked file may be one that
// .gitignore ignores (a build output committed, or a rule that hides
// sources).
func TestBuildOutputsIgnored(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", root}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil && stderr.Len() > 0 {
			err = errors.New(strings.TrimSpace(stderr.String()))
		}
		return string(out), err
	}
	if _, err := git("rev-parse", "--is-inside-work-tree"); err != nil {
		t.Skipf("not a git checkout: %v", err)
	}

	tracked, err := git("ls-files", "--cached", "--ignored", "--exclude-standard")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(tracked) {
		t.Errorf("%s is tracked, and .gitignore ignores it: a build output to git rm, or a rule that hides a source", f)
	}

	// The main packages of every module of the workspace.
	list := exec.Command("go", "list", "-find", "-f", `{{if eq .Name "main"}}{{.Dir}}{{end}}`, "work")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var outputs []string
	add := func(path string) {
		if st, err := os.Stat(filepath.Join(root, path)); err == nil && st.IsDir() {
			return // go build refuses to write over a folder
		}
		outputs = append(outputs, filepath.ToSlash(path))
	}
	mains := strings.Fields(string(out))
	if len(mains) == 0 {
		t.Fatal("go list found no main package")
	}
	for _, dir := range mains {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(dir)
		add(filepath.Join(rel, name))         // go build, in its folder
		add(filepath.Join(rel, name+".exe"))  // the same for Windows
		add(filepath.Join("examples", name))  // go build ./PATH in examples/
		add(name)                             // go build ./examples/PATH at the root
		add(filepath.Join(rel, name+".test")) // go test -c
		add(filepath.Join(rel, "cpu.out"))    // go test -cpuprofile cpu.out
		add(filepath.Join(rel, "cover.out"))  // go test -coverprofile cover.out
		add(filepath.Join(rel, "mem.pprof"))  // go test -memprofile mem.pprof
		add(filepath.Join(rel, "trace.out"))  // go test -trace trace.out
	}
	slices.Sort(outputs)
	outputs = slices.Compact(outputs)
	ignored, err := git(append([]string{"check-ignore", "--no-index", "--"}, outputs...)...)
	if err != nil && ignored == "" {
		// Exit status 1: none is ignored; it prints nothing then.
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatal(err)
		}
	}
	is := strings.Fields(ignored)
	for _, o := range outputs {
		if !slices.Contains(is, o) {
			t.Errorf(".gitignore does not ignore %s, which the go command writes", o)
		}
	}
}
