// Package yamlcfg reads the example commands' configuration files: YAML,
// strictly. A key the command does not know, a value of the wrong type, a
// key given twice and a ${VAR} the environment does not set are errors
// that name the file and the line; ${VAR} takes its value from the
// environment, so that secrets stay out of the file. Expansion happens in
// values after parsing: a variable's value is never read as YAML. It is a
// string, whatever it spells (~, null, true, 0x10, a date...), unless it
// goes where a number or a bool goes and spells one: ${PORT} set to 3000
// is 3000 there, as it would be written in the file.
//
// A file that writes a secret out (a token, a password: a struct field
// tagged secret:"what it is", or secret:"what it is,url" for a URL whose
// password alone is the secret, when it has one; or a policy's basic_auth
// credentials, oidc client_secret and webhook secret), rather than taking
// it from ${VAR}, is refused when group or others may read or write it.
package yamlcfg

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tunnelkit/tunnelkit/internal/suggest"
	"io/fs"
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tunnelkit/tunnelkit/examples/internal/cli"
	"github.com/tunnelkit/tunnelkit/internal/safefile"
	"github.com/tunnelkit/tunnelkit/policy"
)

// File is a configuration file, parsed and expanded.
type File struct {
	Name string     // the file's path, as given
	Root *yaml.Node // its top-level mapping; nil for an empty file

	info     fs.FileInfo           // the file's, from Load; nil: Parse's bytes, taken as private
	expanded map[*yaml.Node]string // each value with a ${VAR}, as written
}

// MaxSize bounds the file Load reads.
const MaxSize = 16 << 20

// Load reads the YAML file at path and expands ${VAR} in its values from
// the environment (lookup; nil: os.LookupEnv). The top level must be a
// mapping. A named pipe or a device is refused without blocking.
func Load(path string, lookup func(string) (string, bool)) (*File, error) {
	b, info, err := safefile.Read(path, MaxSize)
	if err != nil {
		return nil, err
	}
	f, err := Parse(path, b, lookup)
	if err != nil {
		return nil, err
	}
	f.info = info
	return f, nil
}

// Parse is Load of the bytes b, read from the file name.
func Parse(name string, b []byte, lookup func(string) (string, bool)) (*File, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	f := &File{Name: name, expanded: map[*yaml.Node]string{}}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, f.wrap(err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return f, nil // empty
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return f, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, f.At(root, "want a mapping of keys to values at the top (key: value)")
	}
	if err := f.expand(root, lookup, false); err != nil {
		return nil, err
	}
	f.Root = root
	return f, nil
}

// variable is a reference to an environment variable in a value.
var variable = regexp.MustCompile(`\$\{([^}]*)\}`)

// validName is what a variable's name may be.
var validName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expand replaces ${VAR} in every scalar value under n (not in keys),
// and refuses a key given twice in a mapping. Under a policy's phases
// (inRules), a ${...} that is not a variable's name is a rule's CEL
// interpolation (${req.url.path}), left for the edge.
func (f *File) expand(n *yaml.Node, lookup func(string) (string, bool), inRules bool) error {
	switch n.Kind {
	case yaml.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if first, dup := seen[k.Value]; dup {
				return f.At(k, "%q given twice (first at line %d)", k.Value, first)
			}
			seen[k.Value] = k.Line
			rules := inRules || k.Value == policy.PhaseTCPConnect || k.Value == policy.PhaseHTTPRequest || k.Value == policy.PhaseHTTPResponse
			if err := f.expand(n.Content[i+1], lookup, rules); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if err := f.expand(c, lookup, inRules); err != nil {
				return err
			}
		}
	case yaml.AliasNode:
		return f.At(n, "aliases (*name) are not taken here: write the value out")
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "${") {
			return nil
		}
		var failed error
		written, subst := n.Value, false
		value := variable.ReplaceAllStringFunc(n.Value, func(ref string) string {
			name := ref[2 : len(ref)-1]
			if !validName.MatchString(name) {
				if inRules {
					return ref // a rule's ${expression}
				}
				failed = f.At(n, "%s: a variable's name is letters, digits and _, not starting with a digit", ref)
				return ref
			}
			subst = true
			v, ok := lookup(name)
			if !ok && failed == nil {
				failed = f.At(n, "%s: the environment does not set %s", ref, name)
			}
			return v
		})
		if failed != nil {
			return failed
		}
		if !subst {
			return nil
		}
		f.expanded[n] = written
		n.Value = value
		// The value is a string, whatever it spells, until settle finds
		// it goes where a number or a bool goes.
		n.Tag, n.Style = "!!str", 0
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// settle gives the scalar n, if ${VAR} expanded it, the type of what it
// decodes into, t: it stays a string unless t is a number and the value
// spells one (3000, 0x10, 1e3), or t is a bool and the value spells one
// (true, False), as it would read written in the file. A duration stays a
// string ("30s"), as yaml takes it; ~ and null are strings everywhere, so
// that a number or a bool refuses them rather than read them as zero.
func (f *File) settle(n *yaml.Node, t reflect.Type) {
	if _, ok := f.expanded[n]; !ok {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	plain := yaml.Node{Kind: yaml.ScalarNode, Value: n.Value}
	tag := plain.ShortTag()
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		// A float that is a whole number (1e3); not .inf, which yaml
		// would make the least int64.
		var x float64
		if t != durationType && (tag == "!!int" || tag == "!!float" && plain.Decode(&x) == nil && x == math.Trunc(x) && !math.IsInf(x, 0)) {
			n.Tag = tag
		}
	case reflect.Float32, reflect.Float64:
		if tag == "!!int" || tag == "!!float" {
			n.Tag = tag
		}
	case reflect.Bool:
		if tag == "!!bool" {
			n.Tag = tag
		}
	}
}

