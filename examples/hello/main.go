// Command hello is an HTTP app that exposes itself through a tunnel edge
// with an agent.Client's Listen and http.Serve. It prints its public URL
// alone on one stdout line and logs to stderr. It waits for its edge at
// startup, as the agent does: for good, or for -wait.
//
// With -listen, it is a plain local app instead, for an agent's -to: it
// serves HTTP on that address and prints its URL, http://ADDR.
//
//	hello -edge 127.0.0.1:7000 [-token T] [-url http://hello.example.test] [-wait D]
//	hello -listen 127.0.0.1:3000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
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
		fmt.Fprintln(os.Stderr, "hello:", message(err))
		os.Exit(2)
	}
}

// message is err as hello prints it after its name: without the agent
// package's own prefix, which would double it, and with the flag to
// change when the error says which.
func message(err error) string {
	msg := strings.TrimPrefix(err.Error(), "agent: ")
	switch {
	case errors.Is(err, agent.ErrNoToken):
		msg += " (give the edge's token with -token)"
	case errors.Is(err, agent.ErrUnauthorized):
		msg += " (check -token)"
	case errors.Is(err, agent.ErrNotAgentPort):
		msg += "; -edge takes the edge's agent address: its -agents flag, 127.0.0.1:7000 by default"
	}
	return msg
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hello", flag.ContinueOnError)
	fs.SetOutput(stderr)
	edgeAddr := fs.String("edge", "127.0.0.1:7000", "the edge's agent address")
	token := fs.String("token", "", "token to present to the edge")
	url := fs.String("url", "", "public URL to ask for (empty: a random name)")
	wait := fs.Duration("wait", 0, "how long to wait for the edge at startup, trying again with backoff (0: for good)")
	listen := fs.String("listen", "", "serve on this local address instead of through an edge: an app for an agent's -to (empty: through the edge)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *listen != "" {
		for _, f := range []string{"edge", "token", "url", "wait"} {
			if flagSet(fs, f) {
				return fmt.Errorf("-%s is for serving through an edge, -listen for serving locally: give one or the other", f)
			}
		}
		return serveLocal(ctx, *listen, stdout)
	}
	if *wait < 0 {
		return fmt.Errorf("-wait %v: want a duration, or 0 for good", *wait)
	}
	setup, cancel := ctx, context.CancelFunc(func() {})
	if *wait > 0 {
		setup, cancel = context.WithTimeoutCause(ctx, *wait, fmt.Errorf("-wait %v passed", *wait))
	}
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	c := &agent.Client{Addrs: []string{*edgeAddr}, Token: *token, Logger: log}
	defer c.Close()
	l, err := c.Listen(setup, *url)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while it waited
		}
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

// serveLocal serves Handler on addr until ctx is done.
func serveLocal(ctx context.Context, addr string, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	fmt.Fprintln(stdout, "http://"+ln.Addr().String())
	srv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); ctx.Err() == nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// Handler greets the client by its address: the last hop of
// X-Forwarded-For when there is one (behind an agent's -to, where the
// connection is the agent's forwarder's, the hop the edge added for the
// client), else the address the tunnel reports. It names the whole
// X-Forwarded-For too.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "Hello from behind the tunnel!\nYou are %s, asking for %s%s\n", client(r), r.Host, r.URL.Path)
		if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
			fmt.Fprintf(w, "X-Forwarded-For: %s\n", xff)
		}
	})
}

// client returns the address of r's client, without its port.
func client(r *http.Request) string {
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		hops := strings.Split(xff[len(xff)-1], ",")
		if last := strings.TrimSpace(hops[len(hops)-1]); last != "" {
			return last
		}
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
