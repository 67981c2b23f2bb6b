package examples_test

// The documents, run as a newcomer runs them: README.md and every file of
// docs/. TestREADMEShell runs their shell blocks, TestREADMEGo builds their
// Go code and runs their programs, and TestREADMEFlags holds the flags of
// their command lines against the binaries'. What compiles (the README's
// `go install ./examples/tunnelkit`, the examples the documents run with
// go run or go build, their Go code, the demo's `go run`) is built by
// TestMain, before any test's deadline starts, into a directory of the
// user's cache kept from run to run (keptDir), where a run with nothing
// changed links nothing.
//
// How a document's blocks are read:
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
// test command is checked to include this package. Its install block is
// run by TestMain, and must install tunnelkit and nothing else. The blocks
// must leave no file in the repository.

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

// blockGuard bounds how long one block or program may run: a guard
// against a block that hangs, far above what any takes, not a check of
// speed.
const blockGuard = 3 * time.Minute

// readmeBlock is one code block of a document.
type readmeBlock struct {
	doc  string // the document, from the repository's root: README.md, docs/agent.md
	line int    // of its first line in doc, from 1
	lang string // "sh" for shell, "go", or another fence's label ("text")
	text string // its lines, without indentation or fences
	skip string // the reason of a readme-test skip marker before it
}

// where is the block's place, for messages: docs/agent.md:40.
func (b readmeBlock) where() string { return fmt.Sprintf("%s:%d", b.doc, b.line) }

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

// documents returns the documents whose blocks the tests run, from the
// repository's root: README.md, then the files of docs/.
func documents(root string) ([]string, error) {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	out := []string{"README.md"}
	for _, d := range docs {
		out = append(out, "docs/"+filepath.Base(d))
	}
	sort.Strings(out[1:])
	return out, nil
}

// parseDoc returns the code blocks of the Markdown document doc, whose
// text is src.
func parseDoc(doc, src string) ([]readmeBlock, error) {
	lines := strings.Split(src, "\n")
	var blocks []readmeBlock
	skip, skipLine := "", 0 // a marker waiting for its block
	add := func(b readmeBlock) {
		b.doc = doc
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
				return nil, fmt.Errorf("%s:%d: a fence that never closes", doc, b.line-1)
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
				return nil, fmt.Errorf("%s:%d: a readme-test marker other than \"skip (REASON)\": %s", doc, i+1, l)
			}
			skip, skipLine = m[1], i+1
		case strings.TrimSpace(l) == "":
		default:
			if skip != "" {
				return nil, fmt.Errorf("%s:%d: the skip marker is not right before a block", doc, skipLine)
			}
		}
	}
	if skip != "" {
		return nil, fmt.Errorf("%s:%d: the skip marker is not right before a block", doc, skipLine)
	}
	return blocks, nil
}

// readmePrepared is what TestMain did with the documents for the tests.
type readmePrepared struct {
	root   string   // the repository's root, absolute
	docs   []string // the documents, from root: README.md, docs/...
	blocks []readmeBlock
	err    error // reading or parsing a document

	install    *readmeBlock // the README's block with `go install ./examples/NAME...`
	installErr error        // running it, with its output
	bin        string       // where it installed the binaries

	examples    string // the examples the tests run: links to those installed, the others built
	examplesErr error  // building the others

	demoErr error // `go run ./examples/demo -h`, which builds what the demo block runs

	programs map[string]string // place (where) of each program: its binary
	goErrs   map[string]error  // place of a program, or "" for the fragments: why it did not build
}

var readmePrep readmePrepared

// installed returns a directory holding the example binaries names,
// and whether it holds every one: those the README's install block
// installed, as links, and the others (which the documents run with go
// run) built by prepareREADME, as go run builds them.
func (p *readmePrepared) installed(names []string) (string, bool) {
	if p.install == nil || p.installErr != nil || p.examplesErr != nil || p.examples == "" {
		return "", false
	}
	for _, n := range names {
		if fi, err := os.Stat(filepath.Join(p.examples, n)); err != nil || !fi.Mode().IsRegular() {
			return "", false
		}
	}
	return p.examples, true
}

