// Package jsonmeta reads the string-to-string metadata stagehand stores as jsonb (events, outbox rows, dead
// letters), tolerantly: a row written by another tool with a value that is not a string must not make a reader
// fail on every page that contains it.
//
// The rule, the same everywhere: a string value is read as it is; any other JSON value (a number, a boolean, null,
// an array, an object) is read as its compact JSON text, so {"retries": 1} reads as "retries" → "1" and
// {"a": {"b": [1, 2]}} as "a" → `{"b":[1,2]}`. An empty column, SQL NULL and JSON null read as no metadata. A column
// that is not a JSON object at all cannot be read as metadata: Decode reports it, and Map keeps it under InvalidKey.
package jsonmeta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"
	"unsafe"
)

// InvalidKey is the key under which Map keeps the JSON text of a stored metadata value that is not a JSON object.
const InvalidKey = "stagehand-invalid-metadata"

// ErrNotObject: the stored metadata is JSON but not an object.
var ErrNotObject = errors.New("metadata is not a JSON object")

// Decode reads stored metadata by the package's rule. It returns nil for empty metadata.
func Decode(b []byte) (map[string]string, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" || string(b) == "{}" {
		return nil, nil
	}
	if b[0] != '{' {
		if !json.Valid(b) {
			return nil, fmt.Errorf("metadata is not valid JSON")
		}
		return nil, fmt.Errorf("%w: %s", ErrNotObject, truncate(b))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("metadata is not valid JSON: %w", err)
	}
	if len(raw) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		if len(v) > 0 && v[0] == '"' {
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return nil, fmt.Errorf("metadata value %q: %w", k, err)
			}
			out[k] = s
			continue
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			return nil, fmt.Errorf("metadata value %q: %w", k, err)
		}
		out[k] = buf.String()
	}
	return out, nil
}

// Map is metadata that scans from a jsonb column by the package's rule and never fails on valid JSON: a value that
// is not an object is kept, as its JSON text, under InvalidKey, so a reader delivers the row instead of stalling
// on it.
type Map map[string]string

// UnmarshalJSON implements json.Unmarshaler (pgx scans jsonb through it).
func (m *Map) UnmarshalJSON(b []byte) error {
	d, err := Decode(b)
	if errors.Is(err, ErrNotObject) {
		*m = Map{InvalidKey: string(bytes.TrimSpace(b))}
		return nil
	}
	if err != nil {
		return err
	}
	*m = d
	return nil
}

func truncate(b []byte) string {
	const n = 64
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// Encode writes metadata as a JSON object, byte for byte as encoding/json.Marshal writes a map[string]string (keys
// sorted, HTML characters and U+2028/U+2029 escaped, invalid UTF-8 replaced by U+FFFD), without reflection: it runs
// on every save and every staged message. Empty metadata is "{}".
func Encode(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	var small [16]string
	keys := small[:0]
	size := 2
	for k, v := range m {
		keys = append(keys, k)
		size += len(k) + len(v) + 6
	}
	slices.Sort(keys)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	b = append(b, '}')
	return unsafe.String(unsafe.SliceData(b), len(b))
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string, escaped as encoding/json escapes it.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
