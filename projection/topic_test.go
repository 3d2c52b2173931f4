package projection_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/projection"
)

// A tenant holding the topic's separators stays one tenant: a subscriber for tenant "evil,B" must never receive
// tenant B's events (the unescaped encoding split it into "evil" and "B").
func TestTopicEncodingIsUnambiguous(t *testing.T) {
	t.Parallel()
	for _, f := range []projection.Filter{
		{Tenants: []string{"evil,B"}},
		{Tenants: []string{"a;streams:x", "b%2C", " padded ", "€,€", "\u2003em"}, EventTypes: []string{"\xffraw"}},
		{EventTypes: []string{"e,1", "e;2"}, StreamTypes: []string{"s:1"}, Tenants: []string{"%"}},
	} {
		topic := projection.Topic(f)
		got, err := projection.ParseTopic(topic)
		require.NoError(t, err, topic)
		require.Equal(t, f, got, topic)
	}
	require.Equal(t, "tenants:evil%2CB", projection.Topic(projection.Filter{Tenants: []string{"evil,B"}}))
	got, err := projection.ParseTopic("tenants:evil%2CB")
	require.NoError(t, err)
	require.Equal(t, []string{"evil,B"}, got.Tenants)

	for _, bad := range []string{"tenants:50%", "tenants:a%zz", "tenants:a%2", "tenants:a%00b",
		"tenants:" + strings.Repeat("x", stagehand.MaxTenantLen+1)} {
		_, err := projection.ParseTopic(bad)
		require.ErrorIs(t, err, projection.ErrInvalidConfig, bad)
	}
	_, err = projection.ParseTopic("tenants:a%00b")
	require.ErrorIs(t, err, stagehand.ErrInvalidTenant)
}

// FuzzParseTopic: no topic panics; every topic that parses renders back (Topic) to one that parses to the same
// filter.
func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"*", "", "events:a,b", "tenants:evil%2CB", "tenants:evil,B", "streams:s; events:e",
		"tenants:a%00b", "tenants:%", "kinds:a", "events:a;;", "tenants:\u20ac%2C%3B"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, topic string) {
		got, err := projection.ParseTopic(topic)
		if err != nil {
			require.ErrorIs(t, err, projection.ErrInvalidConfig)
			return
		}
		again, err := projection.ParseTopic(projection.Topic(got))
		require.NoError(t, err)
		require.Equal(t, got, again)
	})
}
