package edge

import (
	"context"
	"log/slog"
)

// sessionHandler adds a session's attributes (its ID and the agent's
// address) to each record it handles, as Logger.With would: With formats
// them once, into a copy of the handler's state, which costs each idle
// session a few hundred bytes (a TextHandler's: 260 B); this formats them
// with each line the session logs, which are few.
type sessionHandler struct {
	h  slog.Handler
	ss *session
}

// sessionLogger returns ss's logger: the server's, with ss's attributes.
func (ss *session) sessionLogger() *slog.Logger {
	if ss.srv.Logger == nil {
		return discard
	}
	return slog.New(&sessionHandler{h: ss.srv.Logger.Handler(), ss: ss})
}

func (h *sessionHandler) attrs() []slog.Attr {
	return []slog.Attr{slog.String("session", h.ss.id), slog.String("agent_addr", h.ss.src.String())}
}

func (h *sessionHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.h.Enabled(ctx, l)
}

func (h *sessionHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(h.attrs()...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *sessionHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.h.WithAttrs(h.attrs()).WithAttrs(as)
}

func (h *sessionHandler) WithGroup(name string) slog.Handler {
	return h.h.WithAttrs(h.attrs()).WithGroup(name)
}
