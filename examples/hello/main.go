// Command hello is an HTTP app that exposes itself through a tunnel edge
// with an agent.Client's Listen and http.Serve. It prints its public URL
// alone on one stdout line and logs to stderr.
//
//	hello -edge 127.0.0.1:7000 [-url http://hello.example.test]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tunnelkit/tunnelkit/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage is printed
		}
		fmt.Fprintln(os.Stderr, "hello:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hello", flag.ContinueOnError)
	fs.SetOutput(stderr)
	edgeAddr := fs.String("edge", "127.0.0.1:7000", "the edge's agent address")
	url := fs.String("url", "", "public URL to ask for (empty: a random name)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	setup, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c := &agent.Client{Addrs: []string{*edgeAddr}, Logger: log}
	defer c.Close()
	l, err := c.Listen(setup, *url)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, l.URL())
	go func() { <-ctx.Done(); l.Close() }()
	err = http.Serve(l, Handler())
	if ctx.Err() != nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Handler greets the client by the address the tunnel reports.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "Hello from behind the tunnel!\nYou are %s, asking for %s%s\n", r.RemoteAddr, r.Host, r.URL.Path)
	})
}
