package examples_test

// The files of deploy/: the systemd units pass systemd-analyze verify
// with the tunnelkit the tests built in the place of /usr/local/bin's,
// and the Dockerfile's build stage builds a static tunnelkit with its go
// build command line as the Dockerfile writes it (read from it, not
// copied: prepareDockerfile runs it before the tests start); where docker
// runs, docker build builds the image itself.

import (
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testtools"
)

// dockerfilePath is the Dockerfile, from the repository's root.
const dockerfilePath = "deploy/Dockerfile"

// instruction is one instruction of a Dockerfile, its continuation lines
// joined.
type instruction struct {
	line int    // of its first line, from 1
	cmd  string // FROM, RUN, COPY... in upper case
	args string // the rest, trimmed
}

// parseDockerfile returns the instructions of a Dockerfile, without its
// comments and blank lines.
func parseDockerfile(src string) []instruction {
	var out []instruction
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		in := instruction{line: i + 1}
		for strings.HasSuffix(l, "\\") && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, "\\") + " " + strings.TrimSpace(lines[i])
		}
		cmd, args, _ := strings.Cut(l, " ")
		in.cmd, in.args = strings.ToUpper(cmd), strings.TrimSpace(args)
		out = append(out, in)
	}
	return out
}

// shellWords splits a simple shell command line into words: blanks
// separate them, single and double quotes group them. Anything else of
// the shell's (expansions, operators, escapes) is an error, so that what
// the test runs is what the line says.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\'' || c == '"':
			end := strings.IndexByte(line[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("a quote that does not close: %s", line)
			}
			quoted := line[i+1 : i+1+end]
			if c == '"' && strings.ContainsAny(quoted, "$`\\") {
				return nil, fmt.Errorf("shell syntax in double quotes that the test does not read: %s", line)
			}
			cur.WriteString(quoted)
			inWord = true
			i += end + 1
		case strings.IndexByte("$`\\;&|<>(){}*?[~#", c) >= 0:
			return nil, fmt.Errorf("shell syntax (%q) that the test does not read: %s", c, line)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// dockerBuild is the Dockerfile's build command, as TestMain read and ran
// it.
type dockerBuild struct {
	line  int      // the RUN instruction's, in the Dockerfile
	env   []string // the assignments before go (CGO_ENABLED=0)
	args  []string // go's arguments, -o's value as the Dockerfile writes it
	out   string   // that value: where the image's stage takes the binary from
	bin   string   // where TestMain built it
	err   error    // reading the Dockerfile, or building
	stage []instruction
}

var dockerPrep dockerBuild

// readDockerBuild reads the go build command of the Dockerfile's build
// stage: the RUN instruction that runs go build, its options (--mount)
// left out.
func readDockerBuild(src string) (dockerBuild, error) {
	var b dockerBuild
	b.stage = parseDockerfile(src)
	for _, in := range b.stage {
		if in.cmd != "RUN" || !regexp.MustCompile(`(^|\s)go build\s`).MatchString(in.args) {
			continue
		}
		if b.line != 0 {
			return b, fmt.Errorf("%s:%d: a second RUN of go build (the first at line %d)", dockerfilePath, in.line, b.line)
		}
		b.line = in.line
		words, err := shellWords(in.args)
		if err != nil {
			return b, fmt.Errorf("%s:%d: %v", dockerfilePath, in.line, err)
		}
		for len(words) > 0 && strings.HasPrefix(words[0], "--") {
			words = words[1:] // RUN's options: --mount=type=cache...
		}
		for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
			b.env, words = append(b.env, words[0]), words[1:]
		}
		if len(words) < 2 || words[0] != "go" || words[1] != "build" {
			return b, fmt.Errorf("%s:%d: the RUN is not one go build command: %s", dockerfilePath, in.line, in.args)
		}
		b.args = words[1:]
		for i, a := range b.args {
			if a == "-o" && i+1 < len(b.args) {
				b.out = b.args[i+1]
			}
		}
		if b.out == "" {
			return b, fmt.Errorf("%s:%d: go build without -o FILE: the image's stage could not name the binary", dockerfilePath, in.line)
		}
	}
	if b.line == 0 {
		return b, fmt.Errorf("%s: no RUN of go build", dockerfilePath)
	}
	return b, nil
}

