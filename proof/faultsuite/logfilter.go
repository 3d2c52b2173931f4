package faultsuite

import (
	"context"
	"log/slog"
	"strings"
)

// quietInjected wraps a handler and drops the log records of the faults injected on purpose (Watermill routers log
// every handler error, and thousands of publishes are rejected on purpose), so what remains is what was not planned.
func quietInjected(h slog.Handler) slog.Handler { return injectedFilter{h} }

type injectedFilter struct{ next slog.Handler }

func (f injectedFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return f.next.Enabled(ctx, l)
}

func (f injectedFilter) Handle(ctx context.Context, r slog.Record) error {
	injected := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" {
			s := a.Value.String()
			injected = strings.Contains(s, errInjected.Error()) || strings.Contains(s, errRedeliver.Error())
			return false
		}
		return true
	})
	if injected {
		return nil
	}
	return f.next.Handle(ctx, r)
}

func (f injectedFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return injectedFilter{f.next.WithAttrs(attrs)}
}

func (f injectedFilter) WithGroup(name string) slog.Handler {
	return injectedFilter{f.next.WithGroup(name)}
}