// installs reports whether the README's install block installs the
// example name.
func (p *readmePrepared) installs(name string) bool {
	return slices.Contains(strings.Fields(p.install.text), "./examples/"+name)
}

// prepareREADME builds, before the tests run, everything the documents'
// blocks compile, and returns a func that removes what it made. What fails
// is kept in readmePrep for the tests to report.
func prepareREADME() (cleanup func()) {
	p := &readmePrep
	p.root, p.err = filepath.Abs("..")
	if p.err != nil {
		return func() {}
	}
	if p.docs, p.err = documents(p.root); p.err != nil {
		return func() {}
	}
	for _, doc := range p.docs {
		src, err := os.ReadFile(filepath.Join(p.root, doc))
		if err != nil {
			p.err = err
			return func() {}
		}
		blocks, err := parseDoc(doc, string(src))
		if err != nil {
			p.err = err
			return func() {}
		}
		p.blocks = append(p.blocks, blocks...)
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
		if b.doc == "README.md" && b.lang == "sh" && strings.Contains(b.text, "go install ./examples/") {
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
			p.examples = filepath.Join(kept, "examples")
			p.examplesErr = p.buildExamples(p.examples)
		}
	}

	// The demo block's `go run`, whose executable the build cache keeps.
	cmd := exec.Command("go", "run", "./examples/demo", "-h")
	cmd.Dir = p.root
	if out, err := cmd.CombinedOutput(); err != nil {
		p.demoErr = fmt.Errorf("go run ./examples/demo -h: %v\n%s", err, out)
	}

	p.buildGo(filepath.Join(kept, "go"))
	prepareDockerfile(p.root, filepath.Join(kept, "docker"))
	return cleanup
}

// buildExamples makes dir hold every example the tests run: a link to
// each the install block installed, and the others built there (a build
// with nothing changed links nothing).
func (p *readmePrepared) buildExamples(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var build []string
	for _, name := range examples {
		path := filepath.Join(dir, name)
		if !p.installs(name) {
			build = append(build, "./examples/"+name)
			if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
				os.Remove(path)
			}
			continue
		}
		os.Remove(path)
		if err := os.Symlink(filepath.Join(p.bin, name), path); err != nil {
			return err
		}
	}
	if len(build) == 0 {
		return nil
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, build...)...)
	cmd.Dir = p.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", strings.Join(build, " "), err, out)
	}
	return nil
}

// keptDir returns the directory where what the documents' blocks build is
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

// programPackage names the package of the program at b: doc and line,
// in letters a package path takes (docs_library_md_120).
func programPackage(b readmeBlock) string {
	return regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(b.doc, "_") + fmt.Sprintf("_%d", b.line)
}

// buildGo builds the documents' programs, and their fragments inside
// functions, in a module of a workspace with the repository's, in dir.
func (p *readmePrepared) buildGo(dir string) {
	p.programs, p.goErrs = map[string]string{}, map[string]error{}
	fail := func(err error) { p.goErrs[""] = err }
	// What an earlier run wrote goes: programs of blocks that moved.
	os.RemoveAll(filepath.Join(dir, "src"))
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
			files["src/"+programPackage(b)+"/main.go"] = fmt.Sprintf("//line %s:%d\n%s", b.doc, b.line, b.text)
		case b.lang == "go":
			fragments = append(fragments, b)
		}
	}
	if len(fragments) > 0 {
		files["src/fragments/main.go"] = fragmentHarness(fragments)
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
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", pkg), "./src/"+pkg)
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
		pkg := programPackage(b)
		if err := build(pkg); err != nil {
			p.goErrs[b.where()] = err
			continue
		}
		p.programs[b.where()] = filepath.Join(dir, "bin", pkg)
	}
}