// Secret returns an error when the value at n, a secret (what: "a
// token"), is written out in the file, all of it or a part, rather than
// taken from the environment with ${VAR}, and group or others may read or
// write the file. A file that Parse read from bytes is taken as private.
func (f *File) Secret(n *yaml.Node, what string) error {
	return f.secret(n, what, wholeSecret)
}

// secretForm is where the secret is in a value.
type secretForm int

const (
	wholeSecret       secretForm = iota // all of it
	credentialsSecret                   // "user:password": what follows the first colon
	urlSecret                           // a URL's password, if it has one ("http://user:password@host")
)

// secret is Secret, for the secret in the value's form, as written.
func (f *File) secret(n *yaml.Node, what string, form secretForm) error {
	if f.info == nil || n == nil {
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		for _, c := range n.Content {
			if err := f.secret(c, what, form); err != nil {
				return err
			}
		}
		return nil
	}
	written, ok := f.expanded[n]
	if !ok {
		written = n.Value
	}
	switch form {
	case credentialsSecret:
		if _, pw, ok := strings.Cut(written, ":"); ok {
			written = pw
		}
	case urlSecret:
		pw, ok := urlPassword(written)
		if !ok {
			return nil // no password written: nothing secret
		}
		written = pw
	}
	if variable.ReplaceAllString(written, "") == "" {
		return nil // from the environment
	}
	return safefile.Private(f.Name, f.info, fmt.Sprintf("its line %d writes out %s (${VAR} would take it from the environment)", n.Line, what))
}

// urlPassword returns the password of the URL u, as written, and whether
// it has one: "pw" for "http://user:pw@host:3128", as for
// "user:pw@host:3128" (a URL without a scheme, as a proxy's may be); none
// for "http://user@host" and "http://host".
func urlPassword(u string) (string, bool) {
	if _, rest, ok := strings.Cut(u, "://"); ok {
		u = rest
	}
	if i := strings.IndexAny(u, "/?#"); i >= 0 {
		u = u[:i] // the authority, as url.Parse reads it
	}
	at := strings.LastIndex(u, "@")
	if at < 0 {
		return "", false
	}
	_, pw, ok := strings.Cut(u[:at], ":")
	return pw, ok && pw != ""
}

// At returns an error at n's line: "FILE:LINE: msg".
func (f *File) At(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", f.Name, n.Line, fmt.Sprintf(format, args...))
}

// lineMsg is how yaml.v3 starts its messages: "line 4: ...".
var lineMsg = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// wrap turns yaml.v3's errors into "FILE:LINE: ..." ones.
func (f *File) wrap(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var msgs []string
		for _, e := range te.Errors {
			msgs = append(msgs, f.Name+":"+lineMsg.ReplaceAllString(e, "$1: "))
		}
		return errors.New(strings.Join(msgs, "\n"))
	}
	msg := err.Error()
	if lineMsg.MatchString(msg) {
		return errors.New(f.Name + ":" + lineMsg.ReplaceAllString(msg, "$1: "))
	}
	return fmt.Errorf("%s: %s", f.Name, strings.TrimPrefix(msg, "yaml: "))
}

// Decode decodes n into v, a pointer to a struct whose fields name their
// keys with yaml tags, strictly: a key v does not have is an error at its
// line, naming the closest key. A field of type yaml.Node is left to the
// caller to check. where names n for errors ("" at the top).
func (f *File) Decode(n *yaml.Node, where string, v any) error {
	if n == nil {
		return nil
	}
	if err := f.checkKeys(n, where, reflect.TypeOf(v).Elem()); err != nil {
		return err
	}
	if err := n.Decode(v); err != nil {
		return f.wrap(err)
	}
	return nil
}

