package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/stagehandtest"
)

func TestMain(m *testing.M) { stagehandtest.Main(m) }

// The example runs to completion and its printed counts are right.
func TestBankExample(t *testing.T) {
	var out bytes.Buffer
	schema := stagehandtest.SchemaName(t)
	err := run(context.Background(), &out, config{databaseURL: stagehandtest.URL(t), schema: schema,
		withdrawers: 16})
	require.NoError(t, err, out.String())
	t.Log(out.String())

	m := regexp.MustCompile(`16 concurrent withdrawals of 10: (\d+) succeeded, (\d+) refused`).
		FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	require.Equal(t, "10", m[1], "exactly ten withdrawals of 10 fit in 100")
	require.Equal(t, "6", m[2])
	require.Contains(t, out.String(), "acct-ann: balance 0 at version 12")
	n := regexp.MustCompile(`global log: (\d+) events`).FindStringSubmatch(out.String())
	require.NotNil(t, n)
	got, _ := strconv.Atoi(n[1])
	require.Equal(t, 2+2+10, got, "2 opens, 2 deposits, 10 withdrawals")
}