// fragmentEnv declares the names the documents' fragments use without
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
	etcdTLS       *tls.Config
	relayTLS      *tls.Config
)
`

// fragmentImports are the packages fragments may name, by name; those of
// fragmentEnv are always imported.
var fragmentImports = map[string]string{
	"agent":      "github.com/tunnelkit/tunnelkit/agent",
	"autocert":   "golang.org/x/crypto/acme/autocert",
	"clientv3":   "go.etcd.io/etcd/client/v3",
	"etcdrouter": "github.com/tunnelkit/tunnelkit/router/etcdrouter",
	"context":    "context",
	"edge":       "github.com/tunnelkit/tunnelkit/edge",
	"errors":     "errors",
	"fmt":        "fmt",
	"forward":    "github.com/tunnelkit/tunnelkit/agent/forward",
	"forwarded":  "github.com/tunnelkit/tunnelkit/forwarded",
	"http":       "net/http",
	"inspect":    "github.com/tunnelkit/tunnelkit/agent/inspect",
	"io":         "io",
	"log":        "log",
	"net":        "net",
	"netip":      "net/netip",
	"oidc":       "github.com/tunnelkit/tunnelkit/policy/oidc",
	"os":         "os",
	"policy":     "github.com/tunnelkit/tunnelkit/policy",
	"relay":      "github.com/tunnelkit/tunnelkit/edge/relay",
	"router":     "github.com/tunnelkit/tunnelkit/router",
	"slog":       "log/slog",
	"sni":        "github.com/tunnelkit/tunnelkit/sni",
	"time":       "time",
	"tls":        "crypto/tls",
	"view":       "github.com/tunnelkit/tunnelkit/edge/view",
	"x509":       "crypto/x509",
}

// fragmentHarness returns a program with each fragment, verbatim, as the
// body of a function returning an error, its compile errors pointing at
// the documents' lines. The names a fragment defines are used after it,
// as the code that would follow it in an app would.
func fragmentHarness(fragments []readmeBlock) string {
	imports := map[string]bool{"agent": true, "context": true, "edge": true, "http": true, "net": true, "router": true, "tls": true}
	var funcs strings.Builder
	for i, f := range fragments {
		var defined []string
		// A fragment that does not parse gets no uses: the compiler
		// reports its error at the document's line.
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
		fmt.Fprintf(&funcs, "\nfunc fragment%d() error {\n//line %s:%d\n%s", i, f.doc, f.line, f.text)
		for _, name := range defined {
			fmt.Fprintf(&funcs, "\t_ = %s\n", name)
		}
		funcs.WriteString("\treturn nil\n}\n")
	}
	var b strings.Builder
	b.WriteString("// The documents' Go fragments, each in a function of its own.\npackage main\n\nimport (\n")
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

// readme returns what TestMain prepared, failing the test if a document
// could not be read.
func readme(t *testing.T) *readmePrepared {
	t.Helper()
	if readmePrep.err != nil {
		t.Fatalf("documents: %v", readmePrep.err)
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
		testtools.Missing(t, "network and PID namespaces of their own for the documents' blocks: "+err.Error())
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

// runShell runs script, the block at where, with bash -e as
// TestREADMEShell says, and returns its output (stdout and stderr
// together); it fails the test if the script fails, with its output and
// the logs it wrote.
func runShell(t *testing.T, where, script string) string {
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
	if err := runIsolated(t, cmd, where); err != nil {
		t.Fatalf("%s: the block failed: %v\n--- its output:\n%s%s", where, err, out.String(), logsUnder(tmp))
	}
	t.Logf("%s: the block's output:\n%s", where, out.String())
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

// TestREADMEShell runs the shell blocks of every document, each in
// namespaces of its own, as the comment at the top of this file says: one
// subtest for each document, one for each of its blocks
// (TestREADMEShell/agent.md/line40).
func TestREADMEShell(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the documents' blocks: edges, agents, etcd, haproxy")
	}
	p := readme(t)
	testtools.Need(t, "bash", "curl", "openssl", "etcd", "haproxy")
	needIsolation(t)
	if p.install == nil {
		t.Fatal("README: no block installs the binaries with `go install ./examples/NAME...`")
	}
	before, gitOK := untracked(p.root)
	first := true
	for _, doc := range p.docs {
		t.Run(filepath.Base(doc), func(t *testing.T) {
			for _, b := range p.blocks {
				if b.doc != doc || b.lang != "sh" {
					continue
				}
				top := first
				first = false
				t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
					switch {
					case b.skip != "":
						t.Skipf("%s: %s", b.where(), b.skip)
					case top:
						runTopBlock(t, b)
					case p.install.where() == b.where():
						checkInstall(t, b)
					default:
						for _, cl := range commandLines(b) {
							if curlWithoutFail(cl.text) {
								t.Errorf("%s:%d: curl without -f (--fail): an error page would pass for an answer", b.doc, cl.line)
							}
						}
						runShell(t, b.where(), b.text)
					}
				})
			}
		})
	}
	if after, ok := untracked(p.root); ok && gitOK {
		for _, f := range after {
			if !slices.Contains(before, f) {
				t.Errorf("documents: a block left %s in the repository: blocks write into a directory of mktemp -d", f)
			}
		}
	}
}

// checkInstall checks what the README's install block, which TestMain
// ran, installed: tunnelkit, and nothing else. The small examples run
// with go run, the benchmark programs too, and a user's PATH gets no
// binary named hello, demo or datapath.
func checkInstall(t *testing.T, b readmeBlock) {
	p := readme(t)
	if p.installErr != nil {
		t.Fatalf("%s: the install block failed (run by TestMain): %v", b.where(), p.installErr)
	}
	if p.examplesErr != nil {
		t.Errorf("the examples the documents run with go run did not build beside it (run by TestMain): %v", p.examplesErr)
	}
	installed, err := os.ReadDir(p.bin)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range installed {
		names = append(names, f.Name())
	}
	if !slices.Equal(names, []string{"tunnelkit"}) {
		t.Errorf("%s: the install block installs %q; want tunnelkit alone", b.where(), names)
	}
}

// runTopBlock runs the README's first block: the demo, until it printed
// its curl lines, which run; and the test command, which runs this test,
// is checked to include this package.
func runTopBlock(t *testing.T, b readmeBlock) {
	p := readme(t)
	for i, line := range strings.Split(strings.TrimSpace(b.text), "\n") {
		where := fmt.Sprintf("%s:%d", b.doc, b.line+i)
		switch {
		case strings.HasPrefix(line, "go test "):
			if !slices.Contains(strings.Fields(line), "./examples/...") {
				t.Errorf("%s: the test command %q does not run ./examples/..., where this test is", where, line)
			}
		case line == "go run ./examples/demo":
			if p.demoErr != nil {
				t.Fatalf("%s: %v", where, p.demoErr)
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
			out := runShell(t, where, script)
			curls := strings.Count(out, "\n  curl ")
			if got := strings.Count(out, "Hello from behind the tunnel!"); curls == 0 || got != curls {
				t.Errorf("%s: the demo printed %d curl lines, and %d answers came back:\n%s", where, curls, got, out)
			}
		default:
			t.Errorf("%s: the first block's line %q: the test runs the demo and checks the test command, nothing else", where, line)
		}
	}
}

// TestREADMEGo checks that the documents' Go fragments compile, and runs
// their programs: each prints what the text block after it shows.
func TestREADMEGo(t *testing.T) {
	p := readme(t)
	if err := p.goErrs[""]; err != nil {
		t.Errorf("documents: the Go fragments do not compile: %v", err)
	}
	var programs int
	for i, b := range p.blocks {
		if !b.program() {
			continue
		}
		programs++
		t.Run(fmt.Sprintf("%s/line%d", filepath.Base(b.doc), b.line), func(t *testing.T) {
			if err := p.goErrs[b.where()]; err != nil {
				t.Fatalf("%s: the program does not build: %v", b.where(), err)
			}
			if i+1 == len(p.blocks) || p.blocks[i+1].doc != b.doc || p.blocks[i+1].lang != "text" {
				t.Fatalf("%s: a program is followed by a ```text block of what it prints", b.where())
			}
			want := p.blocks[i+1]
			if testing.Short() {
				t.Skip("runs an edge")
			}
			needIsolation(t)
			cmd, err := isolatedCommand(p.programs[b.where()])
			if err != nil {
				t.Fatal(err)
			}
			cmd.Env = append(cmd.Env, "TMPDIR="+t.TempDir())
			var stdout, stderr testtools.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := runIsolated(t, cmd, b.where()); err != nil {
				t.Fatalf("%s: the program failed: %v\n--- stdout:\n%s--- stderr:\n%s", b.where(), err, stdout.String(), stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != strings.TrimSpace(want.text) {
				t.Errorf("%s: the program printed\n%s\nand %s says it prints\n%s", b.where(), got, want.where(), strings.TrimSpace(want.text))
			}
		})
	}
	if programs == 0 {
		t.Error("documents: no complete Go program (a ```go block starting with package main) to run")
	}
}

