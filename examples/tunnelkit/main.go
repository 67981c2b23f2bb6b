// Command tunnelkit exposes apps that run behind a NAT or a firewall at
// public URLs, through a tunnel edge, and runs the edge:
//
//	tunnelkit http 3000                  # http://localhost:3000 at a public URL (https, tcp, tls alike)
//	tunnelkit agent -config agent.yml    # many endpoints, from a file
//	tunnelkit edge -domain example.com   # the edge agents connect to
//	tunnelkit version                    # the version, and what it was built from
//	tunnelkit completion bash            # shell completion (bash or zsh)
//
// Each subcommand is a small package composing the library: "agent" (and
// the shorthands http, https, tcp, tls) is package agentcmd, over package
// agent; "edge" is package edgecmd, over package edge, with what this
// package adds to it (routes shared through etcd, Prometheus metrics,
// OpenID Connect logins). "tunnelkit SUBCOMMAND -h" lists its flags.
package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	"github.com/tunnelkit/tunnelkit/examples/internal/agentcmd"
	"github.com/tunnelkit/tunnelkit/examples/internal/cli"
	"github.com/tunnelkit/tunnelkit/examples/internal/edgecmd"
)

// subcommand is a word that may follow "tunnelkit".
type subcommand struct {
	name, synopsis string
	run            func(args []string) // with the arguments after the word
}

// subcommands are tunnelkit's words, in the order of its help.
var subcommands = []subcommand{
	{"http", "expose a local HTTP app: tunnelkit http 3000", shorthand("http")},
	{"https", "the same, with TLS ended at the edge: tunnelkit https 3000", shorthand("https")},
	{"tcp", "expose a local TCP port at a port of the edge: tunnelkit tcp 22", shorthand("tcp")},
	{"tls", "pass TLS through to a local app by its name: tunnelkit tls 8443 -url tls://app.example.com", shorthand("tls")},
	{"agent", "expose local apps with every setting: flags, or -config agent.yml", agentcmd.Main},
	{"edge", "run a tunnel edge: agents connect to it, and it routes public traffic to them", edgeMain},
	// These three are run by main, and have no run here: they read this
	// list themselves.
	{"version", "print the version and what it was built from", nil},
	{"completion", "print shell completion: tunnelkit completion bash (or zsh)", nil},
	{"help", "this help, or a subcommand's: tunnelkit help edge", nil},
}

// shorthand runs the agent's shorthand "tunnelkit PROTO TO".
func shorthand(proto string) func([]string) {
	return func(args []string) { agentcmd.Main(append([]string{proto}, args...)) }
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	word, args := os.Args[1], os.Args[2:]
	switch word {
	case "-h", "-help", "--help":
		usage(os.Stderr) // as every subcommand's -h
		return
	case "version", "-version", "--version":
		printVersion(os.Stdout)
		return
	case "completion":
		completion(args)
		return
	case "help":
		help(args)
		return
	}
	for _, c := range subcommands {
		if c.name == word {
			c.run(args)
			return
		}
	}
	fmt.Fprintln(os.Stderr, unknown(word))
	os.Exit(2)
}

// unknown is the answer to a word that is no subcommand.
func unknown(word string) string {
	var names []string
	for _, c := range subcommands {
		names = append(names, c.name)
	}
	msg := fmt.Sprintf("tunnelkit: unknown subcommand %q", word)
	if near := cli.Closest(word, names); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", near)
	}
	if strings.HasPrefix(word, "-") {
		msg = fmt.Sprintf("tunnelkit: %s comes after a subcommand: tunnelkit agent %s ..., tunnelkit edge %s ...", word, word, word)
	}
	return msg + "\nRun 'tunnelkit -h' for the subcommands."
}

// usage prints tunnelkit's help.
func usage(w io.Writer) {
	fmt.Fprint(w, "tunnelkit exposes local apps at public URLs through a tunnel edge, and runs the edge.\n\nUsage: tunnelkit SUBCOMMAND [flags] [arguments]\n\nSubcommands:\n")
	for _, c := range subcommands {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.synopsis)
	}
	fmt.Fprint(w, "\nExamples:\n  tunnelkit edge -domain localhost &     # an edge on this machine\n  tunnelkit http 3000                    # http://localhost:3000 at http://NAME.localhost:8080\n\nRun 'tunnelkit SUBCOMMAND -h' for its flags.\n")
}

