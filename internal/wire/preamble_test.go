package wire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
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

// TestPreambleFailsAtTheFirstWrongByte: a peer that answers with
// something else is told at its first bytes, without waiting for the
// eighth, which may never come (an alert of 7 bytes, an HTTP server that
// sent its status line and waits).
func TestPreambleFailsAtTheFirstWrongByte(t *testing.T) {
	for _, first := range []string{"HTTP/1.1 400", "\x15\x03\x01\x00\x02\x02\x46", "H", "TKT2"} {
		r, w := io.Pipe()
		go w.Write([]byte(first)) // and nothing more, until r is closed
		done := make(chan error, 1)
		go func() { _, err := ReadPreamble(r); done <- err }()
		select {
		case err := <-done:
			var pe *PreambleError
			if !errors.As(err, &pe) || !errors.Is(err, ErrPreamble) || pe.Err != nil || !strings.HasPrefix(first, string(pe.Got)) || len(pe.Got) == 0 {
				t.Errorf("ReadPreamble(%q...) = %v, want a PreambleError holding the first bytes", first, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("ReadPreamble(%q...) still waits for more bytes after 10 s", first)
		}
		r.Close()
	}
}
