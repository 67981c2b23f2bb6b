package names

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tunnelkit/tunnelkit/internal/wire"
	"github.com/tunnelkit/tunnelkit/router"
	"github.com/tunnelkit/tunnelkit/router/routertest"
)

// The Record is a router.Router and a router.Reserver under the contract,
// as the MemoryRouter it records is.
func TestRecordContract(t *testing.T) {
	routertest.Run(t, func(t *testing.T) router.Router {
		n, err := Open(t.TempDir(), new(router.MemoryRouter), time.Minute, slog.New(slog.DiscardHandler), time.Now)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Stop)
		return n
	})
}

func TestOutside(t *testing.T) {
	const domain = "example.test"
	for req, want := range map[string]string{
		"shop.customer.test":               "shop.customer.test",
		"Shop.Customer.Test.":              "shop.customer.test",
		"customer.test":                    "customer.test",
		"xn--80ak6aa92e.test":              "xn--80ak6aa92e.test",
		"a.b.c.d.customer.com":             "a.b.c.d.customer.com",
		"example.test":                     "", // the domain
		"test":                             "", // above it, and one label
		"x.example.test":                   "", // under it
		"*.customer.test":                  "", // a wildcard
		"1.2.3.4":                          "", // an IPv4 address
		"customer.123":                     "", // a numeric last label
		"xn--pple-43d.test":                "", // mixed scripts
		"a..b":                             "",
		"a_b.customer.test":                "",
		"":                                 "",
		"-a.customer.test":                 "",
		"[::1]":                            "",
		strings.Repeat("a.", 130) + "test": "",
	} {
		got, ok := Outside(req, domain)
		if got != want || ok != (want != "") {
			t.Errorf("Outside(%q) = %q, %v; want %q", req, got, ok, want)
		}
	}
}

// FuzzOutside: Outside, which reads Host headers and server names, never
// panics; a name it accepts is lower case, of valid labels, outside the
// domain and not above it, and accepted again as it is.
func FuzzOutside(f *testing.F) {
	for _, s := range []string{"shop.customer.test", "SHOP.customer.test.", "example.test", "x.example.test", "test", "1.2.3.4",
		"*.a.b", "xn--pple-43d.test", "a", "", "a..b", "é.test", strings.Repeat("a", 64) + ".test"} {
		f.Add(s)
	}
	const domain = "example.test"
	f.Fuzz(func(t *testing.T, req string) {
		name, ok := Outside(req, domain)
		if !ok {
			return
		}
		if name != strings.ToLower(name) || strings.HasSuffix(name, "."+domain) || name == domain || strings.HasSuffix(domain, "."+name) || len(name) > 253 || !strings.Contains(name, ".") {
			t.Fatalf("Outside(%q) = %q", req, name)
		}
		for l := range strings.SplitSeq(name, ".") {
			if checkLabel(l) != nil {
				t.Fatalf("Outside(%q) = %q, with label %q", req, name, l)
			}
		}
		if again, ok := Outside(name, domain); !ok || again != name {
			t.Fatalf("Outside(%q) = %q, and again %q, %v", req, name, again, ok)
		}
	})
}

func TestReservation(t *testing.T) {
	const domain = "example.test"
	public := map[string]bool{"ech.example.test": true}
	for _, c := range []struct{ req, identity, want string }{
		{"shop", "alice", "shop.example.test"},
		{"Shop.Example.Test.", "alice", "shop.example.test"},
		{"shop.customer.test", "alice", "shop.customer.test"},
		{"shop.customer.test", "", ""},
		{"*.shop.example.test", "alice", ""},
		{"*", "alice", ""},
		{"example.test", "alice", ""},
		{"test", "alice", "test.example.test"}, // one label is under the domain
		{"ech.example.test", "alice", ""},
		{"x.ech.example.test", "alice", ""},
		{"1.2.3.4", "alice", ""},
		{"bad_name.example.test", "alice", ""},
	} {
		r, err := Reservation(c.req, c.identity, domain, public)
		if c.want == "" {
			if err == nil {
				t.Errorf("Reservation(%q, %q) = %v, want an error", c.req, c.identity, r)
			}
			continue
		}
		if err != nil || r != (router.Reservation{Name: c.want, Identity: c.identity}) {
			t.Errorf("Reservation(%q, %q) = %v, %v; want %s", c.req, c.identity, r, err, c.want)
		}
	}
}

func TestCustomer(t *testing.T) {
	ctx := context.Background()
	const domain = "example.test"
	var m router.MemoryRouter
	if err := m.AddReservation(ctx, router.Reservation{Name: "shop.customer.test", Identity: "alice"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rs             router.Reserver
		name, identity string
		code           string // "" for nil
	}{
		{&m, "abc.example.test", "bob", ""},
		{&m, "shop.customer.test", "alice", ""},
		{&m, "shop.customer.test", "bob", wire.CodeBadRequest},
		{&m, "other.customer.test", "alice", wire.CodeBadRequest},
		{&m, "x.shop.customer.test", "alice", wire.CodeBadRequest}, // exactly the name reserved
		{nil, "shop.customer.test", "alice", wire.CodeBadRequest},
	} {
		e := Customer(ctx, c.rs, c.name, domain, c.identity)
		if c.code == "" && e != nil || c.code != "" && (e == nil || e.Code != c.code) {
			t.Errorf("Customer(%s for %s) = %+v, want code %q", c.name, c.identity, e, c.code)
		}
	}
}

func TestHosts(t *testing.T) {
	const domain = "example.test"
	one := func(req string) (string, bool, error) {
		hosts, chosen, err := Hosts(req, domain, false)
		if err != nil {
			return "", chosen, err
		}
		var all []string
		for h := range hosts {
			all = append(all, h)
		}
		return strings.Join(all, ","), chosen, nil
	}
	for req, want := range map[string]string{"abc": "abc.example.test", "*.w.example.test": "*.w.example.test", "shop.customer.test": "shop.customer.test"} {
		if got, chosen, err := one(req); got != want || !chosen || err != nil {
			t.Errorf("Hosts(%q) = %q, %v, %v; want %q chosen", req, got, chosen, err, want)
		}
	}
	for _, req := range []string{"*.customer.test", "*", "a..b", "example.test"} {
		if got, _, err := one(req); err == nil {
			t.Errorf("Hosts(%q) = %q, want an error", req, got)
		}
	}
	hosts, chosen, err := Hosts("", domain, false)
	n := 0
	for h := range hosts {
		n++
		if !strings.HasSuffix(h, "."+domain) {
			t.Errorf("a random name %q outside the domain", h)
		}
	}
	if chosen || err != nil || n != 8 {
		t.Errorf("Hosts(\"\"): %d names, chosen %v, %v; want 8 random ones", n, chosen, err)
	}
	if _, _, err := Hosts("abc", "", false); err == nil {
		t.Error("Hosts without a domain: no error")
	}
}
