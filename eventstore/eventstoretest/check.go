package eventstoretest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// The suite's assertions, written here so that a store's own tests import nothing beyond the standard library and
// stagehand. Each stops the test (t.Fatalf) with what it expected, and the message given, if any.

func fail(t testing.TB, what string, msgAndArgs []any) {
	t.Helper()
	if len(msgAndArgs) > 0 {
		if format, ok := msgAndArgs[0].(string); ok {
			what += ": " + fmt.Sprintf(format, msgAndArgs[1:]...)
		} else {
			what += fmt.Sprint(append([]any{": "}, msgAndArgs...)...)
		}
	}
	t.Fatal(what)
}

func noError(t testing.TB, err error, msgAndArgs ...any) {
	t.Helper()
	if err != nil {
		fail(t, fmt.Sprintf("unexpected error: %v", err), msgAndArgs)
	}
}

func errorIs(t testing.TB, err, target error, msgAndArgs ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		fail(t, fmt.Sprintf("error %v does not match %v", err, target), msgAndArgs)
	}
}

func errorAs(t testing.TB, err error, target any, msgAndArgs ...any) {
	t.Helper()
	if !errors.As(err, target) {
		fail(t, fmt.Sprintf("error %v is not a %T", err, target), msgAndArgs)
	}
}

func errorContains(t testing.TB, err error, text string, msgAndArgs ...any) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), text) {
		fail(t, fmt.Sprintf("error %v does not contain %q", err, text), msgAndArgs)
	}
}

func equal(t testing.TB, want, got any, msgAndArgs ...any) {
	t.Helper()
	if !same(want, got) {
		fail(t, fmt.Sprintf("not equal:\nwant: %#v\ngot:  %#v", want, got), msgAndArgs)
	}
}

func notEqual(t testing.TB, unwanted, got any, msgAndArgs ...any) {
	t.Helper()
	if same(unwanted, got) {
		fail(t, fmt.Sprintf("should differ from %#v", unwanted), msgAndArgs)
	}
}

func same(a, b any) bool {
	if x, ok := a.([]byte); ok {
		if y, ok := b.([]byte); ok {
			return bytes.Equal(x, y)
		}
	}
	return reflect.DeepEqual(a, b)
}

func isTrue(t testing.TB, v bool, msgAndArgs ...any) {
	t.Helper()
	if !v {
		fail(t, "should be true", msgAndArgs)
	}
}

func isFalse(t testing.TB, v bool, msgAndArgs ...any) {
	t.Helper()
	if v {
		fail(t, "should be false", msgAndArgs)
	}
}

func contains(t testing.TB, s, sub string, msgAndArgs ...any) {
	t.Helper()
	if !strings.Contains(s, sub) {
		fail(t, fmt.Sprintf("%q does not contain %q", s, sub), msgAndArgs)
	}
}

func notContains(t testing.TB, s, sub string, msgAndArgs ...any) {
	t.Helper()
	if strings.Contains(s, sub) {
		fail(t, fmt.Sprintf("%q contains %q", s, sub), msgAndArgs)
	}
}

// length is len(v) for a slice, map or string.
func length(t testing.TB, v any, n int, msgAndArgs ...any) {
	t.Helper()
	if l := reflect.ValueOf(v).Len(); l != n {
		fail(t, fmt.Sprintf("has %d elements, want %d: %#v", l, n, v), msgAndArgs)
	}
}

func empty(t testing.TB, v any, msgAndArgs ...any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	if v != nil && rv.Len() != 0 {
		fail(t, fmt.Sprintf("should be empty: %#v", v), msgAndArgs)
	}
}

func greater[T cmp.Ordered](t testing.TB, a, b T, msgAndArgs ...any) {
	t.Helper()
	if !(a > b) {
		fail(t, fmt.Sprintf("%v is not greater than %v", a, b), msgAndArgs)
	}
}

func less[T cmp.Ordered](t testing.TB, a, b T, msgAndArgs ...any) {
	t.Helper()
	if !(a < b) {
		fail(t, fmt.Sprintf("%v is not less than %v", a, b), msgAndArgs)
	}
}

func positive[T cmp.Ordered](t testing.TB, v T, msgAndArgs ...any) {
	t.Helper()
	var zero T
	if !(v > zero) {
		fail(t, fmt.Sprintf("%v is not positive", v), msgAndArgs)
	}
}

func zero[T comparable](t testing.TB, v T, msgAndArgs ...any) {
	t.Helper()
	var z T
	if v != z {
		fail(t, fmt.Sprintf("%v is not zero", v), msgAndArgs)
	}
}

// jsonEq compares two JSON texts as values.
func jsonEq(t testing.TB, want, got string, msgAndArgs ...any) {
	t.Helper()
	var w, g any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		fail(t, fmt.Sprintf("expected value is not JSON: %v", err), msgAndArgs)
	}
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		fail(t, fmt.Sprintf("%q is not JSON: %v", got, err), msgAndArgs)
	}
	if !reflect.DeepEqual(w, g) {
		fail(t, fmt.Sprintf("JSON not equal:\nwant: %s\ngot:  %s", want, got), msgAndArgs)
	}
}
