package staging

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStrategyParsesAndPrints(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]Strategy{
		"auto": Auto, "AUTO": Auto, "transactional": Transactional, "Transactional": Transactional,
		"eventually-consistent": EventuallyConsistent, "EventuallyConsistent": EventuallyConsistent,
		"eventually_consistent": EventuallyConsistent, " deferred ": Deferred,
	} {
		got, err := ParseStrategy(text)
		require.NoError(t, err, text)
		require.Equal(t, want, got, text)
	}
	for _, s := range []Strategy{Auto, Transactional, EventuallyConsistent, Deferred} {
		back, err := ParseStrategy(s.String())
		require.NoError(t, err)
		require.Equal(t, s, back)
	}
	require.Equal(t, "eventually-consistent", EventuallyConsistent.String())

	_, err := ParseStrategy("eventual")
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, `"eventual"`)

	var cfg struct{ Strategy Strategy }
	require.NoError(t, json.Unmarshal([]byte(`{"Strategy":"deferred"}`), &cfg))
	require.Equal(t, Deferred, cfg.Strategy)
	out, err := json.Marshal(struct{ S Strategy }{Transactional})
	require.NoError(t, err)
	require.JSONEq(t, `{"S":"transactional"}`, string(out))
	require.Error(t, json.Unmarshal([]byte(`{"Strategy":"sometimes"}`), &cfg))
}
