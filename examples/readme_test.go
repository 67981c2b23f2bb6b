package examples_test

// The README, run as a newcomer runs it: TestREADMEShell runs its shell
// blocks, TestREADMEGo builds its Go code and runs its programs, and
// TestREADMEFlags holds the flags of its command lines against the
// binaries'. What compiles (the README's `go install ./examples/NAME...`,
// its Go code, the demo's `go run`) is built by TestMain, before any
// test's deadline starts, into a directory of the user's cache kept from
// run to run (keptDir), where a run with nothing changed links nothing.
//
// How the README's blocks are read:
//   - an indented block, or a ```sh or ```bash fence, is shell: pasted into
//     bash in a fresh clone, it must work. The test runs it with bash -e
//     from the repository's root, the installed binaries on PATH and
//     TMPDIR a directory of the test's, in network and PID namespaces of
//     its own (isolatedCommand): the ports it names are its own, only
//     loopback exists, and whatever it leaves running is killed when it
//     ends;
//   - a ```go fence that starts with "package main" is a program: it must
//     build, run and print what the ```text fence right after it shows;
//     any other ```go fence is a fragment, which must compile inside a
//     function, with the names of fragmentEnv declared;
//   - any other fence (```text: usage lines, output) is not run; its
//     command lines' flags are checked as the shell blocks' are;
//   - a shell block right after the line
//     <!-- readme-test: skip (REASON) -->
//     is not run, for REASON: what a test cannot have (a public DNS
//     name, ports 80 and 443, a proxy on the way out). Its flags are still
//     checked.
//
// The README's first block is the demo and the test command, which runs
// this test: the demo runs until it printed its curl lines, which run; the
// test command is checked to include this package. The blocks must leave
// no file in the repository.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// blockGuard bounds how long one README block or program may run: a guard
// against a block that hangs, far above what any takes, not a check of
// speed.
const blockGuard = 3 * time.Minute

// readmeBlock is one code block of the README.
type readmeBlock struct {
	line int    // of its first line in README.md, from 1
	lang string // "sh" for shell, "go", or another fence's label ("text")
	text string // its lines, without indentation or fences
	skip string // the reason of a readme-test skip marker before it
}

func (b readmeBlock) program() bool {
	return b.lang == "go" && strings.HasPrefix(strings.TrimSpace(stripComments(b.text)), "package main")
}

// stripComments drops the // comment lines at the start of Go source.
func stripComments(src string) string {
	var rest []string
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "//") && strings.TrimSpace(l) != "" {
			rest = lines[i:]
			break
		}
	}
	return strings.Join(rest, "\n")
}

var (
	readmeMarker = regexp.MustCompile(`^<!-- readme-test: (.*) -->$`)
	skipMarker   = regexp.MustCompile(`^skip \((.+)\)$`)
)

// parseREADME returns the code blocks of a Markdown file.
func parseREADME(src string) ([]readmeBlock, error) {
	lines := strings.Split(src, "\n")
	var blocks []readmeBlock
	skip, skipLine := "", 0 // a marker waiting for its block
	add := func(b readmeBlock) {
		b.skip, skip = skip, ""
		blocks = append(blocks, b)
	}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "```"):
			b := readmeBlock{line: i + 2, lang: strings.TrimSpace(strings.TrimPrefix(l, "```"))}
			if b.lang == "bash" {
				b.lang = "sh"
			}
			var body []string
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				body = append(body, lines[i])
			}
			if i == len(lines) {
				return nil, fmt.Errorf("README.md:%d: a fence that never closes", b.line-1)
			}
			b.text = strings.Join(body, "\n") + "\n"
			add(b)
		case strings.HasPrefix(l, "    ") && (i == 0 || strings.TrimSpace(lines[i-1]) == ""):
			b := readmeBlock{line: i + 1, lang: "sh"}
			var body []string
			for ; i < len(lines); i++ {
				if strings.HasPrefix(lines[i], "    ") {
					body = append(body, lines[i][4:])
				} else if strings.TrimSpace(lines[i]) == "" && i+1 < len(lines) && strings.HasPrefix(lines[i+1], "    ") {
					body = append(body, "")
				} else {
					break
				}
			}
			i--
			b.text = strings.Join(body, "\n") + "\n"
			add(b)
		case readmeMarker.MatchString(l):
			m := skipMarker.FindStringSubmatch(readmeMarker.FindStringSubmatch(l)[1])
			if m == nil {
				return nil, fmt.Errorf("README.md:%d: a readme-test marker other than \"skip (REASON)\": %s", i+1, l)
			}
			skip, skipLine = m[1], i+1
		case strings.TrimSpace(l) == "":
		default:
			if skip != "" {
				return nil, fmt.Errorf("README.md:%d: the skip marker is not right before a block", skipLine)
			}
		}
	}
	if skip != "" {
		return nil, fmt.Errorf("README.md:%d: the skip marker is not right before a block", skipLine)
	}
	return blocks, nil
}

