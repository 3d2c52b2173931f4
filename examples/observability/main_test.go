package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// The example exports stagehand's metrics to Prometheus and its spans to the writer: the scrape shows the
// counters of every stage with the right counts, and the trace output has the spans of save, relay and inbox.
func TestObservabilityExample(t *testing.T) {
	var out bytes.Buffer
	schema := stagehandtest.SchemaName(t)
	err := run(context.Background(), &out, config{databaseURL: stagehandtest.URL(t), schema: schema,
		listen: "127.0.0.1:0", orders: 5, traces: true})
	require.NoError(t, err, out.String())
	s := out.String()
	require.Contains(t, s, "saved, relayed and handled 5 orders")
	for _, series := range []string{
		`stagehand_events_appended_total{`,
		`stagehand_messages_staged_total{`,
		`stagehand_messages_published_total{`,
		`stagehand_inbox_messages_total{`,
		`stagehand_relay_claim_duration_seconds_count{`,
		`stagehand_outbox_pending{`,
	} {
		require.Contains(t, s, series, "the scrape has %s", series)
	}
	require.Regexp(t, `stagehand_messages_published_total\{[^}]*messaging_destination_name="orders"[^}]*\} 5`, s)
	require.Regexp(t, `stagehand_inbox_messages_total\{[^}]*stagehand_outcome="handled"[^}]*\} 5`, s)
	for _, span := range []string{"stagehand.save", "stagehand.relay.publish", "stagehand.inbox.handle"} {
		require.True(t, strings.Contains(s, `"Name":"`+span+`"`), "no %s span in the trace output", span)
	}
}
