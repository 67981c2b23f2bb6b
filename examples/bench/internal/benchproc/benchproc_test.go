//go:build unix

package benchproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/testwait"
)

// testRoles are the roles of the test binary, which the tests start as
// their children.
var testRoles = map[string]Role{
	// serve says ready with its arguments and what its environment holds
	// of the harness's, and serves until its end.
	"serve": func(ctx context.Context, ctl *Control, args []string) error {
		fmt.Fprintln(os.Stderr, "serving")
		ctl.Ready("args="+strings.Join(args, ","), "role="+os.Getenv(roleEnv), "gorace="+strings.ReplaceAll(os.Getenv("GORACE"), " ", "+"))
		<-ctx.Done()
		fmt.Fprintln(os.Stderr, "done")
		return nil
	},
	// fail fails before it is ready.
	"fail": func(context.Context, *Control, []string) error {
		fmt.Fprintln(os.Stderr, "what went wrong first")
		return errors.New("boom")
	},
	// stubborn is ready, and ends neither with its stdin nor on SIGTERM.
	"stubborn": func(ctx context.Context, ctl *Control, _ []string) error {
		ctl.Ready()
		time.Sleep(24 * time.Hour) // not a select{}, which the runtime could call a deadlock and end
		return nil
	},
	// result prints a result and returns.
	"result": func(_ context.Context, ctl *Control, args []string) error {
		ctl.Result(strings.Join(args, " "))
		return nil
	},
	// chatty logs args[0] lines of 100 bytes, then is ready.
	"chatty": func(ctx context.Context, ctl *Control, args []string) error {
		var n int
		fmt.Sscan(args[0], &n)
		for i := range n {
			fmt.Fprintf(os.Stderr, "%099d\n", i)
		}
		ctl.Ready()
		<-ctx.Done()
		return nil
	},
	// hello says something else than ready first.
	"hello": func(ctx context.Context, ctl *Control, _ []string) error {
		fmt.Println("hello")
		ctl.Ready()
		<-ctx.Done()
		return nil
	},
	// longline prints a line longer than a parent reads, then is ready.
	"longline": func(ctx context.Context, ctl *Control, _ []string) error {
		fmt.Println(strings.Repeat("x", 2<<20))
		ctl.Ready()
		<-ctx.Done()
		return nil
	},
}

func TestMain(m *testing.M) {
	Main("benchproc.test", testRoles)
	os.Exit(m.Run())
}

func start(t *testing.T, role string, o Options) *Proc {
	t.Helper()
	o.Role = role
	if o.LogPath == "" {
		o.LogPath = filepath.Join(t.TempDir(), role+".log")
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = testwait.DefaultBound
	}
	p, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestChild starts a child, reads its ready line, has it measure, and
// closes it: it exits cleanly, its log whole, and no goroutine of the
// harness stays.
func TestChild(t *testing.T) {
	testwait.NoLeak(t, 0)
	cpuDir, memDir := t.TempDir(), t.TempDir()
	p := start(t, "serve", Options{Name: "server", Args: []string{"-x", "y"}, CPUProfile: cpuDir, MemProfile: memDir})
	if p.Name != "server" || p.Fields["args"] != "-x,y" {
		t.Errorf("name %q, fields %q: want server, the role's arguments -x,y", p.Name, p.Fields)
	}
	if p.Fields["role"] != "" {
		t.Errorf("the role's environment still names it (%q): what it starts would run as a child", p.Fields["role"])
	}
	if !strings.Contains(p.Fields["gorace"], "atexit_sleep_ms=0") {
		t.Errorf("GORACE %q: want atexit_sleep_ms=0", p.Fields["gorace"])
	}
	if d := CPUTime(p.Pid()); d < 0 {
		t.Errorf("CPUTime %v", d)
	}
	if st, err := Status(p.Pid()); err != nil || st["VmRSS"] <= 0 {
		t.Errorf("Status: %v %v", st, err)
	}
	if n := FDs(p.Pid()); n < 3 {
		t.Errorf("FDs: %d, want stdin, stdout and stderr at least", n)
	}

	ctx := context.Background()
	if err := p.StartMeasure(ctx, "m1.server"); err != nil {
		t.Fatal(err)
	}
	if err := p.StartMeasure(ctx, "again"); err == nil || !strings.Contains(err.Error(), "a measurement is running") {
		t.Errorf("a second start: %v", err)
	}
	m, err := p.Mem(ctx)
	if err != nil || m.Goroutines < 2 || m.Heap <= 0 || m.Stack <= 0 {
		t.Errorf("Mem: %+v %v", m, err)
	}
	d, io, err := p.StopMeasure(ctx)
	if err != nil || d < 0 {
		t.Errorf("StopMeasure: %v %v", d, err)
	}
	if runtime.GOOS == "linux" && (io.Reads <= 0 || io.Writes <= 0) {
		t.Errorf("StopMeasure: syscalls %+v, want some on Linux", io)
	}
	if _, err := p.Call(ctx, "bogus"); err == nil || !strings.Contains(err.Error(), `unknown command "bogus"`) {
		t.Errorf("an unknown command: %v", err)
	}
	if _, err := p.Call(ctx, "start a/b"); err == nil {
		t.Error("a measurement named with a slash: no error")
	}
	for _, f := range []string{
		filepath.Join(cpuDir, "m1.server.cpu.pprof"),
		filepath.Join(memDir, "m1.server.alloc-start.pprof"),
		filepath.Join(memDir, "m1.server.alloc.pprof"),
		filepath.Join(memDir, fmt.Sprintf("mem-%d-1.heap.pprof", p.Pid())),
	} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", filepath.Base(f), err)
		}
	}

	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	<-p.Exited()
	if p.Err() != nil || p.CPU() <= 0 {
		t.Errorf("exit %v, CPU %v", p.Err(), p.CPU())
	}
	if log := p.Tail(5); log != "serving\ndone" {
		t.Errorf("log %q, want serving and done", log)
	}
}

