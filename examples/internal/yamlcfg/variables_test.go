package yamlcfg

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/policy"
)

// typed has a field of each kind a ${VAR} may go to.
type typed struct {
	S   string        `yaml:"s"`
	P   *string       `yaml:"p"`
	L   []string      `yaml:"l"`
	I   int           `yaml:"i"`
	F   float64       `yaml:"f"`
	B   bool          `yaml:"b"`
	PB  *bool         `yaml:"pb"`
	D   time.Duration `yaml:"d"`
	Any any           `yaml:"any"`
}

// spells are values that YAML would read as something else than a string,
// were they written in the file.
var spells = []string{"~", "null", "Null", "NULL", "true", "True", "yes", "off", "0x10", "0o17", "1e3", ".inf", "-.Inf", ".nan", "2001-12-14", "2001-12-14T21:59:43Z", "", "30s"}

// decodeVar decodes "key: ${V}" into a typed, V set to value.
func decodeVar(t *testing.T, key, value string) (typed, error) {
	t.Helper()
	src := key + ": ${V}\n"
	if key == "l" {
		src = "l:\n  - ${V}\n"
	}
	f, err := Parse("agent.yml", []byte(src), env(map[string]string{"V": value}))
	if err != nil {
		t.Fatalf("%q: %v", src, err)
	}
	var c typed
	return c, f.Decode(f.Root, "", &c)
}

// A ${VAR} is the string it holds in a string field, whatever it spells:
// ~ and null are not an empty value, true not a bool, 0x10 not 16.
func TestVariableIntoAString(t *testing.T) {
	for _, v := range spells {
		c, err := decodeVar(t, "s", v)
		if err != nil || c.S != v {
			t.Errorf("s: ${V} with V=%q: %q, %v", v, c.S, err)
		}
		c, err = decodeVar(t, "p", v)
		if err != nil || c.P == nil || *c.P != v {
			t.Errorf("p (*string): ${V} with V=%q: %v, %v", v, c.P, err)
		}
		c, err = decodeVar(t, "l", v)
		if err != nil || len(c.L) != 1 || c.L[0] != v {
			t.Errorf("l ([]string): [${V}] with V=%q: %q, %v", v, c.L, err)
		}
		c, err = decodeVar(t, "any", v)
		if err != nil || c.Any != v {
			t.Errorf("any: ${V} with V=%q: %#v, %v", v, c.Any, err)
		}
	}
}

// A ${VAR} goes where a number goes when it spells one, as it would be
// written; else it is refused, never read as zero.
func TestVariableIntoANumber(t *testing.T) {
	ints := map[string]int{"0x10": 16, "0o17": 15, "1e3": 1000, "3000": 3000, "-1": -1}
	floats := map[string]float64{"0x10": 16, "0o17": 15, "1e3": 1000, ".inf": math.Inf(1), "-.Inf": math.Inf(-1), "2.5": 2.5}
	for _, v := range append(spells, "3000", "-1", "2.5") {
		c, err := decodeVar(t, "i", v)
		if want, ok := ints[v]; ok {
			if err != nil || c.I != want {
				t.Errorf("i (int): ${V} with V=%q: %d, %v; want %d", v, c.I, err, want)
			}
		} else if err == nil {
			t.Errorf("i (int): ${V} with V=%q: %d, want an error", v, c.I)
		}
		c, err = decodeVar(t, "f", v)
		if want, ok := floats[v]; ok {
			if err != nil || c.F != want {
				t.Errorf("f (float64): ${V} with V=%q: %v, %v; want %v", v, c.F, err, want)
			}
		} else if v != "3000" && v != "-1" && v != ".nan" && err == nil {
			t.Errorf("f (float64): ${V} with V=%q: %v, want an error", v, c.F)
		}
	}
}

// A ${VAR} goes where a bool goes when it spells one (yaml's yes and off
// too, as a bool field takes them written out); ~ and null are refused,
// not false.
func TestVariableIntoABool(t *testing.T) {
	bools := map[string]bool{"true": true, "True": true, "yes": true, "off": false, "false": false}
	for _, v := range append(spells, "false") {
		c, err := decodeVar(t, "b", v)
		want, ok := bools[v]
		switch {
		case ok && (err != nil || c.B != want):
			t.Errorf("b (bool): ${V} with V=%q: %v, %v; want %v", v, c.B, err, want)
		case !ok && err == nil:
			t.Errorf("b (bool): ${V} with V=%q: %v, want an error", v, c.B)
		}
		c, err = decodeVar(t, "pb", v)
		switch {
		case ok && (err != nil || c.PB == nil || *c.PB != want):
			t.Errorf("pb (*bool): ${V} with V=%q: %v, %v; want %v", v, c.PB, err, want)
		case !ok && err == nil:
			t.Errorf("pb (*bool): ${V} with V=%q: %v, want an error", v, c.PB)
		}
	}
}

