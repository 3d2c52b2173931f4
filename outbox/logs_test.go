package outbox_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
)

// logs captures what stagehand (through its *slog.Logger) and Watermill (through its LoggerAdapter) log, every
// level included, as text lines.
type logs struct {
	mu        sync.Mutex
	stagehand bytes.Buffer
	watermill bytes.Buffer
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (l *logs) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{&l.mu, &l.stagehand}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logs) watermillLogger() watermill.LoggerAdapter {
	return watermill.NewSlogLogger(slog.New(slog.NewTextHandler(lockedWriter{&l.mu, &l.watermill},
		&slog.HandlerOptions{Level: slog.LevelDebug - 4}))) // Watermill's Trace is below Debug
}

// lines returns the captured lines of stagehand's or Watermill's log that contain every one of substrings.
func (l *logs) lines(ofWatermill bool, substrings ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := &l.stagehand
	if ofWatermill {
		buf = &l.watermill
	}
	var out []string
	for line := range strings.SplitSeq(buf.String(), "\n") {
		if line == "" {
			continue
		}
		all := true
		for _, s := range substrings {
			all = all && strings.Contains(line, s)
		}
		if all {
			out = append(out, line)
		}
	}
	return out
}

// all returns every captured line, stagehand's first.
func (l *logs) all() []string { return append(l.lines(false), l.lines(true)...) }
