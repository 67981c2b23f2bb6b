package wire

import "testing"

func TestPrintable(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain text", 64, "plain text"},
		{"line\r\nforged=1", 64, "line??forged=1"},
		{"\x1b[31mred", 64, "?[31mred"},
		{"é", 64, "??"},
		{"abcdef", 3, "abc"},
	} {
		if got := Printable(c.in, c.max); got != c.want {
			t.Errorf("Printable(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}
