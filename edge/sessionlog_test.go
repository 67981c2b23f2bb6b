package edge

import (
	"bytes"
	"log/slog"
	"net"
	"testing"
)

// TestSessionLoggerWritesAsWith: a session's lines read as those of the
// server's logger With the session's attributes, whatever the logger
// and however the session's logger is used.
func TestSessionLoggerWritesAsWith(t *testing.T) {
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
				ss := &session{srv: &Server{Logger: lg.make(&got)}, id: "0123abcd", src: src}
				u.log(ss.sessionLogger())
				u.log(lg.make(&want).With("session", "0123abcd", "agent_addr", src.String()))
				if got.String() != want.String() {
					t.Errorf("wrote\n%s\nwant, as With writes\n%s", got.String(), want.String())
				}
			})
		}
	}
	ss := &session{srv: &Server{}, id: "x", src: src}
	if ss.sessionLogger() != discard {
		t.Error("a server without a logger: a session's logger is not the discarding one")
	}
}
