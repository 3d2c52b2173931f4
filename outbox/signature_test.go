package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/outbox"
)

// The normaliser replaces what varies between occurrences of one fault, and nothing else.
func TestNormalizeError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"timeout after 31ms on order 123", "timeout after <duration> on order <n>"},
		{"timeout after 7ms on order 9", "timeout after <duration> on order <n>"},
		{"waited 1m30s, then 2.5s more", "waited <duration>, then <duration> more"},
		{"amount 1,250.75 exceeds 1000", "amount <n> exceeds <n>"},
		{"order-123 failed", "order-<n> failed"},
		{`no row for "acme-7" in 'orders'`, `no row for "?" in '?'`},
		{`key ` + "`a b`" + ` and «x»`, "key `?` and «?»"},
		{`escaped "say \"hi\"" stays one value`, `escaped "?" stays one value`},
		{"message 0190a6f2-3b1c-7d4e-9f00-0123456789ab rejected", "message <uuid> rejected"},
		{"message 0190A6F2-3B1C-7D4E-9F00-0123456789AB rejected", "message <uuid> rejected"},
		{"ulid 01HZX3K4M5N6P7Q8R9S0T1V2W3 rejected", "ulid <ulid> rejected"},
		{"pointer 0x1f3a at fault", "pointer <hex> at fault"},
		{"sha deadbeef12345678 mismatch", "sha <hex> mismatch"},
		{"the word deadbeefcafe is all letters", "the word deadbeefcafe is all letters"},
		{"at 2026-12-05T12:13:14.5Z and 2026-12-05 12:13", "at <time> and <time>"},
		{"at 2026-12-05T12:13:14+02:00 exactly", "at <time> exactly"},
		{"dial tcp 10.0.0.7:5432: connection refused", "dial tcp <n>:<n>: connection refused"},
		{"  spaced \n\t out  ", "spaced out"},
		{"HTTP 402 Payment Required", "HTTP <n> Payment Required"},
		{"", ""},
		{"no variable part at all", "no variable part at all"},
		{"bad encoding \xff here 12", "bad encoding \uFFFD here <n>"},
	} {
		require.Equal(t, tc.want, outbox.NormalizeError(tc.in), "%q", tc.in)
	}
	long := strings.Repeat("é", 400)
	got := outbox.NormalizeError(long)
	require.LessOrEqual(t, len(got), 300)
	require.True(t, strings.HasPrefix(long, got), "cut at a rune boundary")
}

type codeError struct{ code int }

func (e *codeError) Error() string { return fmt.Sprintf("code %d", e.code) }

// The type is the innermost error of the chain that is not a plain or wrapping one.
func TestErrorType(t *testing.T) {
	t.Parallel()
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("plain"), "error"},
		{fmt.Errorf("wrapped: %w", errors.New("plain")), "error"},
		{&codeError{7}, "*outbox_test.codeError"},
		{fmt.Errorf("publish: %w", &codeError{7}), "*outbox_test.codeError"},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", opErr)), "*net.OpError"},
		{stagehand.Permanent(fmt.Errorf("decode: %w", &codeError{1})), "*outbox_test.codeError"},
		{errors.Join(&codeError{1}, errors.New("other")), "*outbox_test.codeError"},
		{fmt.Errorf("read: %w", fs.ErrNotExist), "error"},
		{fmt.Errorf("ctx: %w", context.DeadlineExceeded), "context.deadlineExceededError"},
	} {
		require.Equal(t, tc.want, outbox.ErrorType(tc.err), "%v", tc.err)
	}
}

// Errors of one fault share a signature; errors of different faults or types do not.
func TestErrorSignature(t *testing.T) {
	t.Parallel()
	a := outbox.ErrorSignature(fmt.Errorf("timeout after 31ms on order 123"))
	b := outbox.ErrorSignature(fmt.Errorf("timeout after 7ms on order 9"))
	require.Equal(t, "error: timeout after <duration> on order <n>", a)
	require.Equal(t, a, b)
	require.NotEqual(t, a, outbox.ErrorSignature(fmt.Errorf("deadline after 7ms on order 9")))
	require.NotEqual(t, outbox.ErrorSignature(&codeError{1}), outbox.ErrorSignature(errors.New("code 1")),
		"the same text of another type is another cause")
	require.Equal(t, "*outbox_test.codeError: x: code <n>", outbox.ErrorSignature(fmt.Errorf("x: %w", &codeError{2})))
	require.Empty(t, outbox.ErrorSignature(nil))
}
