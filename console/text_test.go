package console

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// plain keeps ordinary text as it is and turns everything that would not show as itself into a visible escape:
// invalid UTF-8 bytes, control characters (newlines and tabs kept in multi-line text), and the invisible characters
// that reorder or hide text.
func TestPlainEscapesWhatDoesNotShow(t *testing.T) {
	for in, want := range map[string]string{
		"order-42 <b>&":          "order-42 <b>&", // markup is html/template's to escape
		"é ü 東京 🚚":               "é ü 東京 🚚",
		"a\x00b":                 `a\x00b`,
		"bell\a":                 `bell\x07`,
		"\xff\xfeok":             `\xff\xfeok`,
		"evil\u202egnp.exe":      `evil\u202egnp.exe`,
		"zero\u200bwidth\ufeff":  `zero\u200bwidth\ufeff`,
		"line\u2028sep":          `line\u2028sep`,
		"two\nlines\tand tab":    `two\x0alines\x09and tab`,
		"c1 control \u0085 here": `c1 control \x85 here`,
	} {
		if got := plain(in, false); got != want {
			t.Errorf("plain(%q) = %q, want %q", in, got, want)
		}
	}
	if got := plain("two\nlines\tand\rtab", true); got != "two\nlines\tand\\x0dtab" {
		t.Errorf("multi-line: %q", got)
	}
}

// clip cuts at a character boundary, counts what it left out, and keeps the whole (bounded) text for a tooltip.
func TestClip(t *testing.T) {
	c := clip("short", 10)
	if c.Text != "short" || c.Omitted != 0 || c.Full != "" {
		t.Errorf("%+v", c)
	}
	c = clip("ééééé", 5) // 10 bytes: a cut at 5 would split the third é
	if c.Text != "éé" || c.Omitted != 6 || c.Full != "ééééé" {
		t.Errorf("%+v", c)
	}
	c = clip(strings.Repeat("x", 10000), 100)
	if len(c.Text) != 100 || c.Omitted != 9900 || len(c.Full) != 4096 {
		t.Errorf("len %d, omitted %d, full %d", len(c.Text), c.Omitted, len(c.Full))
	}
	c = clip("\xff\xff\xff\xff\xffabc", 3)
	if c.Text != `\xff\xff\xff` || c.Omitted != 5 {
		t.Errorf("%+v", c)
	}
}

// showPayload indents whole JSON, shows cut or non-JSON payloads as text with the count of what was left out, and
// shows invalid UTF-8 as escapes; a payload the database cut in the middle of a character loses that character.
func TestShowPayload(t *testing.T) {
	p := showPayload([]byte(`{"a":[1,2],"b":"<script>"}`), 26, 1000)
	if p.Kind != "json" || !strings.Contains(p.Text, "\n  \"a\": [") || p.Omitted != 0 {
		t.Errorf("%+v", p)
	}
	big := []byte(`{"items":"` + strings.Repeat("y", 5000) + `"}`)
	p = showPayload(big, len(big), 1024)
	if p.Kind != "text" || p.Shown != 1024 || p.Omitted != len(big)-1024 || p.Size != len(big) {
		t.Errorf("kind %s shown %d omitted %d size %d", p.Kind, p.Shown, p.Omitted, p.Size)
	}
	p = showPayload([]byte("\x00\x01binary\xff"), 9, 1000)
	if p.Kind != "binary" || p.Text != `\x00\x01binary\xff` {
		t.Errorf("%+v", p)
	}
	cut := []byte("ab" + "é"[:1]) // the database's substring split é
	p = showPayload(cut, 10, 1000)
	if p.Kind != "text" || p.Text != "ab" || p.Shown != 2 || p.Omitted != 8 {
		t.Errorf("%+v", p)
	}
	p = showPayload(nil, 0, 10)
	if !p.Empty {
		t.Errorf("%+v", p)
	}
	for _, in := range [][]byte{[]byte("x\u202ey"), []byte("{\"k\":\"\u202e\"}")} {
		if p := showPayload(in, len(in), 100); strings.ContainsRune(p.Text, '\u202e') || !utf8.ValidString(p.Text) {
			t.Errorf("%q shown as %q", in, p.Text)
		}
	}
}

func TestNumbersDurationsAndAges(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := number(n); got != want {
			t.Errorf("number(%d) = %q", n, got)
		}
	}
	for d, want := range map[time.Duration]string{0: "0s", 850 * time.Millisecond: "850ms", 12400 * time.Millisecond: "12s",
		3*time.Minute + 12*time.Second: "3m12s", 2*time.Hour + 5*time.Minute: "2h05m", 76 * time.Hour: "3d04h",
		1500 * time.Millisecond: "1.5s", -2 * time.Second: "-2.0s"} {
		if got := duration(d); got != want {
			t.Errorf("duration(%s) = %q, want %q", d, got, want)
		}
	}
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "90m": 90 * time.Minute, " 1h30m ": 90 * time.Minute} {
		if got, err := parseAge(in); err != nil || got != want {
			t.Errorf("parseAge(%q) = %s, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "0s", "-1h", "7x", "99999d", "1e9h", "d", "0d"} {
		if _, err := parseAge(bad); err == nil {
			t.Errorf("parseAge(%q) accepted", bad)
		}
	}
}

// A chart's geometry: x from the start of the history to now, y from 0 to a rounded top; a gap in the samples or
// an unknown value breaks the line.
func TestMakeChart(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 10, 0, 0, time.UTC)
	samples := []sample{
		{At: now.Add(-10 * time.Minute), Published: 3},
		{At: now.Add(-9 * time.Minute), Published: unknown},
		{At: now.Add(-5 * time.Minute), Published: 7},
		{At: now.Add(-4 * time.Minute), Published: 7.5},
		{At: now, Published: 2},
	}
	ch := makeChart("published", samples, now, 10*time.Minute,
		series{"published", "s3", func(s sample) float64 { return s.Published }, rateText})
	if ch.Max != "10" || ch.Now != "2.0" || ch.Empty != "" {
		t.Errorf("%+v", ch)
	}
	paths := ch.Lines[0].Paths
	// The unknown value breaks the line after the first sample; four minutes without a sample (more than a tenth
	// of the history) break it before the last.
	if len(paths) != 3 || paths[0] != "0.0,56.0 0.0,56.0" || paths[1] != "150.0,24.0 180.0,20.0" ||
		paths[2] != "300.0,64.0 300.0,64.0" {
		t.Errorf("paths %q", paths)
	}
	if e := makeChart("x", nil, now, time.Minute, series{"x", "s1", func(s sample) float64 { return 0 }, rateText}); e.Empty == "" {
		t.Error("an empty chart says so")
	}
	for v, want := range map[float64]float64{0: 1, 0.3: 1, 1.5: 2, 3: 5, 7: 10, 12: 20, 480: 500, 501: 1000} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v", v, got)
		}
	}
}
