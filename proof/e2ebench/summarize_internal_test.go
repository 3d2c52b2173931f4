package e2ebench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPacedOrderAlternatesWhichPathGoesFirst(t *testing.T) {
	t.Parallel()
	a, b := &path{name: "a"}, &path{name: "b"}
	var names []string
	for _, p := range pacedOrder(a, b, 4) {
		names = append(names, p.name)
	}
	require.Equal(t, []string{"a", "b", "b", "a", "a", "b", "b", "a"}, names)
	require.Equal(t, []*path{a, b}, pacedOrder(a, b, 1))
}

// Two slices of one path measured as one round: the percentiles pool the messages of both, rates and CPU cover
// both slices' time, the lag is the longer one, and each slice's own p99 is kept in order.
func TestSummarizePoolsTheSlicesOfAPath(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	t0 := time.Unix(1000, 0)
	quiet := slice{produced: 100, handled: 100, start: t0, stopped: t0.Add(time.Second),
		last: t0.Add(1100 * time.Millisecond), busy: 0.2, goCPU: 50 * time.Millisecond, steal: 0,
		relay: RelayWork{Claims: 10, ClaimedRows: 100, Marks: 20, MarkedRows: 100}}
	for i := range 100 {
		quiet.latency = append(quiet.latency, time.Duration(1+i%5)*time.Millisecond)
		quiet.appended = append(quiet.appended, time.Millisecond)
	}
	busy := slice{produced: 100, handled: 100, start: t0.Add(5 * time.Second), stopped: t0.Add(6 * time.Second),
		last: t0.Add(6500 * time.Millisecond), busy: 0.6, goCPU: 150 * time.Millisecond, steal: 0.5,
		relay: RelayWork{Claims: 5, EmptyClaims: 1, ClaimedRows: 100, Marks: 10, MarkedRows: 100}}
	for i := range 100 {
		busy.latency = append(busy.latency, time.Duration(10+i)*time.Millisecond) // 10 .. 109 ms
		busy.appended = append(busy.appended, 2*time.Millisecond)
	}
	rd := summarize("stagehand", 100, []slice{quiet, busy})

	require.Equal(t, 200, rd.Produced)
	require.Equal(t, 200, rd.Handled)
	require.InDelta(t, 100.0, rd.ProduceRate, 1e-9)  // 200 messages over 2 s of producing
	require.InDelta(t, 200/2.6, rd.Throughput, 1e-9) // over 1.1 s + 1.5 s to the last handled
	require.Equal(t, 500*time.Millisecond, rd.Lag)   // the longer of 100 and 500 ms
	require.InDelta(t, 0.5*1.5/2.6, rd.Steal, 1e-9)  // weighted by each slice's length
	require.Equal(t, 4*time.Millisecond, rd.CPU)     // 0.8 s over 200 messages
	require.Equal(t, time.Millisecond, rd.GoCPU)     // 200 ms over 200 messages
	require.Equal(t, 5*time.Millisecond, rd.P50)     // rank 100 of the pooled 200: the quiet slice's largest
	require.Equal(t, 107*time.Millisecond, rd.P99)   // rank 198: the busy slice's 98th
	require.Equal(t, 109*time.Millisecond, rd.Max)
	require.Equal(t, time.Millisecond, rd.AppendP50)   // rank 100: the quiet slice's
	require.Equal(t, 2*time.Millisecond, rd.AppendP99) // the busy slice's
	require.Equal(t, ms(5, 108), rd.SliceP99)
	require.Equal(t, RelayWork{Claims: 15, EmptyClaims: 1, ClaimedRows: 200, Marks: 30, MarkedRows: 200}, rd.Relay)

	// One slice: the round as it always was.
	one := summarize("forwarder", 0, []slice{quiet})
	require.InDelta(t, 100/1.1, one.Throughput, 1e-9)
	require.Equal(t, 100*time.Millisecond, one.Lag)
	require.Equal(t, 5*time.Millisecond, one.P99)
	require.Equal(t, ms(5), one.SliceP99)

	// CPU or steal unknown in any slice: unknown for the round.
	unknown := busy
	unknown.busy, unknown.steal = -1, -1
	rd = summarize("stagehand", 100, []slice{quiet, unknown})
	require.Zero(t, rd.CPU)
	require.Equal(t, -1.0, rd.Steal)
}