// readmePrepared is what TestMain did with the README for the tests.
type readmePrepared struct {
	root   string // the repository's root, absolute
	blocks []readmeBlock
	err    error // reading or parsing the README

	install    *readmeBlock // the block with `go install ./examples/NAME...`
	installErr error        // running it, with its output
	bin        string       // where it installed the binaries

	demoErr error // `go run ./examples/demo -h`, which builds what the demo block runs

	programs map[int]string // README line of each program: its binary
	goErrs   map[int]error  // README line of a program, or 0 for the fragments: why it did not build
}

var readmePrep readmePrepared

// installed returns the directory where the README's install block put
// the binaries names, and whether it put every one of them there.
func (p *readmePrepared) installed(names []string) (string, bool) {
	if p.install == nil || p.installErr != nil || p.bin == "" {
		return "", false
	}
	for _, n := range names {
		// The directory is kept from run to run (keptDir): a binary of
		// a name the block no longer installs may still be there.
		if !p.installs(n) {
			return "", false
		}
		if fi, err := os.Stat(filepath.Join(p.bin, n)); err != nil || !fi.Mode().IsRegular() {
			return "", false
		}
	}
	return p.bin, true
}

// installs reports whether the README's install block installs the
// example name.
func (p *readmePrepared) installs(name string) bool {
	return slices.Contains(strings.Fields(p.install.text), "./examples/"+name)
}

// prepareREADME builds, before the tests run, everything the README's
// blocks compile, and returns a func that removes what it made. What fails
// is kept in readmePrep for the tests to report.
func prepareREADME() (cleanup func()) {
	p := &readmePrep
	p.root, p.err = filepath.Abs("..")
	if p.err != nil {
		return func() {}
	}
	src, err := os.ReadFile(filepath.Join(p.root, "README.md"))
	if err != nil {
		p.err = err
		return func() {}
	}
	if p.blocks, p.err = parseREADME(string(src)); p.err != nil {
		return func() {}
	}
	dir, err := os.MkdirTemp("", "tunnelkit-readme-")
	if err != nil {
		p.err = err
		return func() {}
	}
	cleanup = func() { os.RemoveAll(dir) }
	kept, unlock := keptDir(p.root, dir)
	defer unlock()

	// The install block, as written, into a GOPATH of its own (the module
	// cache stays where it is: nothing is downloaded).
	for i, b := range p.blocks {
		if b.lang == "sh" && strings.Contains(b.text, "go install ./examples/") {
			p.install = &p.blocks[i]
			break
		}
	}
	if p.install != nil {
		modcache, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			p.installErr = fmt.Errorf("go env GOMODCACHE: %v", err)
		} else {
			gopath := filepath.Join(kept, "gopath")
			// What an earlier run installed that the block no longer
			// does goes: the shell blocks find the binaries on PATH.
			old, _ := os.ReadDir(filepath.Join(gopath, "bin"))
			for _, e := range old {
				if !p.installs(e.Name()) {
					os.RemoveAll(filepath.Join(gopath, "bin", e.Name()))
				}
			}
			cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", p.install.text)
			cmd.Dir = p.root
			cmd.Env = append(os.Environ(), "GOPATH="+gopath, "GOMODCACHE="+strings.TrimSpace(string(modcache)), "GOBIN=")
			if out, err := cmd.CombinedOutput(); err != nil {
				p.installErr = fmt.Errorf("%v\n%s", err, out)
			}
			p.bin = filepath.Join(gopath, "bin")
		}
	}

	// The demo block's `go run`, whose executable the build cache keeps.
	cmd := exec.Command("go", "run", "./examples/demo", "-h")
	cmd.Dir = p.root
	if out, err := cmd.CombinedOutput(); err != nil {
		p.demoErr = fmt.Errorf("go run ./examples/demo -h: %v\n%s", err, out)
	}

	p.buildGo(filepath.Join(kept, "go"))
	return cleanup
}

