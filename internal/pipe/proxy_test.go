package pipe

import (
	"errors"
	"testing"
	"time"
)

func TestGRPCTimeout(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"1H": time.Hour, "2M": 2 * time.Minute, "3S": 3 * time.Second, "299m": 299 * time.Millisecond,
		"5u": 5 * time.Microsecond, "7n": 7, "99999999S": 99999999 * time.Second,
	} {
		if got, ok := grpcTimeout(v); !ok || got != want {
			t.Errorf("grpcTimeout(%q) = %v %v, want %v", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "S", "1", "1x", "-1S", "123456789S", "1.5S", " 1S", "1s"} {
		if got, ok := grpcTimeout(v); ok {
			t.Errorf("grpcTimeout(%q) = %v, want no timeout", v, got)
		}
	}
}

func FuzzGRPCTimeout(f *testing.F) {
	for _, s := range []string{"1H", "299m", "", "99999999S", "-1S", "1x", "2700000H"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := grpcTimeout(v)
		if ok && (d < 0 || len(v) > 9) {
			t.Fatalf("grpcTimeout(%q) = %v", v, d)
		}
	})
}

func TestIsStreamReset(t *testing.T) {
	if !isStreamReset(errors.New("stream error: stream ID 3; CANCEL; received from peer")) {
		t.Error("an HTTP/2 reset from the peer not recognised")
	}
	for _, err := range []error{nil, errors.New("stream error: stream ID 3; CANCEL"), errors.New("EOF")} {
		if isStreamReset(err) {
			t.Errorf("%v recognised as a reset from the peer", err)
		}
	}
}