// flagDocs are the commands whose flags the documents give, each with the
// document whose command lines give every one of its flags (its list of
// every flag).
var flagDocs = []struct{ command, doc string }{
	{"tunnelkit edge", "docs/edge.md"},
	{"tunnelkit agent", "docs/agent.md"},
	{"demo", "docs/library.md"},
	{"hello", "docs/library.md"},
	{"sniproxy", "docs/library.md"},
}

// otherFlags are the flags of other programs that the documents' prose
// names in code spans (`-race`), which TestREADMEFlags lets pass.
var otherFlags = map[string]string{
	"race":      "go test",
	"run":       "go test",
	"count":     "go test",
	"short":     "go test",
	"bench":     "go test",
	"benchtime": "go test",
	"trimpath":  "go build",
	"ldflags":   "go build",
	"duration":  "examples/bench/datapath",
	"runs":      "examples/bench/datapath",
	"rows":      "examples/bench/datapath",
	"json":      "examples/bench/scale",
	"check":     "examples/bench/scale",
}

// TestREADMEFlags checks the command lines of the documents' blocks
// against the binaries: each flag a line gives its command (tunnelkit
// edge, tunnelkit agent or its shorthands, go run ./examples/hello...) is
// one of the command's flags, and each subcommand a line names is one of
// tunnelkit's; each flag of a command is given on some line of its
// document (flagDocs: the list of every flag there has them all); and
// each flag the documents' prose names in a code span (`-to`) is a flag
// of one of the commands, or of otherFlags.
func TestREADMEFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries")
	}
	p := readme(t)
	bin := build(t, examples...)
	subcommands := helpSubcommands(t, filepath.Join(bin, "tunnelkit"))
	have := map[string]map[string]bool{} // command: its flags
	for _, c := range flagDocs {
		words := strings.Fields(c.command)
		have[c.command] = helpFlags(t, filepath.Join(bin, words[0]), words[1:]...)
	}
	given := map[string]map[string][]string{} // command, flag: the places of the lines, doc:line
	for _, b := range p.blocks {
		if b.lang == "go" {
			continue
		}
		for _, cl := range commandLines(b) {
			for _, c := range commandsOf(cl.text) {
				where := fmt.Sprintf("%s:%d", b.doc, cl.line)
				if c.name == "tunnelkit" {
					if c.sub != "" && !slices.Contains(subcommands, c.sub) {
						t.Errorf("%s: tunnelkit has no subcommand %q (tunnelkit -h lists %q)", where, c.sub, subcommands)
					}
					continue
				}
				if given[c.name] == nil {
					given[c.name] = map[string][]string{}
				}
				for _, f := range c.flags {
					if !have[c.name][f] {
						t.Errorf("%s: %s has no flag -%s", where, c.name, f)
					}
					given[c.name][f] = append(given[c.name][f], where)
				}
			}
		}
	}
	for _, c := range flagDocs {
		for f := range have[c.command] {
			if !slices.ContainsFunc(given[c.command][f], func(where string) bool { return strings.HasPrefix(where, c.doc+":") }) {
				t.Errorf("%s: no command line gives %s's flag -%s (its list of every flag names them all)", c.doc, c.command, f)
			}
		}
	}
	// The prose.
	for _, doc := range p.docs {
		src, err := os.ReadFile(filepath.Join(p.root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, span := range proseCodeSpans(string(src)) {
			m := proseFlag.FindStringSubmatch(span.text)
			if m == nil || otherFlags[m[1]] != "" {
				continue
			}
			if !slices.ContainsFunc(flagDocs, func(c struct{ command, doc string }) bool { return have[c.command][m[1]] }) {
				t.Errorf("%s:%d: `%s` names no flag of tunnelkit edge, tunnelkit agent, demo, hello or sniproxy", doc, span.line, span.text)
			}
		}
	}
}

// proseFlag is a code span of prose that starts with a flag: `-to`,
// `-log-requests=false`, `-http-idle 1h`, but not `-1s` or `--fail`.
var proseFlag = regexp.MustCompile(`^-([a-z][a-z0-9-]*[a-z0-9])(?:[= ]|$)`)

// proseSpan is an inline code span of a document's prose.
type proseSpan struct {
	line int
	text string
}

// proseCodeSpans returns the inline code spans of a Markdown document's
// prose: outside its code blocks, as parseDoc finds them.
func proseCodeSpans(src string) []proseSpan {
	var spans []proseSpan
	span := regexp.MustCompile("(`+)([^`]|[^`].*?[^`])`+")
	for i, l := range proseLines(src) {
		for _, m := range span.FindAllStringSubmatch(l, -1) {
			spans = append(spans, proseSpan{line: i + 1, text: strings.TrimSpace(m[2])})
		}
	}
	return spans
}

// proseLines returns the lines of a Markdown document with those of its
// code blocks (fenced, or indented after a blank line) made empty, so
// that the others keep their numbers.
func proseLines(src string) []string {
	lines := strings.Split(src, "\n")
	out := make([]string, len(lines))
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "```"):
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			}
		case strings.HasPrefix(l, "    ") && (i == 0 || strings.TrimSpace(lines[i-1]) == ""):
			for ; i+1 < len(lines) && (strings.HasPrefix(lines[i+1], "    ") || strings.TrimSpace(lines[i+1]) == ""); i++ {
			}
		default:
			out[i] = l
		}
	}
	return out
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