var nodeType = reflect.TypeFor[yaml.Node]()

// checkKeys checks the keys of the mappings under n against t.
func (f *File) checkKeys(n *yaml.Node, where string, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType {
		return nil
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		keys := Keys(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			field, ok := keys[k.Value]
			if !ok {
				return f.unknownKey(k, where, keys)
			}
			if err := f.checkKeys(val, join(where, k.Value), field.Type); err != nil {
				return err
			}
			if tag := field.Tag.Get("secret"); tag != "" {
				what, form, _ := strings.Cut(tag, ",")
				kind := wholeSecret
				if form == "url" {
					kind = urlSecret
				}
				if err := f.secret(val, what, kind); err != nil {
					return err
				}
			}
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, c := range n.Content {
			if err := f.checkKeys(c, fmt.Sprintf("%s[%d]", where, i), t.Elem()); err != nil {
				return err
			}
		}
	case n.Kind == yaml.ScalarNode:
		f.settle(n, t)
		return f.checkScalar(n, where, t)
	case takes(t) != "" && !unmarshals(t):
		return f.At(n, "%s takes %s, not a %s", keyOf(where), takes(t), kindName(n))
	}
	return nil
}

// yamlUnmarshaler is a type that reads its own YAML (such as Strings).
var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// unmarshals reports whether t reads its own YAML.
func unmarshals(t reflect.Type) bool {
	return t.Implements(yamlUnmarshaler) || reflect.PointerTo(t).Implements(yamlUnmarshaler)
}

// takes says what a scalar of type t is, for an error: "" for a type that
// is no scalar.
func takes(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a value"
	}
	return ""
}

// kindName names what the node n is, for an error.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	}
	return "value"
}

// keyOf returns the key that where, a path, ends with: "pool" of
// "endpoints[1].pool".
func keyOf(where string) string {
	if i := strings.LastIndexByte(where, '.'); i >= 0 {
		return where[i+1:]
	}
	return where
}

// checkScalar returns an error, in words, for the scalar n that the type t
// at where does not take: "pool takes true or false, not \"yes please\"".
// Null is every type's zero. A type that reads its own YAML is left to it.
func (f *File) checkScalar(n *yaml.Node, where string, t reflect.Type) error {
	if unmarshals(t) || t.Kind() == reflect.String || t.Kind() == reflect.Interface {
		return nil
	}
	if n.ShortTag() == "!!null" {
		return nil
	}
	what := takes(t)
	switch {
	case what == "":
		return f.At(n, "%s takes a %s, not %q", keyOf(where), structural(t), n.Value)
	case n.Decode(reflect.New(t).Interface()) != nil: // as yaml reads it: yes and off are bools too
		return f.At(n, "%s takes %s, not %q", keyOf(where), what, n.Value)
	}
	return nil
}

// structural names what a list or struct type t takes, for an error.
func structural(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "list"
	case reflect.Map, reflect.Struct:
		return "mapping (key: value)"
	}
	return "value of another kind"
}

func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}

// unknownKey is the error of a key k that is none of keys.
func (f *File) unknownKey(k *yaml.Node, where string, keys map[string]reflect.StructField) error {
	names := make([]string, 0, len(keys))
	for name := range keys {
		names = append(names, name)
	}
	slices.Sort(names)
	in := ""
	if where != "" {
		in = " in " + where
	}
	msg := fmt.Sprintf("unknown key %q%s", k.Value, in)
	if near := cli.Closest(k.Value, names); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", near)
	}
	return f.At(k, "%s (the keys%s: %s)", msg, in, strings.Join(names, ", "))
}

// Keys returns the yaml keys of the struct type t and their fields.
func Keys(t reflect.Type) map[string]reflect.StructField {
	keys := map[string]reflect.StructField{}
	for field := range t.Fields() {
		name, _, _ := strings.Cut(field.Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			keys[name] = field
		}
	}
	return keys
}

