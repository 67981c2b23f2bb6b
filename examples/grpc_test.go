package examples_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tunnelkit/tunnelkit/agent"
	"github.com/tunnelkit/tunnelkit/agent/forward"
	"github.com/tunnelkit/tunnelkit/edge"
	"github.com/tunnelkit/tunnelkit/internal/testpki"
)

// gRPC through the tunnel (issue #18), with grpc-go on both ends: an h2c
// server behind an https endpoint bound with the app protocol h2c, and a
// TLS client through the edge, with the agent in both of its modes.

// rawCodec passes *[]byte messages as their bytes: a service without
// protoc.
type rawCodec struct{}

func (rawCodec) Name() string { return "tunnelkit-test-raw" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}

// The server finds the codec by the name in the call's content type.
func init() { encoding.RegisterCodec(rawCodec{}) }

// waitService's Wait holds each call until its context ends, and says so
// on ended; it says on started that a call reached it.
type waitService struct {
	started chan struct{}
	ended   chan error
}

func (s *waitService) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "tunnelkit.test.Wait",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Wait",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var msg []byte
				if err := dec(&msg); err != nil {
					return nil, err
				}
				select {
				case s.started <- struct{}{}:
				default:
				}
				select {
				case <-ctx.Done():
					s.ended <- ctx.Err()
					return nil, ctx.Err()
				case <-time.After(30 * time.Second):
					s.ended <- nil
					return &msg, nil
				}
			},
		}},
	}
}

// grpcThroughTunnel is a gRPC server behind an edge, reached by a TLS
// client through the edge.
type grpcThroughTunnel struct {
	conn  *grpc.ClientConn
	waits *waitService
}

// startGRPC runs a gRPC server (health, and waitService) on loopback, an
// edge with an https endpoint for it, and an agent in mode ("bytes" or
// "requests"), and returns a client of it through the edge.
func startGRPC(t *testing.T, mode string) *grpcThroughTunnel {
	t.Helper()
	pki := testpki.New(t)
	waits := &waitService{started: make(chan struct{}, 16), ended: make(chan error, 16)}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	gs.RegisterService(waits.desc(), nil)
	appLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(appLn)
	t.Cleanup(gs.Stop)

	agents, tlsLn := listenT(t), listenT(t)
	srv := &edge.Server{Domain: "example.test", Certificates: []tls.Certificate{pki.Issue(t, "*.example.test")}}
	if os.Getenv("GRPC_DEBUG") != "" {
		srv.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if err := srv.Start(edge.Listeners{Agents: agents, TLS: tlsLn}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	c := &agent.Client{Addrs: []string{agents.Addr().String()}}
	l, err := c.ListenEndpoint(context.Background(), agent.Endpoint{URL: "https://grpc", AppProtocol: "h2c"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if mode == "bytes" {
			forward.Bytes{To: appLn.Addr().String()}.Serve(l)
			return
		}
		forward.HTTP{To: appLn.Addr().String()}.Serve(l)
	}()
	t.Cleanup(func() { c.Close(); <-done })

	conn, err := grpc.NewClient("passthrough:///grpc.example.test",
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pki.Pool, ServerName: "grpc.example.test"})),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", tlsLn.Addr().String())
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &grpcThroughTunnel{conn: conn, waits: waits}
}

func listenT(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

var modes = []string{"bytes", "requests"}

// TestGRPCTrailersOnlyErrors: a health check of a service the server does
// not know fails with NotFound, which grpc-go sends as Trailers-Only (a
// header that ends the stream). 1000 of them through the tunnel all arrive
// as NotFound, none as Internal ("server closed the stream without
// sending trailers"), in both agent modes.
func TestGRPCTrailersOnlyErrors(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			g := startGRPC(t, mode)
			hc := healthpb.NewHealthClient(g.conn)
			const calls = 1000
			got := map[codes.Code]int{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			sem := make(chan struct{}, 16)
			for range calls {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"})
					mu.Lock()
					got[status.Code(err)]++
					if c := status.Code(err); c != codes.NotFound && got[c] <= 3 {
						t.Logf("%v", err)
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			if got[codes.NotFound] != calls {
				t.Fatalf("codes of %d calls: %v, want %d NotFound", calls, got, calls)
			}
		})
	}
}

// TestGRPCCancelAndDeadlineReachTheServer: a call the client cancels, and
// one whose deadline passes, end the server's handler (its context is
// done), as with a direct connection; the client gets Canceled and
// DeadlineExceeded.
func TestGRPCCancelAndDeadlineReachTheServer(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			g := startGRPC(t, mode)
			call := func(ctx context.Context) error {
				in, out := []byte("x"), []byte(nil)
				return g.conn.Invoke(ctx, "/tunnelkit.test.Wait/Wait", &in, &out, grpc.ForceCodec(rawCodec{}))
			}
			// Cancel, once the call reached the server.
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- call(ctx) }()
			select {
			case <-g.waits.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the call never reached the server")
			}
			cancel()
			if err := <-errc; status.Code(err) != codes.Canceled {
				t.Fatalf("cancelled call: %v, want Canceled", err)
			}
			checkEnded(t, g.waits.ended, "cancelled")

			// Deadline: 2 s, in which the call reaches the server on a
			// busy machine.
			ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := call(ctx); status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("call past its deadline: %v, want DeadlineExceeded", err)
			}
			checkEnded(t, g.waits.ended, "past its deadline")
		})
	}
}

// checkEnded waits for the server's handler to end, and checks that it
// ended because its context did.
func checkEnded(t *testing.T, ended <-chan error, what string) {
	t.Helper()
	start := time.Now()
	select {
	case err := <-ended:
		if err == nil || !(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			t.Fatalf("the server's handler of the call %s ran its course (%v): the client's end never reached it", what, err)
		}
		t.Logf("the server's handler of the call %s ended %v after the client's", what, time.Since(start).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatalf("the server's handler of the call %s did not end", what)
	}
}
