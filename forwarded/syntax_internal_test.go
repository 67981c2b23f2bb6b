package forwarded

import "testing"

// Hop values never need escaping (validHost refuses '"' and '\'), so the
// quoting is checked here directly.
func TestAppendValue(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"https", "https"},
		{"example.com:8080", `"example.com:8080"`},
		{"[2001:db8::1]", `"[2001:db8::1]"`},
		{`a"b`, `"a\"b"`},
		{`a\b`, `"a\\b"`},
		{`"\`, `"\"\\"`},
		{"a b", `"a b"`},
		{"", `""`},
	} {
		got := string(appendValue(nil, c.in))
		if got != c.want {
			t.Errorf("appendValue(%q) = %s, want %s", c.in, got, c.want)
		}
		// What is written parses back as one valid element.
		if elem := "host=" + got; !validElement(elem) {
			t.Errorf("host=%s is not a valid element", got)
		}
	}
}

func TestValidElement(t *testing.T) {
	for _, c := range []struct {
		elem string
		want bool
	}{
		{"for=192.0.2.60", true},
		{`for="[2001:db8::1]:4711";proto=https;host="a:1"`, true},
		{`for="a\"b\\";by=_x`, true},
		{"for=a;", true},
		{";for=a", true},
		{"for=a ; proto=http", true},
		{";", true},
		{"", false},
		{"for", false},
		{"for=", false},
		{"=a", false},
		{"for=a b", false},
		{`for="a`, false},
		{`for="a\"`, false},
		{`for="a\`, false},
		{`for="a"b`, false},
		{`for=a"b"`, false},
		{"for=\"a\x00\"", false},
		{"for=\"a\r\nb\"", false},
		{"fo r=a", false},
	} {
		if got := validElement(c.elem); got != c.want {
			t.Errorf("validElement(%q) = %v, want %v", c.elem, got, c.want)
		}
	}
}

func TestCleanProto(t *testing.T) {
	for in, want := range map[string]string{
		"http": "http", "https": "https", "HTTPS": "https", "wss": "wss",
		"coap+tcp": "coap+tcp", "a1.-+": "a1.-+",
		"": "", "1http": "", "ht tp": "", "http:": "", "http\r\n": "", "-http": "",
	} {
		if got := cleanProto(in); got != want {
			t.Errorf("cleanProto(%q) = %q, want %q", in, got, want)
		}
	}
}