// keptDir returns the directory where what the README's blocks build is
// kept from one run of the tests to the next, locked until unlock is
// called: one of the user's cache (os.UserCacheDir) for the checkout at
// root, so that a run with nothing changed links nothing (the go command
// finds the executables there up to date), or tmp when there is none.
func keptDir(root, tmp string) (dir string, unlock func()) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return tmp, func() {}
	}
	sum := sha256.Sum256([]byte(root))
	dir = filepath.Join(cache, "tunnelkit-tests", hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return tmp, func() {}
	}
	// Two runs at once take turns: each writes the programs' sources
	// before it builds them.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return tmp, func() {}
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return tmp, func() {}
	}
	return dir, func() { lock.Close() }
}

// buildGo builds the README's programs, and its fragments inside
// functions, in a module of a workspace with the repository's, in dir.
func (p *readmePrepared) buildGo(dir string) {
	p.programs, p.goErrs = map[int]string{}, map[int]error{}
	fail := func(err error) { p.goErrs[0] = err }
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fail(err)
		return
	}
	// The workspace: this module and every one of the repository's
	// go.work, so that fragments import nested modules too (policy/oidc).
	work, err := os.ReadFile(filepath.Join(p.root, "go.work"))
	if err != nil {
		fail(err)
		return
	}
	use := "\t.\n"
	for _, m := range regexp.MustCompile(`(?m)^\s+(\./\S*|\.)\s*$`).FindAllStringSubmatch(string(work), -1) {
		use += fmt.Sprintf("\t%q\n", filepath.Join(p.root, m[1]))
	}
	files := map[string]string{
		"go.mod":  "module readme.test\n\ngo 1.26\n",
		"go.work": "go 1.26.0\n\nuse (\n" + use + ")\n",
	}
	var fragments []readmeBlock
	for _, b := range p.blocks {
		switch {
		case b.program():
			files[fmt.Sprintf("line%d/main.go", b.line)] = fmt.Sprintf("//line README.md:%d\n%s", b.line, b.text)
		case b.lang == "go":
			fragments = append(fragments, b)
		}
	}
	if len(fragments) > 0 {
		files["fragments/main.go"] = fragmentHarness(fragments)
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			fail(err)
			return
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			fail(err)
			return
		}
	}
	build := func(pkg string) error {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", pkg), "./"+pkg)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	}
	if len(fragments) > 0 {
		if err := build("fragments"); err != nil {
			fail(err)
		}
	}
	for _, b := range p.blocks {
		if !b.program() {
			continue
		}
		pkg := fmt.Sprintf("line%d", b.line)
		if err := build(pkg); err != nil {
			p.goErrs[b.line] = err
			continue
		}
		p.programs[b.line] = filepath.Join(dir, "bin", pkg)
	}
}

// fragmentEnv declares the names the README's fragments use without
// defining them.
const fragmentEnv = `
var (
	ctx           context.Context
	handler       http.Handler
	token         string
	checkToken    func(ctx context.Context, token string) (identity string, err error)
	agentTLS      *tls.Config
	key           []byte
	myRouter      router.Router
	agentListener net.Listener
	httpListener  net.Listener
	tlsListener   net.Listener
	srv           *edge.Server
	client        *agent.Client
	wildcard      tls.Certificate
)
`

// fragmentImports are the packages fragments may name, by name; those of
// fragmentEnv are always imported.
var fragmentImports = map[string]string{
	"agent":     "github.com/tunnelkit/tunnelkit/agent",
	"autocert":  "golang.org/x/crypto/acme/autocert",
	"context":   "context",
	"edge":      "github.com/tunnelkit/tunnelkit/edge",
	"errors":    "errors",
	"fmt":       "fmt",
	"forward":   "github.com/tunnelkit/tunnelkit/agent/forward",
	"forwarded": "github.com/tunnelkit/tunnelkit/forwarded",
	"http":      "net/http",
	"inspect":   "github.com/tunnelkit/tunnelkit/agent/inspect",
	"io":        "io",
	"log":       "log",
	"net":       "net",
	"netip":     "net/netip",
	"oidc":      "github.com/tunnelkit/tunnelkit/policy/oidc",
	"os":        "os",
	"policy":    "github.com/tunnelkit/tunnelkit/policy",
	"router":    "github.com/tunnelkit/tunnelkit/router",
	"slog":      "log/slog",
	"sni":       "github.com/tunnelkit/tunnelkit/sni",
	"time":      "time",
	"tls":       "crypto/tls",
	"view":      "github.com/tunnelkit/tunnelkit/edge/view",
	"x509":      "crypto/x509",
}

