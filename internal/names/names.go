// Package names checks the names and text values stagehand stores or turns into PostgreSQL identifiers, lease
// names and notification channels, so a bad one fails where it enters with a reason, never as a raw SQLSTATE or
// a silent truncation.
package names

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIdentifier is the longest name PostgreSQL keeps for an identifier, in bytes (NAMEDATALEN - 1): a longer one
// is cut silently, so two names sharing their first 63 bytes would name the same schema.
const MaxIdentifier = 63

// Identifier returns why name cannot be used as a configured identifier (a schema, a projection or worker name),
// or "" when it can: not empty, valid UTF-8, no NUL byte, at most MaxIdentifier bytes.
func Identifier(name string) string {
	switch {
	case name == "":
		return "must not be empty"
	case len(name) > MaxIdentifier:
		return fmt.Sprintf("is %d bytes long; PostgreSQL keeps at most %d bytes of a name", len(name), MaxIdentifier)
	case !utf8.ValidString(name):
		return "must be valid UTF-8"
	}
	for i := range len(name) {
		if name[i] == 0 {
			return "must not contain a NUL byte"
		}
	}
	return ""
}

// Schema returns why name cannot be used as a schema, or "" when it can: Identifier's rules, and not blank.
func Schema(name string) string {
	if name != "" && strings.TrimSpace(name) == "" {
		return "must not be blank"
	}
	return Identifier(name)
}

// Text returns why s cannot be stored as a name-like text value (a tenant, a stream ID, a type name, a topic), or
// "" when it can: PostgreSQL text holds only valid UTF-8 without NUL, and control characters are refused too, so
// names print and compare as they look.
func Text(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !validAt(s, i):
			return fmt.Sprintf("has invalid UTF-8 at byte %d", i)
		case r == 0:
			return fmt.Sprintf("has a NUL byte at byte %d", i)
		case unicode.IsControl(r):
			return fmt.Sprintf("has the control character %U at byte %d", r, i)
		}
	}
	return ""
}

// Stored returns why s cannot be stored in a PostgreSQL text column at all (invalid UTF-8 or a NUL byte), or "".
func Stored(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 { // the usual case, checked a word at a time
		return ""
	}
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !validAt(s, i):
			return fmt.Sprintf("has invalid UTF-8 at byte %d", i)
		case r == 0:
			return fmt.Sprintf("has a NUL byte at byte %d", i)
		}
	}
	return ""
}

func validAt(s string, i int) bool {
	r, size := utf8.DecodeRuneInString(s[i:])
	return r != utf8.RuneError || size > 1
}

// Cut shortens s to at most n bytes on a character boundary, marking the cut, for error messages.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
