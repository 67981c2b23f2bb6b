package slogattrs

import (
	"bytes"
	"log/slog"
	"net"
	"testing"
)

// session is a Source as an edge's agent session is: an ID and an address.
type session struct {
	id  string
	src net.Addr
}

func (s *session) LogAttrs() []slog.Attr {
	return []slog.Attr{slog.String("session", s.id), slog.String("agent_addr", s.src.String())}
}

// TestWritesAsWith: a logger's lines read as those of the handler's
// logger With the source's attributes, whatever the handler and however
// the logger is used.
func TestWritesAsWith(t *testing.T) {
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	src := &net.TCPAddr{IP: net.IPv6loopback, Port: 4443}
	uses := []struct {
		name string
		log  func(*slog.Logger)
	}{
		{"a line", func(l *slog.Logger) { l.Info("agent connected", "identity", "alice", "n", 3) }},
		{"below the level", func(l *slog.Logger) { l.Debug("not written") }},
		{"With", func(l *slog.Logger) { l.With("tunnel", "t1").Warn("bound", "name", "x") }},
		{"WithGroup", func(l *slog.Logger) { l.WithGroup("g").Info("grouped", "k", "v") }},
	}
	loggers := []struct {
		name string
		make func(*bytes.Buffer) *slog.Logger
	}{
		{"text", func(b *bytes.Buffer) *slog.Logger {
			return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{ReplaceAttr: noTime}))
		}},
		{"json in a group, with attributes", func(b *bytes.Buffer) *slog.Logger {
			return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{ReplaceAttr: noTime})).With("edge", "e1").WithGroup("edge")
		}},
	}
	for _, lg := range loggers {
		for _, u := range uses {
			t.Run(lg.name+"/"+u.name, func(t *testing.T) {
				var got, want bytes.Buffer
				ss := &session{id: "0123abcd", src: src}
				u.log(New(lg.make(&got).Handler(), ss))
				u.log(lg.make(&want).With("session", "0123abcd", "agent_addr", src.String()))
				if got.String() != want.String() {
					t.Errorf("wrote\n%s\nwant, as With writes\n%s", got.String(), want.String())
				}
			})
		}
	}
}