// fragmentHarness returns a program with each fragment, verbatim, as the
// body of a function returning an error, its compile errors pointing at
// the README's lines. The names a fragment defines are used after it, as
// the code that would follow it in an app would.
func fragmentHarness(fragments []readmeBlock) string {
	imports := map[string]bool{"agent": true, "context": true, "edge": true, "http": true, "net": true, "router": true, "tls": true}
	var funcs strings.Builder
	for i, f := range fragments {
		var defined []string
		// A fragment that does not parse gets no uses: the compiler
		// reports its error at the README's line.
		file, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() error {\n"+f.text+"}\n", 0)
		if err == nil {
			body := file.Decls[0].(*ast.FuncDecl).Body
			for _, s := range body.List {
				if as, ok := s.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
					for _, e := range as.Lhs {
						if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
							defined = append(defined, id.Name)
						}
					}
				}
			}
			ast.Inspect(body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && fragmentImports[id.Name] != "" && !slices.Contains(defined, id.Name) {
						imports[id.Name] = true
					}
				}
				return true
			})
		}
		fmt.Fprintf(&funcs, "\nfunc fragment%d() error {\n//line README.md:%d\n%s", i, f.line, f.text)
		for _, name := range defined {
			fmt.Fprintf(&funcs, "\t_ = %s\n", name)
		}
		funcs.WriteString("\treturn nil\n}\n")
	}
	var b strings.Builder
	b.WriteString("// The README's Go fragments, each in a function of its own.\npackage main\n\nimport (\n")
	names := make([]string, 0, len(imports))
	for name := range imports {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&b, "\t%q\n", fragmentImports[name])
	}
	b.WriteString(")\n")
	b.WriteString(fragmentEnv)
	b.WriteString(funcs.String())
	b.WriteString("\nfunc main() {}\n")
	return b.String()
}

// readme returns what TestMain prepared, failing the test if the README
// could not be read.
func readme(t *testing.T) *readmePrepared {
	t.Helper()
	if readmePrep.err != nil {
		t.Fatalf("README: %v", readmePrep.err)
	}
	return &readmePrep
}

// needIsolation skips the test, or fails it in CI, where processes cannot
// get a network namespace of their own.
func needIsolation(t *testing.T) {
	t.Helper()
	cmd, err := isolatedCommand("true")
	if err == nil {
		var out []byte
		if out, err = cmd.CombinedOutput(); err != nil {
			err = fmt.Errorf("%v %s", err, bytes.TrimSpace(out))
		}
	}
	if err != nil {
		testtools.Missing(t, "network and PID namespaces of their own for the README's blocks: "+err.Error())
	}
}

// runIsolated runs cmd, made by isolatedCommand, to its end, or kills
// it past blockGuard, and returns its error. stdout and stderr are cmd's.
func runIsolated(t *testing.T, cmd *exec.Cmd, what string) error {
	t.Helper()
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(blockGuard):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("still running after %v (a guard against a hang, not a check of speed): killed", blockGuard)
	}
}

// runShell runs script with bash -e as TestREADMEShell says, and returns
// its output (stdout and stderr together); it fails the test if the
// script fails, with its output and the logs it wrote.
func runShell(t *testing.T, line int, script string) string {
	t.Helper()
	p := readme(t)
	tmp := t.TempDir()
	cmd, err := isolatedCommand("bash", "-e", "-o", "pipefail", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Dir = p.root
	// The agents' state files, in their default place, under the test's
	// directory too.
	cmd.Env = append(cmd.Env, "PATH="+p.bin+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+tmp, "XDG_STATE_HOME="+filepath.Join(tmp, "state"))
	var out testtools.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := runIsolated(t, cmd, fmt.Sprintf("README.md:%d", line)); err != nil {
		t.Fatalf("README.md:%d: the block failed: %v\n--- its output:\n%s%s", line, err, out.String(), logsUnder(tmp))
	}
	t.Logf("README.md:%d: the block's output:\n%s", line, out.String())
	return out.String()
}

// logsUnder returns the *.log files under dir, each under a header line.
func logsUnder(dir string) string {
	var b strings.Builder
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".log") {
			content, _ := os.ReadFile(path)
			fmt.Fprintf(&b, "--- %s:\n%s\n", path, content)
		}
		return nil
	})
	return b.String()
}

