package edgecmd

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/examples/internal/cli"
	"github.com/tunnelkit/tunnelkit/examples/internal/yamlcfg"
	"github.com/tunnelkit/tunnelkit/policy"
)

// The edge's -config file is YAML: a mapping whose keys are the flags'
// names with _ for - (http, tcp_ports, acme_email...), each taking what its
// flag takes, and a list where the flag repeats or takes a comma-separated
// list. A flag given on the command line wins over its key. A few keys take
// more than their flag, or have no flag:
//
//	tokens: a file of "token identity" lines, as -tokens; or the list
//	        itself, each item {token: ..., identity: ...}
//	policy: a file, as -policy; or the policy itself, in the form that
//	        file holds, written in YAML
//
// Settings that no flag has come under keys of their own, listed in
// fileKeys: the admin API's settings will be its "admin" key.
//
//	domain: example.com
//	http: :80
//	tls: :443
//	acme_directory: https://acme-v02.api.letsencrypt.org/directory
//	acme_email: ops@example.com
//	tokens:
//	  - token: ${TEAM_A_TOKEN}
//	    identity: team-a
//	policy:
//	  response_headers: {add: ["Strict-Transport-Security: max-age=63072000"]}

// fileKeys are the keys of the file that are not a flag's alone: each
// reads its value from the file's node.
var fileKeys = map[string]func(c *fileConfig, f *yamlcfg.File, n *yaml.Node) error{
	"tokens": (*fileConfig).readTokens,
	"policy": (*fileConfig).readPolicy,
}

// fileConfig is what a -config file holds besides flags' values.
type fileConfig struct {
	path        string         // the file's, for errors
	tokensGiven bool           // the file has its own tokens key, even empty
	tokens      []tokenEntry   // the tokens of the file itself
	policy      *policy.Spec   // the operator's policy, written in the file
	where       map[string]int // the line of each key, for errors
}

// tokenEntry is an item of the file's tokens.
type tokenEntry struct {
	Token    string `yaml:"token" secret:"a token"`
	Identity string `yaml:"identity"`
}

func (c *fileConfig) readTokens(f *yamlcfg.File, n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		c.tokensGiven = true // "tokens:" alone: none yet, every agent refused
		return nil
	}
	if n.Kind == yaml.ScalarNode {
		return errUseFlag
	}
	var list []tokenEntry
	if err := f.Decode(n, "tokens", &list); err != nil {
		return err
	}
	for i, t := range list {
		if t.Token == "" || t.Identity == "" {
			return f.At(n.Content[i], "tokens[%d]: want a token and an identity", i)
		}
		if err := edge.CheckIdentity(t.Identity); err != nil {
			return f.At(n.Content[i], "tokens[%d]: %v", i, err)
		}
	}
	c.tokens, c.tokensGiven = list, true
	return nil
}

func (c *fileConfig) readPolicy(f *yamlcfg.File, n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		return errUseFlag
	}
	spec, err := f.Policy(n)
	if err != nil {
		return err
	}
	c.policy = spec
	return nil
}

// errUseFlag is a fileKeys reader's answer for a value its flag takes.
var errUseFlag = fmt.Errorf("the flag's value")

// listFlags take a list as one comma-separated value.
var listFlags = []string{"etcd", "policy-kinds", "policy-actions", "proxy-protocol-from"}

// applyConfig reads the file at path into fs's flags, leaving those given
// on the command line (given) as they are, and returns what the file
// holds besides.
func applyConfig(fs *flag.FlagSet, path string, given map[string]bool) (*fileConfig, error) {
	f, err := yamlcfg.Load(path, nil)
	if err != nil {
		return nil, err
	}
	c := &fileConfig{path: path, where: map[string]int{}}
	if f.Root == nil {
		return c, nil
	}
	for i := 0; i+1 < len(f.Root.Content); i += 2 {
		k, v := f.Root.Content[i], f.Root.Content[i+1]
		key := k.Value
		name := strings.ReplaceAll(key, "_", "-")
		c.where[name] = k.Line
		if key == "token" {
			if err := f.Secret(v, "a token"); err != nil {
				return nil, err
			}
		}
		if read, ok := fileKeys[key]; ok {
			if given[name] {
				continue // the flag wins
			}
			err := read(c, f, v)
			if err == nil {
				continue
			}
			if err != errUseFlag {
				return nil, err
			}
		}
		fl := fs.Lookup(name)
		if fl == nil || name == "config" || name == "version" || strings.Contains(key, "-") {
			return nil, unknownKey(fs, f, k)
		}
		if given[name] {
			continue
		}
		var values []string
		switch v.Kind {
		case yaml.ScalarNode:
			values = []string{v.Value}
		case yaml.SequenceNode:
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return nil, f.At(item, "%s: want a list of values", key)
				}
				values = append(values, item.Value)
			}
			_, repeats := fl.Value.(interface{ repeats() })
			switch {
			case slices.Contains(listFlags, name) && !repeats:
				values = []string{strings.Join(values, ",")}
			case !repeats && len(values) != 1:
				return nil, f.At(v, "%s takes one value, not a list", key)
			}
		default:
			return nil, f.At(v, "%s: want a value, or a list of values", key)
		}
		for _, val := range values {
			if err := fs.Set(name, val); err != nil {
				return nil, f.At(v, "%s %q: %s", key, val, wantOf(fl, err))
			}
		}
	}
	return c, nil
}

// wantOf says what fl takes, for a value it refused with err.
func wantOf(fl *flag.Flag, err error) string {
	kind, _ := flag.UnquoteUsage(fl)
	if _, isBool := fl.Value.(interface{ IsBoolFlag() bool }); isBool {
		kind = "bool"
	}
	switch kind {
	case "int":
		return "want a whole number"
	case "float":
		return "want a number"
	case "duration":
		return "want a duration, such as 30s or 5m"
	case "bool":
		return "want true or false"
	}
	return err.Error()
}

// unknownKey is the error of a key of the file that no flag has.
func unknownKey(fs *flag.FlagSet, f *yamlcfg.File, k *yaml.Node) error {
	var keys []string
	fs.VisitAll(func(fl *flag.Flag) {
		if fl.Name != "config" && fl.Name != "version" {
			keys = append(keys, fl.Name)
		}
	})
	msg := fmt.Sprintf("unknown key %q", k.Value)
	if near := cli.Closest(k.Value, keys); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", strings.ReplaceAll(near, "-", "_"))
	}
	return f.At(k, "%s (the keys are the flags' names with _ for -: run 'edge -h')", msg)
}

// edgeCommand is the edge's help.
func edgeCommand(name string) cli.Command {
	return cli.Command{
		Name:     name,
		Synopsis: "run a tunnel edge: agents connect to it, and it routes public connections to them",
		Examples: []string{
			name + " -domain localhost  agents on 127.0.0.1:7000; their URLs, http://NAME.localhost:8080, work as they are on this machine",
			name + " -domain tunnel.example.com -http :80 -tls :443 -acme-directory https://acme-v02.api.letsencrypt.org/directory -acme-email ops@example.com  a public edge, with certificates from Let's Encrypt",
			name + " -config edge.yml  the settings, and the tokens, from a file",
		},
		More: `A -config file is YAML: each flag's name, with _ for -, is a key (domain, http,
tcp_ports, acme_email...), taking what its flag takes; a list where the flag repeats
or takes a comma-separated list. tokens takes a file, as -tokens, or the list itself
(- token: ${TEAM_A_TOKEN}, identity: team-a); policy takes a file, as -policy, or the
policy itself. ${VAR} takes its value from the environment. Flags win over the file.`,
	}
}