// TestTerminate ends a child with SIGTERM, which its role takes as the
// end; a second Terminate says that it had exited.
func TestTerminate(t *testing.T) {
	testwait.NoLeak(t, 0)
	p := start(t, "serve", Options{})
	if _, err := p.Terminate(testwait.DefaultBound); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if _, err := p.Terminate(testwait.DefaultBound); !errors.Is(err, ErrExited) {
		t.Errorf("a second Terminate: %v, want ErrExited", err)
	}
	if log := p.Tail(5); log != "serving\ndone" {
		t.Errorf("log %q: the role did not end by itself", log)
	}
}

// TestStubbornChild: a child that ends neither with its stdin nor on
// SIGTERM is killed, with its process group, and the error says so.
func TestStubbornChild(t *testing.T) {
	testwait.NoLeak(t, 0)
	p := start(t, "stubborn", Options{CloseGrace: 1})
	if err := p.Close(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Close: %v, want killed", err)
	}
	q := start(t, "stubborn", Options{})
	if _, err := q.Terminate(1); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Terminate: %v, want killed", err)
	}
}

// TestResult reads what a role that computes prints.
func TestResult(t *testing.T) {
	testwait.NoLeak(t, 0)
	p, err := Start(context.Background(), Options{Role: "result", Args: []string{"a", "b"}, LogPath: filepath.Join(t.TempDir(), "log")})
	if err != nil {
		t.Fatal(err)
	}
	line, err := p.Next(context.Background(), testwait.DefaultBound)
	if err != nil || line != "result a b" {
		t.Errorf("Next: %q %v", line, err)
	}
	if _, err := p.Next(context.Background(), testwait.DefaultBound); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("Next after the result: %v, want that it exited", err)
	}
	if err := p.Close(); err != nil {
		t.Error(err)
	}
}