// untracked lists the files of the repository git does not track and
// does not ignore; ok is false when there is no git or no repository.
func untracked(root string) (files []string, ok bool) {
	out, err := exec.Command("git", "-C", root, "ls-files", "--others", "--exclude-standard").Output()
	if err != nil {
		return nil, false
	}
	return strings.Fields(string(out)), true
}

// TestREADMEShell runs the README's shell blocks, each in namespaces of its
// own, as the comment at the top of this file says.
func TestREADMEShell(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the README's blocks: edges, agents, etcd, haproxy")
	}
	p := readme(t)
	testtools.Need(t, "bash", "curl", "openssl", "etcd", "haproxy")
	needIsolation(t)
	if p.install == nil {
		t.Fatal("README: no block installs the binaries with `go install ./examples/NAME...`")
	}
	before, gitOK := untracked(p.root)
	first := true
	for _, b := range p.blocks {
		if b.lang != "sh" {
			continue
		}
		top := first
		first = false
		t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
			switch {
			case b.skip != "":
				t.Skipf("README.md:%d: %s", b.line, b.skip)
			case top:
				runTopBlock(t, b)
			case p.install.line == b.line:
				if p.installErr != nil {
					t.Fatalf("README.md:%d: the install block failed (run by TestMain): %v", b.line, p.installErr)
				}
				for _, name := range examples {
					if _, err := os.Stat(filepath.Join(p.bin, name)); err != nil {
						t.Errorf("README.md:%d: the install block did not install %s: %v", b.line, name, err)
					}
				}
				// Nothing else: the benchmark programs run with go run,
				// and a user's PATH gets no binary named datapath.
				installed, err := os.ReadDir(p.bin)
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range installed {
					if !slices.Contains(examples, f.Name()) {
						t.Errorf("README.md:%d: the install block installs %s, which is not one of the example binaries %q", b.line, f.Name(), examples)
					}
				}
			default:
				for _, cl := range commandLines(b) {
					if curlWithoutFail(cl.text) {
						t.Errorf("README.md:%d: curl without -f (--fail): an error page would pass for an answer", cl.line)
					}
				}
				runShell(t, b.line, b.text)
			}
		})
	}
	if after, ok := untracked(p.root); ok && gitOK {
		for _, f := range after {
			if !slices.Contains(before, f) {
				t.Errorf("README: a block left %s in the repository: blocks write into a directory of mktemp -d", f)
			}
		}
	}
}

// runTopBlock runs the README's first block: the demo, until it printed
// its curl lines, which run; and the test command, which runs this test,
// is checked to include this package.
func runTopBlock(t *testing.T, b readmeBlock) {
	p := readme(t)
	for i, line := range strings.Split(strings.TrimSpace(b.text), "\n") {
		switch {
		case strings.HasPrefix(line, "go test "):
			if !slices.Contains(strings.Fields(line), "./examples/...") {
				t.Errorf("README.md:%d: the test command %q does not run ./examples/..., where this test is", b.line+i, line)
			}
		case line == "go run ./examples/demo":
			if p.demoErr != nil {
				t.Fatalf("README.md:%d: %v", b.line+i, p.demoErr)
			}
			// The demo runs in the background, its stdout read line by
			// line: each curl line it prints runs, until it says it runs
			// until Ctrl-C. The namespace's end stops it.
			script := "coproc demo { " + line + "; }\n" + `
while IFS= read -r line <&"${demo[0]}"; do
	printf '%s\n' "$line"
	case $line in
	"  curl "*) eval "$line" ;;
	"Ctrl-C to stop.") exit 0 ;;
	esac
done
echo "the demo ended without saying Ctrl-C to stop."
exit 1
`
			out := runShell(t, b.line+i, script)
			curls := strings.Count(out, "\n  curl ")
			if got := strings.Count(out, "Hello from behind the tunnel!"); curls == 0 || got != curls {
				t.Errorf("README.md:%d: the demo printed %d curl lines, and %d answers came back:\n%s", b.line+i, curls, got, out)
			}
		default:
			t.Errorf("README.md:%d: the first block's line %q: the test runs the demo and checks the test command, nothing else", b.line+i, line)
		}
	}
}

