package console

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/stagehand-es/stagehand"
)

// Every input of a page is validated here before it reaches an operation: text is bounded, valid UTF-8 and free of
// control characters; tenants pass stagehand.ValidateTenant; numbers parse; cursors decode into their typed keys.
// Inputs reach the database only as arguments of the packages' operations, never as SQL text.

// maxParam bounds a text input.
const maxParam = 1024

// textParam checks a text input: at most max bytes of valid UTF-8 without control characters.
func textParam(name, s string, max int) (string, error) {
	if len(s) > max {
		return "", badRequest("%s is longer than %d bytes", name, max)
	}
	if !utf8.ValidString(s) {
		return "", badRequest("%s is not valid UTF-8", name)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return "", badRequest("%s holds a control character", name)
		}
	}
	return s, nil
}

// tenantParam checks a tenant input. In a tenant's console only that tenant is accepted (given or not); "" is
// stagehand.NoTenant in an estate-wide console.
func (c *Console) tenantParam(s string) (string, error) {
	if c.cfg.Tenant != nil {
		if s != "" && stagehand.NormalizeTenant(s) != *c.cfg.Tenant {
			return "", forbidden("this console is scoped to %s", c.scopeName())
		}
		return *c.cfg.Tenant, nil
	}
	if err := stagehand.ValidateTenant(s); err != nil {
		return "", badRequest("tenant: %v", err)
	}
	return stagehand.NormalizeTenant(s), nil
}

// intParam parses a non-negative integer input ("" is def).
func intParam(name, s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0, badRequest("%s must be a whole number, 0 or more", name)
	}
	return n, nil
}

// maxCursor bounds an encoded cursor.
const maxCursor = 8 << 10

// encodeCursor writes a page's keyset cursor: its key values, as URL-safe base64 of JSON.
func encodeCursor(v any) string {
	b, err := json.Marshal(v)
	if err != nil { // not expected: cursors are plain values
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeCursor reads a cursor into v, and checks its text values.
func decodeCursor(s string, v any) error {
	if len(s) > maxCursor {
		return badRequest("the page cursor is too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return badRequest("the page cursor is not valid")
	}
	if !utf8.Valid(b) {
		return badRequest("the page cursor is not valid")
	}
	if bytes.Contains(b, []byte(`\u0000`)) {
		return badRequest("the page cursor is not valid")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest("the page cursor is not valid")
	}
	return nil
}

// sortHidden orders hidden fields by name, then value, so forms are written the same way every time.
func sortHidden(fs []hiddenField) {
	slices.SortFunc(fs, func(a, b hiddenField) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Value, b.Value))
	})
}
