package suggest

import "testing"

func TestClosest(t *testing.T) {
	kinds := []string{"cidr_allow", "cidr_deny", "rate_limit", "basic_auth", "oidc", "webhook"}
	for s, want := range map[string]string{
		"cidr_alow":  "cidr_allow",
		"ratelimit":  "rate_limit",
		"basic":      "basic_auth",
		"webhooks":   "webhook",
		"x":          "",
		"firewall":   "",
		"oidc":       "oidc",
		"cidr_denyy": "cidr_deny",
	} {
		if got := Closest(s, kinds); got != want {
			t.Errorf("Closest(%q) = %q, want %q", s, got, want)
		}
	}
}

func FuzzClosest(f *testing.F) {
	f.Add("cidr_alow")
	f.Fuzz(func(t *testing.T, s string) {
		got := Closest(s, []string{"cidr_allow", "rate_limit"})
		if got != "" && got != "cidr_allow" && got != "rate_limit" {
			t.Fatalf("Closest(%q) = %q: not one of the names", s, got)
		}
	})
}