// TestREADMEGo checks that the README's Go fragments compile, and runs its
// programs: each prints what the text block after it shows.
func TestREADMEGo(t *testing.T) {
	p := readme(t)
	if err := p.goErrs[0]; err != nil {
		t.Errorf("README: the Go fragments do not compile: %v", err)
	}
	var programs int
	for i, b := range p.blocks {
		if !b.program() {
			continue
		}
		programs++
		t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
			if err := p.goErrs[b.line]; err != nil {
				t.Fatalf("README.md:%d: the program does not build: %v", b.line, err)
			}
			if i+1 == len(p.blocks) || p.blocks[i+1].lang != "text" {
				t.Fatalf("README.md:%d: a program is followed by a ```text block of what it prints", b.line)
			}
			want := p.blocks[i+1]
			if testing.Short() {
				t.Skip("runs an edge")
			}
			needIsolation(t)
			cmd, err := isolatedCommand(p.programs[b.line])
			if err != nil {
				t.Fatal(err)
			}
			cmd.Env = append(cmd.Env, "TMPDIR="+t.TempDir())
			var stdout, stderr testtools.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := runIsolated(t, cmd, fmt.Sprintf("README.md:%d", b.line)); err != nil {
				t.Fatalf("README.md:%d: the program failed: %v\n--- stdout:\n%s--- stderr:\n%s", b.line, err, stdout.String(), stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != strings.TrimSpace(want.text) {
				t.Errorf("README.md:%d: the program printed\n%s\nand README.md:%d says it prints\n%s", b.line, got, want.line, strings.TrimSpace(want.text))
			}
		})
	}
	if programs == 0 {
		t.Error("README: no complete Go program (a ```go block starting with package main) to run")
	}
}

// TestREADMEFlags checks the command lines of the README's blocks against
// the binaries: each flag a line gives its binary is one of its flags, and
// each flag of a binary is given on some line (the README's list of the
// example binaries has them all).
func TestREADMEFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	p := readme(t)
	bin := build(t, examples...)
	given := map[string]map[string][]int{} // binary, flag: README lines
	for _, b := range p.blocks {
		if b.lang == "go" {
			continue
		}
		for _, cl := range commandLines(b) {
			name, flags := commandFlags(cl.text)
			if name == "" {
				continue
			}
			if given[name] == nil {
				given[name] = map[string][]int{}
			}
			for _, f := range flags {
				given[name][f] = append(given[name][f], cl.line)
			}
		}
	}
	for _, name := range examples {
		have := helpFlags(t, filepath.Join(bin, name))
		for f, lines := range given[name] {
			if !have[f] {
				t.Errorf("README.md:%d: %s has no flag -%s", lines[0], name, f)
			}
		}
		for f := range have {
			if given[name][f] == nil {
				t.Errorf("README: no command line gives %s's flag -%s (the list under \"The example binaries\" names every flag)", name, f)
			}
		}
	}
}

// commandLine is a line of a block with its continuation lines (ending
// in a backslash) joined.
type commandLine struct {
	line int
	text string
}

func commandLines(b readmeBlock) []commandLine {
	var out []commandLine
	var cur commandLine
	for i, l := range strings.Split(b.text, "\n") {
		if cur.text == "" {
			cur.line = b.line + i
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.text += s + " "
			continue
		}
		cur.text += l
		out = append(out, cur)
		cur = commandLine{}
	}
	return out
}

// commandFlags returns the example binary a command line runs (after
// environment assignments; "go run ./examples/NAME" runs NAME) and the
// flags it gives it, up to a comment, a redirection or the next command.
func commandFlags(line string) (name string, flags []string) {
	words := strings.Fields(line)
	for len(words) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(words[0]) {
		words = words[1:]
	}
	if len(words) >= 3 && words[0] == "go" && words[1] == "run" && strings.HasPrefix(words[2], "./examples/") {
		words = append([]string{strings.TrimPrefix(words[2], "./examples/")}, words[3:]...)
	}
	if len(words) == 0 || !slices.Contains(examples, words[0]) {
		return "", nil
	}
	flag := regexp.MustCompile(`^\[*-([a-z][a-z0-9-]*)`)
	for _, w := range words[1:] {
		if w == "&" || w == "&&" || w == ";" || strings.HasPrefix(w, "#") || strings.HasPrefix(w, ">") || strings.HasPrefix(w, "2>") {
			break
		}
		if m := flag.FindStringSubmatch(w); m != nil {
			flags = append(flags, m[1])
		}
	}
	return words[0], flags
}