// TestStartFails: each way a child fails to start is an error that says
// which, with its log, and leaves no process or goroutine behind.
func TestStartFails(t *testing.T) {
	testwait.NoLeak(t, 0)
	dir := t.TempDir()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		o    Options
		want string
	}{
		{"error", nil, Options{Role: "fail"}, "exited: exit status 1\n    what went wrong first\n    benchproc.test fail: boom"},
		{"unknown role", nil, Options{Role: "nope"}, `role "nope": want one of chatty, fail, hello, longline, result, serve, stubborn`},
		{"not ready", nil, Options{Role: "hello"}, `said "hello", want ready`},
		{"line too long", nil, Options{Role: "longline"}, "stdout: bufio.Scanner: token too long"},
		{"cancelled", cancelled, Options{Role: "serve"}, context.Canceled.Error()},
		{"no binary", nil, Options{Role: "serve", Exe: filepath.Join(dir, "nothing")}, "no such file"},
		{"no log", nil, Options{Role: "serve", LogPath: filepath.Join(dir, "no", "log")}, "no such file"},
		{"no role", nil, Options{}, "Role and LogPath are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			o := tc.o
			if o.LogPath == "" && o.Role != "" {
				o.LogPath = filepath.Join(dir, tc.name+".log")
			}
			o.ReadyTimeout = testwait.DefaultBound
			p, err := Start(ctx, o)
			if err == nil {
				p.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
}

// TestRunRole runs a child's side in this process: what a role runs with,
// and the exit statuses.
func TestRunRole(t *testing.T) {
	var got []string
	roles := map[string]Role{
		"ok": func(ctx context.Context, ctl *Control, args []string) error {
			got = append(args, ctl.CPUDir, ctl.MemDir)
			ctl.Ready("a=1")
			return nil
		},
		"bad": func(context.Context, *Control, []string) error { return errors.New("it broke") },
	}
	var out, errs bytes.Buffer
	if code := runRole("prog", "ok", roles, []string{"-cpuprofile", "c", "--", "-x", "y"}, strings.NewReader(""), &out, &errs); code != 0 {
		t.Errorf("ok: status %d: %s", code, errs.String())
	}
	if strings.Join(got, " ") != "-x y c " || out.String() != "ready a=1\n" {
		t.Errorf("ok: ran with %q, printed %q", got, out.String())
	}
	for _, tc := range []struct {
		role string
		args []string
		code int
		says string
	}{
		{"bad", nil, 1, "prog bad: it broke\n"},
		{"none", nil, 2, `prog: role "none": want one of bad, ok` + "\n"},
		{"ok", []string{"-nope"}, 2, "flag provided but not defined: -nope"},
	} {
		errs.Reset()
		if code := runRole("prog", tc.role, roles, tc.args, strings.NewReader(""), &out, &errs); code != tc.code || !strings.Contains(errs.String(), tc.says) {
			t.Errorf("%s %q: status %d, said %q; want %d, %q", tc.role, tc.args, code, errs.String(), tc.code, tc.says)
		}
	}
}

// TestLogHead: a bounded log keeps its head and its tail and says how
// much went between; an unbounded one is whole.
func TestLogHead(t *testing.T) {
	const lines = 30000 // 3 MB
	p := start(t, "chatty", Options{Args: []string{fmt.Sprint(lines)}, LogHead: 1 << 20})
	whole := start(t, "chatty", Options{Args: []string{fmt.Sprint(lines)}})
	if !strings.HasSuffix(p.Tail(1), fmt.Sprintf("%099d", lines-1)) {
		t.Errorf("the tail, while it runs: %q", p.Tail(1))
	}
	for _, c := range []*Proc{p, whole} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(p.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("\n[... %d bytes of log left out ...]\n", lines*100-1<<20-logTail)
	head, tail, ok := bytes.Cut(b, []byte(marker))
	if !ok || len(head) != 1<<20 || len(tail) != logTail || !bytes.HasSuffix(tail, fmt.Appendf(nil, "%099d\n", lines-1)) {
		t.Errorf("bounded log: %d bytes, marker %v, head %d bytes, tail %d", len(b), ok, len(head), len(tail))
	}
	if st, err := os.Stat(whole.LogPath()); err != nil || st.Size() != lines*100 {
		t.Errorf("whole log: %v %v, want %d bytes", st.Size(), err, lines*100)
	}
}

func TestWatchFor(t *testing.T) {
	var out bytes.Buffer
	w, seen := WatchFor(&out, `msg="edge up"`)
	for _, s := range []string{"level=INFO msg=\"starting\"\nlevel=INFO ", `msg="edge`, ` up" addr=x`} {
		w.Write([]byte(s))
		select {
		case <-seen:
			t.Fatalf("seen after %q, before the line ended", s)
		default:
		}
	}
	w.Write([]byte("\nmore\n"))
	select {
	case <-seen:
	default:
		t.Fatal("not seen once the line ended")
	}
	w.Write([]byte(`msg="edge up"` + "\n")) // a second time: closes nothing twice
	if want := "level=INFO msg=\"starting\"\nlevel=INFO msg=\"edge up\" addr=x\nmore\nmsg=\"edge up\"\n"; out.String() != want {
		t.Errorf("passed on %q, want %q", out.String(), want)
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range ports {
		if p != ports[0]+i || p < 10000 {
			t.Fatalf("ports %v: want 5 consecutive ones from 10000 up", ports)
		}
		ln, err := net.Listen("tcp", Loopback(p))
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	}
}

// TestParseStop checks the stop command's answer, as Control writes it.
func TestParseStop(t *testing.T) {
	for _, tc := range []struct {
		line string
		d    int64
		io   IO
		ok   bool
	}{
		{"cpu 1500 syscr 12 syscw 7", 1500, IO{12, 7}, true},
		{"cpu 1500 syscr -1 syscw -1", 1500, IO{-1, -1}, true},
		{"cpu 1500", 0, IO{}, false},
		{"cpu x syscr 1 syscw 2", 0, IO{}, false},
		{"mem heap=1", 0, IO{}, false},
	} {
		d, io, err := parseStop(tc.line)
		if (err == nil) != tc.ok || int64(d) != tc.d || io != tc.io {
			t.Errorf("parseStop(%q) = %v, %v, %v; want %v, %v, ok %v", tc.line, d, io, err, tc.d, tc.io, tc.ok)
		}
	}
	if c := SelfIO(); runtime.GOOS == "linux" && (c.Reads <= 0 || c.Writes < 0) {
		t.Errorf("SelfIO() = %+v on Linux", c)
	}
	if got := (IO{10, 5}).Since(IO{4, 1}); got != (IO{6, 4}) {
		t.Errorf("Since: %+v", got)
	}
	if got := (IO{10, 5}).Since(IO{-1, -1}); got != (IO{-1, -1}) {
		t.Errorf("Since an unknown count: %+v", got)
	}
}

func TestParseMem(t *testing.T) {
	f := parseFields("one_heap=10 one_stack=20 one_goroutines=3 junk x=")
	m, err := ParseMem(f, "one_")
	if err != nil || m != (Mem{10, 20, 3}) {
		t.Errorf("ParseMem: %+v %v", m, err)
	}
	if _, err := ParseMem(f, ""); err == nil || !strings.Contains(err.Error(), "field heap") {
		t.Errorf("missing fields: %v", err)
	}
	if d := (Mem{10, 20, 3}).Sub(Mem{4, 5, 1}); d != (Mem{6, 15, 2}) {
		t.Errorf("Sub: %+v", d)
	}
}
