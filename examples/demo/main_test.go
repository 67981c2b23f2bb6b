package main

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
)

// TestDemoCurlLine runs the demo and the exact curl line it prints.
func TestDemoCurlLine(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-http", "127.0.0.1:0"}, pw, io.Discard); pw.Close() }()
	sc := bufio.NewScanner(pr)
	var line string
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "curl ") {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatal("demo printed no curl line")
	}
	go io.Copy(io.Discard, pr)
	out, err := exec.Command("sh", "-c", line+" --silent --show-error --max-time 10").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	if !strings.Contains(string(out), "Hello from behind the tunnel!") || !strings.Contains(string(out), "asking for demo.example.test:") {
		t.Fatalf("curl got %q", out)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo: %v", err)
	}
}