// curlWithoutFail reports whether a command line runs curl without -f
// (alone or among other short flags), --fail or --fail-with-body.
func curlWithoutFail(line string) bool {
	words := strings.Fields(strings.ReplaceAll(line, ";", " ; "))
	for i, w := range words {
		if w != "curl" || i > 0 && !slices.Contains([]string{";", "|", "&&", "||", "&", "do", "then", "until", "while", "if", "!"}, words[i-1]) {
			continue // not a command
		}
		fail := false
		for _, a := range words[i+1:] {
			if a == "|" || a == ";" || a == "&&" || a == "||" || a == "&" || strings.HasPrefix(a, "#") {
				break
			}
			fail = fail || a == "--fail" || a == "--fail-with-body" || regexp.MustCompile(`^-[a-zA-Z]*f[a-zA-Z]*$`).MatchString(a)
		}
		if !fail {
			return true
		}
	}
	return false
}

// helpFlags returns the flags bin -h lists.
func helpFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-h")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatal(err)
		}
	}
	flags := map[string]bool{}
	sc := bufio.NewScanner(&stderr)
	usage := regexp.MustCompile(`^  -([a-z][a-z0-9-]*)`)
	for sc.Scan() {
		if m := usage.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s -h lists no flags:\n%s", filepath.Base(bin), stderr.String())
	}
	return flags
}

// TestParseREADME checks the reading of blocks and markers on a small
// README.
func TestParseREADME(t *testing.T) {
	src := "# t\n\n    go run ./x\n    go test ./...\n\ntext\n\n<!-- readme-test: skip (needs a public DNS name) -->\n\n    edge -tls :443\n\nmid\n\n    a\n\n    b\n\n```go\npackage main\n```\n\n```text\nout\n```\n"
	blocks, err := parseREADME(src)
	if err != nil {
		t.Fatal(err)
	}
	want := []readmeBlock{
		{line: 3, lang: "sh", text: "go run ./x\ngo test ./...\n"},
		{line: 10, lang: "sh", text: "edge -tls :443\n", skip: "needs a public DNS name"},
		{line: 14, lang: "sh", text: "a\n\nb\n"},
		{line: 19, lang: "go", text: "package main\n"},
		{line: 23, lang: "text", text: "out\n"},
	}
	if !slices.Equal(blocks, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", blocks, want)
	}
	if !blocks[3].program() || blocks[2].program() {
		t.Error("program(): only a go block starting with package main is a program")
	}
	for _, bad := range []string{
		"<!-- readme-test: skip (x) -->\ntext\n\n    a\n",
		"<!-- readme-test: run -->\n\n    a\n",
		"```go\nx\n",
		"<!-- readme-test: skip (x) -->\n",
	} {
		if _, err := parseREADME(bad); err == nil {
			t.Errorf("parseREADME(%q) took it", bad)
		}
	}
	if name, flags := commandFlags(`HTTPS_PROXY=x agent -edge e:7000 [-token T] -access-log=false -to a & # -not`); name != "agent" || !slices.Equal(flags, []string{"edge", "token", "access-log", "to"}) {
		t.Errorf("commandFlags: %q %q", name, flags)
	}
	for line, want := range map[string]bool{
		`curl -fsS http://x/`:                         false,
		`curl --resolve a:1:b --fail http://x/`:       false,
		`until [ -s x ]; do curl -sS http://x/; done`: true,
		`curl -fsS a | grep b; curl -s c`:             true,
		`echo curl`:                                   false,
	} {
		if curlWithoutFail(line) != want {
			t.Errorf("curlWithoutFail(%q) = %v", line, !want)
		}
	}
	if name, _ := commandFlags("go run ./examples/demo -v"); name != "demo" {
		t.Errorf("commandFlags(go run ./examples/demo): %q", name)
	}
}
