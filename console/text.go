package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// What the pages show of stored data is never trusted: payloads, metadata, errors, IDs and names are written by
// producers, consumers and handlers, any of which may be hostile or broken. Everything goes through html/template
// (which escapes it for its context) after the functions here have made it plain text: invalid UTF-8 becomes \xNN
// escapes, control characters and the invisible characters that reorder or hide text (bidirectional overrides,
// zero-width characters) become \uNNNN escapes, and anything long is cut with a visible marker of what was left
// out. No page ever marks stored data as safe HTML.

// plain returns s as displayable text: valid UTF-8, no control character (but newlines and tabs when multiline),
// no invisible formatting character; each one replaced by an escape that shows what it was.
func plain(s string, multiline bool) string {
	clean := true
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || hidden(r, multiline) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case hidden(r, multiline):
			if r <= 0xff {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// hidden reports a character that would not show as itself: a control character, or a format character (the
// bidirectional overrides and isolates that reorder text, zero-width spaces and joiners, the byte order mark).
func hidden(r rune, multiline bool) bool {
	if multiline && (r == '\n' || r == '\t') {
		return false
	}
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}

// clipped is text cut for display: Text is what is shown, Omitted how many bytes of the original were left out.
type clipped struct {
	Text    string
	Omitted int
	// Full is the whole text (made plain, and itself bounded), for a tooltip; empty when nothing was cut.
	Full string
}

// clip returns at most n bytes of s (cut at a character boundary) as plain single-line text.
func clip(s string, n int) clipped {
	c := clipped{}
	cut := s
	if len(s) > n {
		cut = s[:boundary(s, n)]
		c.Omitted = len(s) - len(cut)
		full := s
		if len(full) > 4096 {
			full = full[:4096]
		}
		c.Full = plain(full, false)
	}
	c.Text = plain(cut, false)
	return c
}

// boundary moves a cut of s at n back to the start of the character it would split (at most 3 bytes back, so a
// run of stray continuation bytes is cut where asked).
func boundary(s string, n int) int {
	for i := 0; i < 3 && n > 0 && n < len(s) && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return n
}

// trimPartial drops a character cut short at the end of b (the first bytes of a longer text).
func trimPartial(b []byte) []byte {
	for i := 1; i <= 3 && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

// payload is a payload (or a long value) prepared for display.
type payload struct {
	// Kind is "json" (valid JSON, indented), "text" (valid UTF-8) or "binary" (invalid UTF-8, shown with escapes).
	Kind string
	Text string
	// Size is the stored size in bytes, Shown how many of them are shown; Omitted = Size - Shown.
	Size, Shown, Omitted int
	// Empty is true for an empty payload.
	Empty bool
}

// showPayload prepares b (the first bytes of a payload of size bytes) for display, showing at most limit bytes of
// it: indented when it is whole, valid JSON; as text otherwise.
func showPayload(b []byte, size, limit int) payload {
	size = max(size, len(b))
	p := payload{Size: size, Empty: size == 0}
	shown := b
	if len(shown) > limit {
		shown = shown[:limit]
	}
	if len(shown) == size && json.Valid(shown) {
		var out bytes.Buffer
		if err := json.Indent(&out, shown, "", "  "); err == nil && out.Len() <= 2*limit {
			p.Kind, p.Text, p.Shown = "json", plain(out.String(), true), size
			return p
		}
	}
	if len(shown) < size {
		shown = trimPartial(shown)
	}
	p.Kind = "text"
	if !utf8.Valid(shown) {
		p.Kind = "binary"
	}
	p.Text, p.Shown, p.Omitted = plain(string(shown), true), len(shown), size-len(shown)
	return p
}

// pair is a metadata entry prepared for display.
type pair struct {
	Key   clipped
	Value payload
}

// showMetadata prepares a metadata map for display, sorted by key, each key cut at 256 bytes and each value at
// limit bytes.
func showMetadata(m map[string]string, limit int) []pair {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]pair, 0, len(keys))
	for _, k := range keys {
		v := m[k]
		out = append(out, pair{Key: clip(k, 256), Value: showPayload([]byte(v), len(v), limit)})
	}
	return out
}

// number writes n with thousands separators.
func number(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// duration writes d for people: 850ms, 12.4s, 3m12s, 2h05m, 3d04h.
func duration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + duration(-d)
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return strconv.FormatInt(d.Microseconds(), 10) + "µs"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// parseAge reads an age filter: a Go duration ("90m", "1h30m") or a number of days ("7d"), positive and at most
// ten years.
func parseAge(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 1 || n > 3650 {
			return 0, fmt.Errorf("%q is not an age: use a number of days (7d) or a duration (90m, 36h)", clipForError(s))
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 || d > 3650*24*time.Hour {
			return 0, fmt.Errorf("%q is not an age: use a number of days (7d) or a duration (90m, 36h)", clipForError(s))
		}
	}
	return d, nil
}

// clipForError makes s short, plain text for an error message.
func clipForError(s string) string {
	c := clip(s, 64)
	if c.Omitted > 0 {
		return c.Text + "…"
	}
	return c.Text
}