// prepareDockerfile runs, before the tests start, the go build of the
// Dockerfile's build stage as it is written, at the repository's root
// (where the stage copies it), its binary into dir: kept from run to run,
// so that a run with nothing changed links nothing.
func prepareDockerfile(root, dir string) {
	p := &dockerPrep
	src, err := os.ReadFile(filepath.Join(root, dockerfilePath))
	if err != nil {
		p.err = err
		return
	}
	if *p, err = readDockerBuild(string(src)); err != nil {
		p.err = err
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.err = err
		return
	}
	p.bin = filepath.Join(dir, "tunnelkit")
	args := slices.Clone(p.args)
	args[slices.Index(args, "-o")+1] = p.bin
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), p.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		p.err = fmt.Errorf("%s:%d: %s go %s: %v\n%s", dockerfilePath, p.line, strings.Join(p.env, " "), strings.Join(args, " "), err, out)
	}
}

// TestDeployDockerfile checks the Dockerfile: a build stage of a Go at
// least go.mod's, whose go build (CGO_ENABLED=0) TestMain ran as written,
// making a static binary that runs; a last stage that copies that binary,
// runs it as its entry point and as a user other than root. Where docker
// runs, it builds the image and runs it; elsewhere that part skips.
func TestDeployDockerfile(t *testing.T) {
	p := readme(t)
	d := &dockerPrep
	if d.err != nil {
		t.Fatal(d.err)
	}
	if !slices.Contains(d.env, "CGO_ENABLED=0") {
		t.Errorf("%s:%d: the go build runs without CGO_ENABLED=0: the binary may need a C library the image does not have", dockerfilePath, d.line)
	}

	// The stages.
	var froms []instruction
	for _, in := range d.stage {
		if in.cmd == "FROM" {
			froms = append(froms, in)
		}
	}
	if len(froms) < 2 {
		t.Fatalf("%s: %d stages; want a build stage and the image's", dockerfilePath, len(froms))
	}
	gomod, err := os.ReadFile(filepath.Join(p.root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
	got := regexp.MustCompile(`^golang:(\d+)\.(\d+)`).FindStringSubmatch(froms[0].args)
	if want == nil || got == nil {
		t.Errorf("%s:%d: the build stage is FROM %s; want golang:X.Y, X.Y at least go.mod's go %v", dockerfilePath, froms[0].line, froms[0].args, want)
	} else if gm, gn, wm, wn := atoi(got[1]), atoi(got[2]), atoi(want[1]), atoi(want[2]); gm < wm || gm == wm && gn < wn {
		t.Errorf("%s:%d: the build stage's Go, %s.%s, is older than go.mod's go %s.%s", dockerfilePath, froms[0].line, got[1], got[2], want[1], want[2])
	}
	last := froms[len(froms)-1]
	var copied, user, entry string
	for _, in := range d.stage {
		if in.line < last.line {
			continue
		}
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if slices.ContainsFunc(f, func(s string) bool { return strings.HasPrefix(s, "--from=") }) && len(f) >= 2 && f[len(f)-2] == d.out {
				copied = f[len(f)-1]
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		}
	}
	if copied == "" {
		t.Errorf("%s: the image's stage copies no %s, what the go build writes", dockerfilePath, d.out)
	} else if !strings.Contains(entry, strconv.Quote(copied)) {
		t.Errorf("%s: the entry point is %s; want %q, the binary copied", dockerfilePath, entry, copied)
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("%s: the image runs as %q; want a user other than root", dockerfilePath, user)
	}

	// The binary the go build made.
	f, err := elf.Open(d.bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s: the binary has a dynamic loader: not static", dockerfilePath)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s: the binary needs %q: not static", dockerfilePath, libs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, d.bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "tunnelkit version ") {
		t.Errorf("the Dockerfile's tunnelkit version: %v\n%s", err, out)
	}

	t.Run("docker", func(t *testing.T) {
		if testing.Short() {
			t.Skip("builds an image")
		}
		if _, err := exec.LookPath("docker"); err != nil {
			t.Skip("docker is not installed: the image is not built (its go build ran above)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "docker", "info").CombinedOutput(); err != nil {
			t.Skipf("docker does not run here (docker info: %v; %s): the image is not built (its go build ran above)", err, lastOutputLine(out))
		}
		var tag [6]byte
		rand.Read(tag[:])
		image := "tunnelkit-test:" + hex.EncodeToString(tag[:])
		build := exec.Command("docker", "build", "-f", dockerfilePath, "-t", image, ".")
		build.Dir = p.root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("docker build: %v\n%s", err, out)
		}
		t.Cleanup(func() { exec.Command("docker", "image", "rm", "-f", image).Run() })
		out, err := exec.Command("docker", "run", "--rm", image, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "tunnelkit version ") {
			t.Errorf("docker run %s version: %v\n%s", image, err, out)
		}
		out, err = exec.Command("docker", "image", "inspect", "--format", "{{.Config.User}}", image).Output()
		if u, _, _ := strings.Cut(strings.TrimSpace(string(out)), ":"); err != nil || u == "" || u == "0" || u == "root" {
			t.Errorf("the image runs as %q (%v); want a user other than root", out, err)
		}
	})
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// lastOutputLine returns the last line of out that is not blank.
func lastOutputLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// hardening are the settings both units must have: a user of their own
// with nothing but its state directory, a read-only system, and no way
// to gain a privilege.
var hardening = []string{
	"DynamicUser=yes",
	"StateDirectory=",
	"ProtectSystem=strict",
	"NoNewPrivileges=yes",
}

// TestDeploySystemdUnits checks the units of deploy/ with systemd-analyze
// verify (Debian's systemd package), each written into a directory of the
// test with the tunnelkit the tests built in the place of
// /usr/local/bin/tunnelkit, which verify requires to exist: no error, no
// warning. It checks that each has the hardening settings, the edge the
// capability to bind ports below 1024, and that the tunnelkit command line
// it starts gives flags the subcommand has.
func TestDeploySystemdUnits(t *testing.T) {
	p := readme(t)
	units := map[string]string{"tunnelkit-edge.service": "tunnelkit edge", "tunnelkit-agent.service": "tunnelkit agent"}
	found, err := filepath.Glob(filepath.Join(p.root, "deploy", "*.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range found {
		if units[filepath.Base(u)] == "" {
			t.Errorf("deploy/%s: a unit this test does not know: add it to units", filepath.Base(u))
		}
	}
	bin, err := filepath.EvalSymlinks(filepath.Join(build(t, "tunnelkit"), "tunnelkit"))
	if err != nil {
		t.Fatal(err)
	}
	for name, sub := range units {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join(p.root, "deploy", name))
			if err != nil {
				t.Fatal(err)
			}
			text := string(src)
			start := regexp.MustCompile(`(?m)^ExecStart=/usr/local/bin/(tunnelkit .*)$`).FindStringSubmatch(text)
			if start == nil {
				t.Fatalf("deploy/%s: no ExecStart=/usr/local/bin/tunnelkit ...", name)
			}
			cmds := commandsOf(start[1])
			if len(cmds) != 1 || cmds[0].name != sub {
				t.Fatalf("deploy/%s: ExecStart runs %q; want %s", name, start[1], sub)
			}
			words := strings.Fields(sub)
			have := helpFlags(t, bin, words[1:]...)
			for _, f := range cmds[0].flags {
				if !have[f] {
					t.Errorf("deploy/%s: %s has no flag -%s", name, sub, f)
				}
			}
			want := slices.Clone(hardening)
			if sub == "tunnelkit edge" {
				want = append(want, "AmbientCapabilities=CAP_NET_BIND_SERVICE")
			}
			for _, w := range want {
				if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w)).MatchString(text) {
					t.Errorf("deploy/%s: no %s", name, w)
				}
			}

			testtools.Need(t, "systemd-analyze")
			if _, err := os.Stat("/bin/kill"); err != nil {
				testtools.Missing(t, "/bin/kill (Debian's procps), which the units' ExecReload runs: "+err.Error())
			}
			dir := t.TempDir()
			unit := filepath.Join(dir, name)
			if err := os.WriteFile(unit, []byte(strings.ReplaceAll(text, "/usr/local/bin/tunnelkit", bin)), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "systemd-analyze", "verify", unit)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			if err != nil || len(strings.TrimSpace(string(out))) > 0 {
				t.Errorf("systemd-analyze verify deploy/%s (ExecStart's binary: %s): %v\n%s", name, bin, err, out)
			}
		})
	}
}
