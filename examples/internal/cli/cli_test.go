package cli

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestClosest(t *testing.T) {
	names := []string{"edge", "edge-ca", "to", "to-ca", "basic-auth", "tcp-ports", "domain"}
	for in, want := range map[string]string{
		"edg": "edge", "egde": "edge", "too": "to", "basic_auth": "basic-auth", "tcp-port": "tcp-ports",
		"domian": "domain", "EDGE": "edge", "zzzzzz": "", "x": "", "completely-different": "",
	} {
		if got := Closest(in, names); got != want {
			t.Errorf("Closest(%q) = %q, want %q", in, got, want)
		}
	}
}

func command() (Command, *flag.FlagSet) {
	fs := flag.NewFlagSet("tool", flag.ContinueOnError)
	fs.String("edge", "", "the edge's address. More words")
	fs.Int("port", 0, "a port")
	return Command{Name: "tool", Synopsis: "does things", Examples: []string{"tool -edge x  reach x", "tool -port 1"}}, fs
}

// A mistyped flag, or a bad value, is answered in at most five lines: the
// error, the closest flag with its help's first sentence, the way to -h.
func TestParseMistakes(t *testing.T) {
	for args, want := range map[string]string{
		"-edg x":     "unknown flag -edg: did you mean -edge?\n  -edge  the edge's address\nRun 'tool -h' for every flag.",
		"-qqqqqq":    "unknown flag -qqqqqq\nRun 'tool -h' for every flag.",
		"-port many": "invalid value \"many\" for flag -port: parse error\nRun 'tool -h' for every flag.",
	} {
		c, fs := command()
		err := c.Parse(fs, strings.Fields(args), io.Discard, io.Discard)
		var ue *UsageError
		if !errors.As(err, &ue) || err.Error() != want || strings.Count(want, "\n") > 4 {
			t.Errorf("%s: %v\nwant %s", args, err, want)
		}
	}
}

// -h prints the synopsis, each example under what it does, the flags;
// -version prints the version on stdout; both are done (ErrExit).
func TestHelpAndVersion(t *testing.T) {
	c, fs := command()
	var out strings.Builder
	if err := c.Parse(fs, []string{"-h"}, io.Discard, &out); !errors.Is(err, ErrExit) {
		t.Fatalf("-h: %v", err)
	}
	if want := "Usage of tool: does things\n\n  # reach x\n  tool -edge x\n  tool -port 1\n\nFlags:\n"; !strings.HasPrefix(out.String(), want) || !strings.Contains(out.String(), "  -version\n") {
		t.Errorf("-h printed\n%s\nwant it to start\n%s", out.String(), want)
	}
	c, fs = command()
	out.Reset()
	if err := c.Parse(fs, []string{"-version"}, &out, io.Discard); !errors.Is(err, ErrExit) || !strings.HasPrefix(out.String(), "tool version ") {
		t.Errorf("-version: %v, %q", err, out.String())
	}
	// Parse again for the arguments after a positional one.
	c, fs = command()
	if err := c.Parse(fs, []string{"-port", "1", "pos", "-edge", "x"}, io.Discard, io.Discard); err != nil || fs.Arg(0) != "pos" {
		t.Fatal(err)
	}
	if err := c.Parse(fs, fs.Args()[1:], io.Discard, io.Discard); err != nil || fs.Lookup("edge").Value.String() != "x" || fs.Lookup("port").Value.String() != "1" {
		t.Errorf("the second Parse: %v", err)
	}
}
