// Package slogattrs adds a source's attributes to each record a
// slog.Handler handles, as Logger.With would, without formatting them
// ahead: With formats them once, into a copy of the handler's state, which
// costs each of many idle holders (an edge's agent sessions) a few hundred
// bytes (a TextHandler's: 260 B); this formats them with each line, which
// are few.
package slogattrs

import (
	"context"
	"log/slog"
)

// Source gives the attributes added to each record.
type Source interface {
	LogAttrs() []slog.Attr
}

// Handler is h, with src's attributes added to each record.
type Handler struct {
	h   slog.Handler
	src Source
}

// New returns a logger that writes to h with src's attributes first.
func New(h slog.Handler, src Source) *slog.Logger {
	return slog.New(&Handler{h: h, src: src})
}

func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.h.Enabled(ctx, l)
}

func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(h.src.LogAttrs()...)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	return h.h.WithAttrs(h.src.LogAttrs()).WithAttrs(as)
}

func (h *Handler) WithGroup(name string) slog.Handler {
	return h.h.WithAttrs(h.src.LogAttrs()).WithGroup(name)
}
