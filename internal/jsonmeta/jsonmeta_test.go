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
	for _, bad := range []string{`[1]`, `"s"`, `12`, `true`, `42`, `[]`, `""`, `1`, `420`, `["x", 1]`, `false`} {
		_, err := jsonmeta.Decode([]byte(bad))
		require.ErrorIs(t, err, jsonmeta.ErrNotObject, bad)
		var m jsonmeta.Map
		require.NoError(t, json.Unmarshal([]byte(bad), &m), bad)
		require.Equal(t, jsonmeta.Map{jsonmeta.InvalidKey: bad}, m, bad)
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

// Encode writes what encoding/json writes for the same map, for every kind of character it escapes, and what it
// writes decodes back to the map (invalid UTF-8 aside, which both replace).
func FuzzEncodeMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{"", "plain", `quote " and \ back`, "<html> & </html>", "tab\tnew\nline\rcr\b\f",
		"\x00\x01\x1f", "line\u2028para\u2029", "invalid \xff\xfe utf-8", "é 日本 🎉", "\x7f"} {
		f.Add(s, s+"k")
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		for _, m := range []map[string]string{{k: v}, {k: v, v: k, "z": k + v}, nil} {
			want, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if len(m) == 0 {
				want = []byte("{}")
			}
			if got := jsonmeta.Encode(m); got != string(want) {
				t.Fatalf("Encode(%q) = %s, encoding/json writes %s", m, got, want)
			}
		}
	})
}
