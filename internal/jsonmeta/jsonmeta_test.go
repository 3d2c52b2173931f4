package jsonmeta_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand/internal/jsonmeta"
)

func TestDecodeRendersNonStringValuesAsJSONText(t *testing.T) {
	t.Parallel()
	m, err := jsonmeta.Decode([]byte(`{"retries": 1, "ok": true, "n": null, "a": {"b": [1, 2]}, "s": "x\u00e9"}`))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"retries": "1", "ok": "true", "n": "null", "a": `{"b":[1,2]}`, "s": "xé"}, m)
	for _, empty := range []string{"", " ", "null", "{}", "{ }"} {
		m, err := jsonmeta.Decode([]byte(empty))
		require.NoError(t, err, empty)
		require.Empty(t, m, empty)
	}
	for _, bad := range []string{`[1]`, `"s"`, `12`, `true`} {
		_, err := jsonmeta.Decode([]byte(bad))
		require.ErrorIs(t, err, jsonmeta.ErrNotObject, bad)
	}
	_, err = jsonmeta.Decode([]byte(`{"a":`))
	require.Error(t, err)
}

func TestMapKeepsANonObjectUnderInvalidKey(t *testing.T) {
	t.Parallel()
	var m jsonmeta.Map
	require.NoError(t, json.Unmarshal([]byte(`[1, 2]`), &m))
	require.Equal(t, jsonmeta.Map{jsonmeta.InvalidKey: "[1, 2]"}, m)
	require.NoError(t, json.Unmarshal([]byte(`{"retries": 1}`), &m))
	require.Equal(t, jsonmeta.Map{"retries": "1"}, m)
}

// FuzzDecode: no input panics; whatever decodes re-encodes and decodes to the same metadata (string values only).
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"retries":1}`, `{"a":"b"}`, `[1]`, `null`, `{"a":{"b":[1,null,"\u0000"]}}`,
		`{"\u20ac":"\u20ac"}`, `"x"`, `{`, `{"a":1e999}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := jsonmeta.Decode(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(m)
		require.NoError(t, err)
		m2, err := jsonmeta.Decode(again)
		require.NoError(t, err)
		require.Equal(t, len(m), len(m2))
		if json.Valid(b) {
			var mm jsonmeta.Map
			require.NoError(t, json.Unmarshal(b, &mm))
		}
	})
}
