package main

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// TestDemoCurlLine runs the demo and the exact curl lines it prints: one
// for the http URL, one for the https URL over HTTP/2.
func TestDemoCurlLine(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-http", "127.0.0.1:0"}, pw, io.Discard); pw.Close() }()
	sc := bufio.NewScanner(pr)
	var lines []string
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "curl ") {
			lines = append(lines, l)
		}
		if strings.HasPrefix(l, "Ctrl-C") {
			break
		}
	}
	if len(lines) != 2 {
		t.Fatalf("demo printed %d curl lines, want 2", len(lines))
	}
	go io.Copy(io.Discard, pr)
	for i, line := range lines {
		out, err := exec.Command("sh", "-c", line+" --silent --show-error --max-time 10").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		want := []string{"over http\n", "over https\n"}[i]
		if !strings.Contains(string(out), "Hello from behind the tunnel!") || !strings.Contains(string(out), "asking for demo.example.test:") || !strings.Contains(string(out), want) {
			t.Fatalf("%s: curl got %q", line, out)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo: %v", err)
	}
}