// A ${VAR} goes where a duration goes as yaml reads one written out: a
// string such as 30s; a number or null is refused.
func TestVariableIntoADuration(t *testing.T) {
	for _, v := range spells {
		c, err := decodeVar(t, "d", v)
		switch {
		case v == "30s" && (err != nil || c.D != 30*time.Second):
			t.Errorf("d (duration): ${V} with V=%q: %v, %v", v, c.D, err)
		case v != "30s" && err == nil:
			t.Errorf("d (duration): ${V} with V=%q: %v, want an error", v, c.D)
		}
	}
}

// In a policy, a ${VAR} takes the type of the member of policy.Spec it
// goes to: a secret or a password is the string it holds, whatever it
// spells; rate_limit's numbers are numbers.
func TestVariableInAPolicy(t *testing.T) {
	parse := func(src string, vars map[string]string) (*policy.Spec, error) {
		t.Helper()
		f, err := Parse("agent.yml", []byte(src), env(vars))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		return f.Policy(f.Root)
	}
	for _, v := range spells {
		if v == "" {
			continue
		}
		vars := map[string]string{"V": v}
		p, err := parse("webhook:\n  provider: github\n  secret: ${V}\noidc:\n  issuer: https://id.example.com\n  client_id: ${V}\n  client_secret: ${V}\n  allow_domains:\n    - ${V}\n", vars)
		if err != nil || p.Webhook.Secret != v || p.OIDC.ClientSecret != v || p.OIDC.ClientID != v || p.OIDC.AllowDomains[0] != v {
			t.Errorf("webhook and oidc with V=%q: %+v, %v", v, p, err)
		}
		p, err = parse("basic_auth:\n  - ${V}\n  - ann:${V}\n", vars)
		if err != nil || !reflect.DeepEqual(p.BasicAuth.Credentials, []string{v, "ann:" + v}) {
			t.Errorf("basic_auth with V=%q: %+v, %v", v, p, err)
		}
		p, err = parse("basic_auth:\n  credentials:\n    - ${V}\n", vars)
		if err != nil || !reflect.DeepEqual(p.BasicAuth.Credentials, []string{v}) {
			t.Errorf("basic_auth {credentials} with V=%q: %+v, %v", v, p, err)
		}
		p, err = parse("request_headers:\n  add:\n    - \"X-V: ${V}\"\n    - ${V}\n", vars)
		if err != nil || p.RequestHeaders.Add[1] != v {
			t.Errorf("request_headers with V=%q: %+v, %v", v, p, err)
		}
	}
	for v, want := range map[string]int{"100": 100, "0x10": 16, "1e3": 1000} {
		p, err := parse("rate_limit:\n  requests: ${V}\n  seconds: ${V}\n", map[string]string{"V": v})
		if err != nil || p.RateLimit.Requests != want || p.RateLimit.Seconds != want {
			t.Errorf("rate_limit with V=%q: %+v, %v; want %d", v, p, err, want)
		}
	}
	for _, v := range []string{"~", "null", "true", "lots"} {
		if p, err := parse("rate_limit:\n  requests: ${V}\n", map[string]string{"V": v}); err == nil {
			t.Errorf("rate_limit requests with V=%q: %+v, want an error", v, p.RateLimit)
		}
	}
	p, err := parse("basic_auth:\n  credentials: [\"a:b\"]\n  pass_authorization: ${V}\n", map[string]string{"V": "true"})
	if err != nil || !p.BasicAuth.PassAuthorization {
		t.Errorf("pass_authorization with V=true: %+v, %v", p, err)
	}
}

// Each member policySecrets names is a string member of policy.Spec (or a
// list of them): a rename there is caught here.
func TestPolicySecretsAreMembers(t *testing.T) {
	for path := range policySecrets {
		ty := specType
		for name := range strings.SplitSeq(path, ".") {
			for ty.Kind() == reflect.Pointer {
				ty = ty.Elem()
			}
			found := false
			for field := range ty.Fields() {
				if n, _, _ := strings.Cut(field.Tag.Get("json"), ","); n == name {
					ty, found = field.Type, true
				}
			}
			if !found {
				t.Fatalf("%s: policy.Spec has no member %q", path, name)
			}
		}
		if ty.Kind() == reflect.Slice {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.String {
			t.Errorf("%s is a %v, not a string", path, ty)
		}
	}
}
