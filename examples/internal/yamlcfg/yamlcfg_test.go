package yamlcfg

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type endpoint struct {
	URL    string    `yaml:"url"`
	To     string    `yaml:"to"`
	Pool   bool      `yaml:"pool"`
	Proxy  int       `yaml:"proxy_proto"`
	Policy yaml.Node `yaml:"policy"`
}

type config struct {
	Edge      Strings    `yaml:"edge"`
	Token     string     `yaml:"token"`
	Endpoints []endpoint `yaml:"endpoints"`
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func load(t *testing.T, src string, vars map[string]string) (*config, *File, error) {
	t.Helper()
	f, err := Parse("agent.yml", []byte(src), env(vars))
	if err != nil {
		return nil, nil, err
	}
	var c config
	return &c, f, f.Decode(f.Root, "", &c)
}

// A file with every kind of value reads as written, ${VAR} from the
// environment, numbers where strings go as they are written.
func TestDecode(t *testing.T) {
	c, f, err := load(t, `
edge: [a.example.com:443, b.example.com:443]
token: ${TOKEN}
endpoints:
  - url: https://app.example.com
    to: 3000
  - url: tcp://
    to: 127.0.0.1:${PORT}
    pool: true
    policy:
      basic_auth: ["ann:${PW}"]
      cidr_allow: [10.0.0.0/8]
`, map[string]string{"TOKEN": "s3cret: not YAML", "PORT": "22", "PW": "x y"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Edge, ",") != "a.example.com:443,b.example.com:443" || c.Token != "s3cret: not YAML" {
		t.Errorf("edge %q, token %q", c.Edge, c.Token)
	}
	if c.Endpoints[0].To != "3000" || c.Endpoints[1].To != "127.0.0.1:22" || !c.Endpoints[1].Pool {
		t.Errorf("endpoints %+v", c.Endpoints)
	}
	p, err := f.Policy(&c.Endpoints[1].Policy)
	if err != nil || p == nil || p.BasicAuth == nil || p.BasicAuth.Credentials[0] != "ann:x y" || len(p.CIDRAllow) != 1 {
		t.Fatalf("policy %+v, %v", p, err)
	}
	if p, err := f.Policy(&c.Endpoints[0].Policy); p != nil || err != nil {
		t.Errorf("no policy: %v, %v", p, err)
	}
	c, _, err = load(t, "edge: one:7000\n", nil)
	if err != nil || len(c.Edge) != 1 || c.Edge[0] != "one:7000" {
		t.Errorf("one edge: %q, %v", c.Edge, err)
	}
}

// Every mistake names the file and the line, and an unknown key the
// closest known one.
func TestStrict(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"edge: a:1\ntokne: x\n", `agent.yml:2: unknown key "tokne": did you mean "token"? (the keys: edge, endpoints, token)`},
		{"endpoints:\n  - url: http://\n    to: 1\n  - url: http://\n    too: 2\n", `agent.yml:5: unknown key "too" in endpoints[1]: did you mean "to"?`},
		{"endpoints:\n  - url: http://\n    pool: maybe\n", `agent.yml:3: pool takes true or false, not "maybe"`},
		{"token: a\ntoken: b\n", `agent.yml:2: "token" given twice (first at line 1)`},
		{"token: ${NOPE}\n", "agent.yml:1: ${NOPE}: the environment does not set NOPE"},
		{"token: ${1X}\n", "agent.yml:1: ${1X}: a variable's name is"},
		{"- a\n- b\n", "agent.yml:1: want a mapping"},
		{"edge: {a: b}\n", "agent.yml:1: want a string or a list of strings"},
		{"token: [\n", "agent.yml:"},
		{"a: &x 1\ntoken: *x\n", "agent.yml:2: aliases"},
		{"endpoints:\n  - policy:\n      ip_reputation: {}\n", "agent.yml:3: policy: unknown kind"},
		{"endpoints:\n  - policy:\n      basic_auth: {credentials: [a:b], extra: 1}\n", `agent.yml:3: policy.basic_auth: unknown key "extra"`},
		{"endpoints:\n  - policy:\n      cidr_alow: [10.0.0.0/8]\n", `agent.yml:3: policy: unknown kind "cidr_alow": did you mean "cidr_allow"?`},
		{"endpoints:\n  - policy:\n      rate_limit:\n        requets: 10\n", `agent.yml:4: policy.rate_limit: unknown key "requets": did you mean "requests"?`},
		{"endpoints:\n  - url: a\n    pool: yes please\n", `agent.yml:3: pool takes true or false, not "yes please"`},
		{"endpoints:\n  - url: a\n    proxy_proto: two\n", `agent.yml:3: proxy_proto takes a whole number, not "two"`},
		{"endpoints:\n  - url: a\n    to: [3000]\n", `agent.yml:3: to takes a value, not a list`},
		{"endpoints: http://a\n", `agent.yml:1: endpoints takes a list, not "http://a"`},
	} {
		c, f, err := load(t, tc.src, nil)
		if err == nil && c != nil && len(c.Endpoints) > 0 {
			_, err = f.Policy(&c.Endpoints[0].Policy)
		}
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v\nwant an error starting %s", tc.src, err, tc.want)
		}
	}
}

// An empty file is an empty configuration.
func TestEmpty(t *testing.T) {
	for _, src := range []string{"", "# nothing\n", "---\n"} {
		c, _, err := load(t, src, nil)
		if err != nil || len(c.Edge)+len(c.Endpoints) != 0 {
			t.Errorf("%q: %+v, %v", src, c, err)
		}
	}
}

// FuzzParse: no file makes Parse, Decode or Policy panic, and every error
// names the file.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"edge: a:1\nendpoints:\n  - url: http://x\n    to: 3000\n    policy:\n      basic_auth: [a:b]\n",
		"token: ${X}\n", "a: &x 1\nb: *x\n", "- 1\n", "endpoints: {}\n", "edge: [1, [2]]\n", "{", "token: ${}\n",
		"endpoints:\n  - policy: [1]\n", "endpoints:\n  - policy: {rate_limit: {requests: -1}}\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, src string) {
		c, file, err := load(t, src, map[string]string{"X": "${X}"})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "agent.yml") {
				t.Fatalf("an error that does not name the file: %v", err)
			}
			return
		}
		for i := range c.Endpoints {
			if _, err := file.Policy(&c.Endpoints[i].Policy); err != nil && !strings.HasPrefix(err.Error(), "agent.yml") {
				t.Fatalf("a policy error that does not name the file: %v", err)
			}
		}
	})
}
