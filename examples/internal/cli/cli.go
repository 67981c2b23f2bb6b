// Package cli is what the example commands share in front of their flags:
// a usage that opens with a synopsis and examples, a short answer with the
// closest flag to a mistyped one, and -version.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"github.com/tunnelkit/tunnelkit/internal/suggest"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// ErrExit is what Parse returns when the command is done (-h, -version):
// it printed what was asked, and exits 0.
var ErrExit = errors.New("cli: done")

// Command describes a command's help.
type Command struct {
	// Name is the command's name, as typed.
	Name string
	// Synopsis is what the command does, in one line.
	Synopsis string
	// Examples are command lines, each with what it does after two
	// spaces or more; the usage shows them first, each under a comment
	// line of what it does.
	Examples []string
	// More is printed after the flags, when not empty: what the flags
	// alone do not say.
	More string
}

// Parse parses args into fs, which must have ContinueOnError, with -h,
// -help and -version answered (ErrExit); it may be called again for the
// arguments after a positional one, and an unknown flag or a bad
// value answered in at most five lines, the first the error, naming the
// closest flag, the last pointing at -h: the error returned then says it
// all, and is printed as is.
func (c Command) Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	if fs.Lookup("version") == nil {
		fs.Bool("version", false, "print the version and exit")
	}
	version := fs.Lookup("version").Value.(flag.Getter)
	fs.SetOutput(io.Discard) // the package's own answers go out below
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.Usage(fs, stderr)
		return ErrExit
	case err != nil:
		return c.parseError(fs, err)
	case version.Get() == true:
		fmt.Fprintf(stdout, "%s version %s\n", c.Name, Version())
		return ErrExit
	}
	return nil
}

// parseError turns an error of flag.Parse into the command's answer.
func (c Command) parseError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = fmt.Sprintf("unknown flag -%s", name)
		if near := Closest(name, flagNames(fs)); near != "" {
			msg += fmt.Sprintf(": did you mean -%s?", near)
			if f := fs.Lookup(near); f != nil {
				msg += "\n  -" + near + "  " + firstSentence(f.Usage)
			}
		}
	}
	return &UsageError{Msg: msg + "\nRun '" + c.Name + " -h' for every flag."}
}

// UsageError is a command line that the command cannot run: a flag that
// does not exist, a value that does not parse, an argument out of place.
// Its message is made to be printed as it is, after the command's name.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usage prints the command's usage: its synopsis, examples, flags and
// the rest.
func (c Command) Usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprintf(w, "Usage of %s: %s\n\n", c.Name, c.Synopsis)
	for _, e := range c.Examples {
		cmd, what := splitExample(e)
		if what != "" {
			fmt.Fprintf(w, "  # %s\n", what)
		}
		fmt.Fprintf(w, "  %s\n", cmd)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	if c.More != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.More))
	}
}

// splitExample splits an example at its first run of two spaces or
// more: the command line, and what it does.
func splitExample(e string) (cmd, what string) {
	if i := strings.Index(e, "  "); i >= 0 {
		return e[:i], strings.TrimSpace(e[i:])
	}
	return e, ""
}

// firstSentence returns s up to its first ". " or "; ", or s; at most 100
// bytes.
func firstSentence(s string) string {
	for _, sep := range []string{". ", "; "} {
		if i := strings.Index(s, sep); i >= 0 {
			s = s[:i]
		}
	}
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

func flagNames(fs *flag.FlagSet) []string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}

// Closest returns the name among names nearest to s, when one is near
// enough to be what was meant (a typo, a missing or doubled letter, a
// dash for an underscore, a prefix); "" otherwise.
func Closest(s string, names []string) string {
	return suggest.Closest(strings.ToLower(strings.ReplaceAll(s, "_", "-")), names)
}

// Version is the version of the running binary: its module's version when
// it was built from one (go install ...@v1.2.3), else "devel", with the
// commit when the build recorded it, and Go's version.
func Version() string {
	v := "devel"
	var rev string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = s.Value[:12]
			}
		}
	}
	if rev != "" {
		v += " (" + rev + ")"
	}
	return v + " (tunnelkit, " + runtime.Version() + ")"
}

// FlagGiven reports whether the flag name was given on the command line.
func FlagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
