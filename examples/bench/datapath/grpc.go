//go:build unix

package main

// A gRPC service without protoc: a hand-written grpc.ServiceDesc whose
// messages are raw bytes, through a codec that passes them as they are.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The bench service's methods.
const (
	unaryMethod    = "/tunnelkit.bench.Bench/Unary"
	pingPongMethod = "/tunnelkit.bench.Bench/PingPong"
)

// rawCodec marshals *[]byte messages as their bytes.
type rawCodec struct{}

func (rawCodec) Name() string { return "raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T, want *[]byte", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T, want *[]byte", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

// benchService answers Unary with its request, and each message of a
// PingPong stream with that message.
var benchService = grpc.ServiceDesc{
	ServiceName: "tunnelkit.bench.Bench",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var msg []byte
			if err := dec(&msg); err != nil {
				return nil, err
			}
			return &msg, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "PingPong",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, stream grpc.ServerStream) error {
			var msg []byte
			for {
				if err := stream.RecvMsg(&msg); err != nil {
					return nil // the client's end of stream, or its reset
				}
				if err := stream.SendMsg(&msg); err != nil {
					return err
				}
			}
		},
	}},
}

// pingPongDesc describes the PingPong stream to a client.
var pingPongDesc = grpc.StreamDesc{StreamName: "PingPong", ServerStreams: true, ClientStreams: true}

// dialGRPC returns a client of the bench service at authority (the name
// that is its :authority and TLS server name), connecting to addr: over
// TLS trusting roots, or without TLS (h2c) when roots is nil.
func dialGRPC(authority, addr string, tlsConfig *tls.Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsConfig != nil {
		creds = credentials.NewTLS(tlsConfig)
	}
	return grpc.NewClient("passthrough:///"+authority,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
}