// command is one of the examples' commands on a command line.
type command struct {
	name  string   // tunnelkit edge, tunnelkit agent, hello...; tunnelkit for its other subcommands
	sub   string   // for tunnelkit, the word after it ("version"; "-h"), if any
	flags []string // the flags given, without their dash
}

// separators are the words after which a new command starts.
var separators = []string{"&", "&&", "||", ";", "|", "(", "{", "!", "do", "then", "else", "if", "while", "until"}

// commandsOf returns the commands of the examples a command line runs:
// tunnelkit (its agent shorthands http, https, tcp and tls as "tunnelkit
// agent"), an example run with "go run ./examples/NAME", or one built
// into the block's directory ("./hello"); each after environment
// assignments, at the start of the line or after a separator, with the
// flags given to it up to a comment, a redirection or the next command.
func commandsOf(line string) []command {
	words := strings.Fields(strings.NewReplacer(";", " ; ", "(", " ( ", ")", " ) ").Replace(line))
	var out []command
	start := true
	for i := 0; i < len(words); i++ {
		w := words[i]
		if strings.HasPrefix(w, "#") {
			break
		}
		if slices.Contains(separators, w) {
			start = true
			continue
		}
		if !start {
			continue
		}
		if regexp.MustCompile(`^[A-Z_]+=`).MatchString(w) {
			continue // an assignment: the command comes after it
		}
		start = false
		var c command
		rest := words[i+1:]
		switch {
		case w == "tunnelkit" && len(rest) > 0 && strings.HasSuffix(rest[0], ":"):
			continue // a message: "tunnelkit agent: unauthorized: ..."
		case w == "tunnelkit" && len(rest) > 0:
			c.name, c.sub = "tunnelkit", rest[0]
			switch rest[0] {
			case "edge":
				c.name, rest = "tunnelkit edge", rest[1:]
			case "agent", "http", "https", "tcp", "tls":
				c.name, rest = "tunnelkit agent", rest[1:]
			}
		case w == "tunnelkit":
			c.name = "tunnelkit"
		case w == "go" && len(rest) >= 2 && rest[0] == "run" && strings.HasPrefix(rest[1], "./examples/"):
			c.name, rest = strings.TrimPrefix(rest[1], "./examples/"), rest[2:]
		case strings.HasPrefix(w, "./") && slices.Contains(examples, strings.TrimPrefix(w, "./")):
			c.name = strings.TrimPrefix(w, "./")
		default:
			continue
		}
		flag := regexp.MustCompile(`^\[*-([a-z][a-z0-9-]*)`)
		depth := 0 // of usage lines' brackets, where | is "or", not a pipe
		for _, a := range rest {
			if (slices.Contains(separators, a) && (a != "|" || depth == 0)) || a == ")" || strings.HasPrefix(a, "#") || strings.HasPrefix(a, ">") || strings.HasPrefix(a, "2>") {
				break
			}
			depth += strings.Count(a, "[") - strings.Count(a, "]")
			if m := flag.FindStringSubmatch(a); m != nil && c.name != "tunnelkit" {
				c.flags = append(c.flags, m[1])
			}
		}
		out = append(out, c)
	}
	return out
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

// helpOutput returns what bin args... -h prints on stderr.
func helpOutput(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "-h")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatal(err)
		}
	}
	return stderr.String()
}

