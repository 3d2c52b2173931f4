package names

import "testing"

// Stored names the first byte that PostgreSQL cannot store, whether the string is otherwise plain ASCII or not.
func TestStoredNamesTheFirstUnstorableByte(t *testing.T) {
	for s, want := range map[string]string{
		"":                          "",
		"order-7":                   "",
		"café ☕ 注文":                 "",
		"order\x00-7":               "has a NUL byte at byte 5",
		"café\x00":                  "has a NUL byte at byte 5",
		"ord\xffer":                 "has invalid UTF-8 at byte 3",
		"caf\xc3":                   "has invalid UTF-8 at byte 3",
		"\xed\xa0\x80 surrogate":    "has invalid UTF-8 at byte 0",
		"ok\x00then\xff":            "has a NUL byte at byte 2",
		"ok\xffthen\x00":            "has invalid UTF-8 at byte 2",
		"long ascii run, then \x00": "has a NUL byte at byte 21",
	} {
		if got := Stored(s); got != want {
			t.Errorf("Stored(%q) = %q, want %q", s, got, want)
		}
	}
}