// help prints tunnelkit's help, or a subcommand's.
func help(args []string) {
	if len(args) == 0 {
		usage(os.Stdout)
		return
	}
	for _, c := range subcommands {
		switch {
		case c.name != args[0]:
		case c.run != nil:
			c.run([]string{"-h"})
			return
		default:
			// One of main's own, which takes no flags: as a flag set's
			// usage starts, then its usage line.
			fmt.Printf("Usage of tunnelkit %s: %s\n\n  %s\n", c.name, c.synopsis, cmp.Or(ownUsage[c.name], "tunnelkit "+c.name))
			return
		}
	}
	fmt.Fprintln(os.Stderr, unknown(args[0]))
	os.Exit(2)
}

// ownUsage are the usage lines of the subcommands that main runs itself
// (those of subcommands without run).
var ownUsage = map[string]string{
	"version":    "tunnelkit version",
	"completion": "tunnelkit completion bash|zsh",
	"help":       "tunnelkit help [SUBCOMMAND]",
}

// printVersion prints the version, then the build's module, its
// dependencies and settings, as "go version -m" does.
func printVersion(w io.Writer) {
	fmt.Fprintf(w, "tunnelkit version %s\n", cli.Version())
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	fmt.Fprintf(w, "\tgo\t%s\n\tpath\t%s\n\tmod\t%s\t%s\n", bi.GoVersion, bi.Path, bi.Main.Path, bi.Main.Version)
	for _, d := range bi.Deps {
		v := d.Version
		if d.Replace != nil {
			v += " => " + d.Replace.Path + " " + d.Replace.Version
		}
		fmt.Fprintf(w, "\tdep\t%s\t%s\n", d.Path, v)
	}
	for _, s := range bi.Settings {
		fmt.Fprintf(w, "\tbuild\t%s=%s\n", s.Key, s.Value)
	}
}

// flagLine is a flag's line in a subcommand's help.
var flagLine = regexp.MustCompile(`(?m)^  -([a-zA-Z0-9][a-zA-Z0-9-]*)`)

// flagsOf returns the flags of a subcommand, as its help lists them.
func flagsOf(name string) []string {
	var out bytes.Buffer
	switch name {
	case "edge":
		edgecmd.Run(context.Background(), "tunnelkit edge", []string{"-h"}, io.Discard, &out, edgeExtension())
	default:
		agentcmd.Run(context.Background(), []string{"-h"}, io.Discard, &out)
	}
	var flags []string
	for _, m := range flagLine.FindAllStringSubmatch(out.String(), -1) {
		flags = append(flags, "-"+m[1])
	}
	sort.Strings(flags)
	return slices.Compact(flags)
}

// completion prints the completion script of a shell: bash, or zsh (which
// runs bash's through bashcompinit).
func completion(args []string) {
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprintln(os.Stderr, "tunnelkit completion: want bash or zsh: source <(tunnelkit completion bash)")
		os.Exit(2)
	}
	var words []string
	for _, c := range subcommands {
		words = append(words, c.name)
	}
	var b strings.Builder
	if args[0] == "zsh" {
		b.WriteString("autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n")
	}
	b.WriteString("_tunnelkit() {\n\tlocal cur=${COMP_WORDS[COMP_CWORD]}\n\tif [ \"$COMP_CWORD\" -eq 1 ]; then\n")
	fmt.Fprintf(&b, "\t\tCOMPREPLY=($(compgen -W %q -- \"$cur\"))\n\t\treturn\n\tfi\n", strings.Join(words, " "))
	b.WriteString("\tcase \"$cur\" in\n\t-*)\n\t\tcase \"${COMP_WORDS[1]}\" in\n")
	fmt.Fprintf(&b, "\t\tedge) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(flagsOf("edge"), " "))
	fmt.Fprintf(&b, "\t\tagent|http|https|tcp|tls) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(flagsOf("agent"), " "))
	b.WriteString("\t\tesac ;;\n\t*) COMPREPLY=($(compgen -f -- \"$cur\")) ;;\n\tesac\n}\ncomplete -o filenames -F _tunnelkit tunnelkit\n")
	fmt.Print(b.String())
}