// Policy reads a traffic policy in the JSON form the edge and agents take
// (cidr_allow, basic_auth, rate_limit, ... as in docs/PROTOCOL.md), written in
// YAML at n, and checks its form: its errors name the line. basic_auth
// also takes a list of "user:password" alone, for {credentials: [...]}.
// A missing or null policy is nil. A ${VAR} is typed by the member of
// policy.Spec it goes to; a secret written out in a file open to others
// is refused.
func (f *File) Policy(n *yaml.Node) (*policy.Spec, error) {
	if n == nil || n.Kind == 0 || n.Tag == "!!null" {
		return nil, nil
	}
	if err := f.policyValues(n, specType, ""); err != nil {
		return nil, err
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, f.wrap(err)
	}
	if m, ok := v.(map[string]any); ok {
		if list, ok := m[policy.KindBasicAuth].([]any); ok {
			m[policy.KindBasicAuth] = map[string]any{"credentials": list}
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, f.At(n, "policy: %v", err)
	}
	spec, err := policy.Parse(b)
	if err != nil {
		return nil, f.At(n, "%v", err)
	}
	if spec.IsZero() {
		return nil, nil
	}
	return &spec, nil
}

var (
	specType   = reflect.TypeFor[policy.Spec]()
	actionType = reflect.TypeFor[policy.Action]()
)

// actionSecrets checks the secrets of the config n of an action of type
// typ: basic-auth's credentials, oidc's client_secret, verify-webhook's
// secret.
func (f *File) actionSecrets(typ string, n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case typ == policy.ActionBasicAuth && k.Value == "credentials" && v.Kind == yaml.SequenceNode:
			for _, c := range v.Content {
				if err := f.secret(c, "a basic-auth password", credentialsSecret); err != nil {
					return err
				}
			}
		case typ == policy.ActionOIDC && k.Value == "client_secret":
			if err := f.secret(v, "an oidc client_secret", wholeSecret); err != nil {
				return err
			}
		case typ == policy.ActionVerifyWebhook && k.Value == "secret":
			if err := f.secret(v, "a verify-webhook secret", wholeSecret); err != nil {
				return err
			}
		}
	}
	return nil
}

// policySecrets are the members of a policy that hold a secret, and what
// each is.
var policySecrets = map[string]string{
	policy.KindBasicAuth + ".credentials": "a basic_auth password",
	policy.KindOIDC + ".client_secret":    "an oidc client_secret",
	policy.KindWebhook + ".secret":        "a webhook secret",
}

// policyValues walks the policy at n, whose member path is where, beside
// t, the type of policy.Spec it decodes into by its json tags: each value
// ${VAR} expanded gets t's type (settle), and each secret is checked. A
// member t does not have is left to policy.Parse to name.
func (f *File) policyValues(n *yaml.Node, t reflect.Type, where string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.MappingNode && t == actionType:
		// A rule's action: its config is the action type's, which
		// policy.Parse reads; only its secrets are looked at here.
		var typ string
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "type" {
				typ = n.Content[i+1].Value
			}
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			switch k.Value {
			case "type":
			case "config":
				if err := f.actionSecrets(typ, v); err != nil {
					return err
				}
			default:
				return f.unknownPolicyKey(k, where, map[string]reflect.Type{"type": nil, "config": nil})
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := map[string]reflect.Type{}
		for field := range t.Fields() {
			name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
			fields[name] = field.Type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				return f.unknownPolicyKey(k, where, fields)
			}
			if err := f.policyValues(v, ft, join(where, k.Value)); err != nil {
				return err
			}
		}
	case n.Kind == yaml.SequenceNode && where == policy.KindBasicAuth:
		// The list of credentials alone.
		return f.policyValues(&yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Value: "credentials"}, n}}, t, where)
	case n.Kind == yaml.SequenceNode && t.Kind() == reflect.Slice:
		for _, c := range n.Content {
			if err := f.policyValues(c, t.Elem(), where); err != nil {
				return err
			}
		}
	case n.Kind == yaml.ScalarNode:
		f.settle(n, t)
		if what, ok := policySecrets[where]; ok {
			form := wholeSecret
			if where == policy.KindBasicAuth+".credentials" {
				form = credentialsSecret
			}
			return f.secret(n, what, form)
		}
	}
	return nil
}

// unknownPolicyKey is the error of a key k of the policy, at where, that
// is none of fields: a kind, at the top, or a member of one.
func (f *File) unknownPolicyKey(k *yaml.Node, where string, fields map[string]reflect.Type) error {
	names := slices.Sorted(maps.Keys(fields))
	msg, in := fmt.Sprintf("policy: unknown kind %q", k.Value), "the kinds"
	if where != "" {
		msg, in = fmt.Sprintf("policy.%s: unknown key %q", where, k.Value), "its keys"
	}
	if near := suggest.Closest(k.Value, names); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", near)
	}
	return f.At(k, "%s (%s: %s)", msg, in, strings.Join(names, ", "))
}

// Strings is a value that is one string or a list of them: "edge: a:7000"
// or "edge: [a:7000, b:7000]".
type Strings []string

// UnmarshalYAML implements yaml.Unmarshaler.
func (s *Strings) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*s = Strings{n.Value}
		return nil
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		*s = list
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings", n.Line)
}
