package wire

import (
	"bytes"
	"errors"
	"testing"
)

func TestPreamble(t *testing.T) {
	var b bytes.Buffer
	if err := WritePreamble(&b, 512<<10); err != nil {
		t.Fatal(err)
	}
	if b.String() != "TKT1\x00\x08\x00\x00" {
		t.Fatalf("preamble bytes %q", b.String())
	}
	if w, err := ReadPreamble(&b); err != nil || w != 512<<10 {
		t.Fatalf("ReadPreamble = %d, %v", w, err)
	}
	for _, bad := range []string{"", "TKT1", "GET / HTTP/1.1", "TKT2\x00\x04\x00\x00", "TKT1\x00\x00\x00\x01", "TKT1\x7f\x00\x00\x00"} {
		if _, err := ReadPreamble(bytes.NewBufferString(bad)); !errors.Is(err, ErrPreamble) {
			t.Errorf("ReadPreamble(%q) = %v, want ErrPreamble", bad, err)
		}
	}
	for in, want := range map[int]uint32{0: DefaultWindow, 1: MinWindow, 1 << 30: MaxWindow, 300 << 10: 300 << 10} {
		if got := ClampWindow(in); got != want {
			t.Errorf("ClampWindow(%d) = %d, want %d", in, got, want)
		}
	}
}