// helpFlags returns the flags bin args... -h lists.
func helpFlags(t *testing.T, bin string, args ...string) map[string]bool {
	t.Helper()
	help := helpOutput(t, bin, args...)
	flags := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(help))
	usage := regexp.MustCompile(`^  -([a-z][a-z0-9-]*)`)
	for sc.Scan() {
		if m := usage.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s -h lists no flags:\n%s", strings.Join(append([]string{filepath.Base(bin)}, args...), " "), help)
	}
	return flags
}

// helpSubcommands returns the subcommands tunnelkit -h lists, and -h.
func helpSubcommands(t *testing.T, bin string) []string {
	t.Helper()
	help := helpOutput(t, bin)
	_, list, ok := strings.Cut(help, "\nSubcommands:\n")
	if !ok {
		t.Fatalf("tunnelkit -h lists no subcommands:\n%s", help)
	}
	subs := []string{"-h"}
	for _, l := range strings.Split(list, "\n") {
		m := regexp.MustCompile(`^  ([a-z]+)\s`).FindStringSubmatch(l)
		if m == nil {
			break
		}
		subs = append(subs, m[1])
	}
	return subs
}

// TestParseREADME checks the reading of blocks and markers on a small
// document, and of commands on command lines.
func TestParseREADME(t *testing.T) {
	src := "# t\n\n    go run ./x\n    go test ./...\n\ntext\n\n<!-- readme-test: skip (needs a public DNS name) -->\n\n    edge -tls :443\n\nmid\n\n    a\n\n    b\n\n```go\npackage main\n```\n\n```text\nout\n```\n"
	blocks, err := parseDoc("docs/x.md", src)
	if err != nil {
		t.Fatal(err)
	}
	want := []readmeBlock{
		{doc: "docs/x.md", line: 3, lang: "sh", text: "go run ./x\ngo test ./...\n"},
		{doc: "docs/x.md", line: 10, lang: "sh", text: "edge -tls :443\n", skip: "needs a public DNS name"},
		{doc: "docs/x.md", line: 14, lang: "sh", text: "a\n\nb\n"},
		{doc: "docs/x.md", line: 19, lang: "go", text: "package main\n"},
		{doc: "docs/x.md", line: 23, lang: "text", text: "out\n"},
	}
	if !slices.Equal(blocks, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", blocks, want)
	}
	if !blocks[3].program() || blocks[2].program() {
		t.Error("program(): only a go block starting with package main is a program")
	}
	if got := proseLines(src); got[5] != "text" || got[2] != "" || got[18] != "" || got[11] != "mid" {
		t.Errorf("proseLines: %q", got)
	}
	for _, bad := range []string{
		"<!-- readme-test: skip (x) -->\ntext\n\n    a\n",
		"<!-- readme-test: run -->\n\n    a\n",
		"```go\nx\n",
		"<!-- readme-test: skip (x) -->\n",
	} {
		if _, err := parseDoc("README.md", bad); err == nil {
			t.Errorf("parseDoc(%q) took it", bad)
		}
	}
	for line, want := range map[string][]command{
		`HTTPS_PROXY=x tunnelkit agent -edge e:7000 [-token T] -access-log=false -to a & # -not`: {{name: "tunnelkit agent", sub: "agent", flags: []string{"edge", "token", "access-log", "to"}}},
		`tunnelkit http 3000 -url http://x > app.url &`:                                          {{name: "tunnelkit agent", sub: "http", flags: []string{"url"}}},
		`tunnelkit edge -domain localhost & ./hello -listen 127.0.0.1:3000 &`:                    {{name: "tunnelkit edge", sub: "edge", flags: []string{"domain"}}, {name: "hello", flags: []string{"listen"}}},
		`(umask 077; tunnelkit edge -ech-keygen k.pem)`:                                          {{name: "tunnelkit edge", sub: "edge", flags: []string{"ech-keygen"}}},
		`tunnelkit version`:                             {{name: "tunnelkit", sub: "version"}},
		`tunnelkit edge [-tokens FILE | -anonymous] -x`: {{name: "tunnelkit edge", sub: "edge", flags: []string{"tokens", "anonymous", "x"}}},
		`tunnelkit agent: unauthorized: no token`:       nil,
		`go run ./examples/demo -v`:                     {{name: "demo", flags: []string{"v"}}},
		`curl -fsS x | grep -v tunnelkit`:               nil,
		`openssl req -x509 -newkey ec -nodes`:           nil,
		`echo tunnelkit edge -domain x`:                 nil,
		`until tunnelkit edge -bogus; do :; done`:       {{name: "tunnelkit edge", sub: "edge", flags: []string{"bogus"}}},
	} {
		got := commandsOf(line)
		if len(got) != len(want) || !slices.EqualFunc(got, want, func(a, b command) bool {
			return a.name == b.name && a.sub == b.sub && slices.Equal(a.flags, b.flags)
		}) {
			t.Errorf("commandsOf(%q) = %+v, want %+v", line, got, want)
		}
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
	for span, want := range map[string]string{"-to": "to", "-log-requests=false": "log-requests", "-http-idle 1h": "http-idle", "-1s": "", "--fail": "", "-max-*": ""} {
		var got string
		if m := proseFlag.FindStringSubmatch(span); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("proseFlag(%q) = %q, want %q", span, got, want)
		}
	}
}
