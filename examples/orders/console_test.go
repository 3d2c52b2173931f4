package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
)

// lockedBuffer is a bytes.Buffer safe to read while the example writes to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// With -console, the example prints the console's URL, serves its pages while it runs and after its summary,
// until interrupted; then it stops everything, the console included, and returns without an error.
func TestOrdersExampleServesTheConsole(t *testing.T) {
	stagehandtest.CheckLeaks(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, &out, config{databaseURL: stagehandtest.URL(t), schema: stagehandtest.SchemaName(t),
			natsStore: t.TempDir(), orders: 20, concurrency: 4, duplicates: 0.05, timeout: time.Minute,
			console: "127.0.0.1:0"})
	}()
	served := regexp.MustCompile(`console: (http://\S+)/ \(read-only`)
	get := func(path string) string {
		t.Helper()
		m := served.FindStringSubmatch(out.String())
		require.NotNil(t, m, out.String())
		resp, err := http.Get(m[1] + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		return string(body)
	}
	require.Eventually(t, func() bool { return served.MatchString(out.String()) }, time.Minute, 20*time.Millisecond)
	require.Contains(t, get("/"), "examples/orders")
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			t.Fatalf("the example ended (%v) before it was interrupted:\n%s", err, out.String())
		default:
		}
		return regexp.MustCompile(`press Ctrl-C to stop`).MatchString(out.String())
	}, 2*time.Minute, 50*time.Millisecond, "the summary is printed and the console keeps serving")
	require.Contains(t, get("/projections"), "order-board")
	require.Contains(t, get("/events"), "acme-shop")
	cancel()
	require.NoError(t, <-done)
}

func TestConsoleServesThisMachineOnly(t *testing.T) {
	for _, addr := range []string{":8080", "0.0.0.0:8080", "example.com:80", "8080"} {
		err := config{orders: 1, concurrency: 1, timeout: time.Second, schema: "s", console: addr}.validate()
		require.Error(t, err, addr)
	}
	require.NoError(t, config{orders: 1, concurrency: 1, timeout: time.Second, schema: "s",
		console: "127.0.0.1:0"}.validate())
}
