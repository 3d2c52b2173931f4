package outbox

import (
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Error signatures group failures by cause: the same fault hit by different messages gives errors that differ only
// in their numbers, IDs and quoted values ("timeout after 31ms on order 123", "timeout after 7ms on order 9"). A
// signature keeps the error's type and its message with those replaced, so they group together.

// maxSignature bounds a signature's length in bytes (the text beyond it is cut).
const maxSignature = 300

// maxFailureText bounds the error text each entry of a failure history keeps, in bytes.
const maxFailureText = 1000

// genericErrorTypes are the types that say nothing about a cause: plain and wrapping errors of the standard
// library, and the Permanent marker. ErrorType looks past them.
var genericErrorTypes = map[string]bool{
	"*errors.errorString": true, "*fmt.wrapError": true, "*fmt.wrapErrors": true, "*errors.joinError": true,
	"stagehand.permanentError": true,
}

// ErrorType names err's cause by its Go type: the innermost error of its chain whose type is not a plain or
// wrapping error of the standard library (errors.New, fmt.Errorf, errors.Join) or the stagehand.Permanent marker,
// as fmt's %T prints it ("*net.OpError", "*pgconn.PgError"); "error" when there is none (a chain of plain errors,
// which its message tells apart). Where a chain branches (errors.Join, several %w), the first branch is followed.
// ErrorType(nil) is "".
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	typ := ""
	for depth := 0; err != nil && depth < 64; depth++ {
		if t := fmt.Sprintf("%T", err); !genericErrorTypes[t] {
			typ = t
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			errs := u.Unwrap()
			if len(errs) == 0 {
				err = nil
			} else {
				err = errs[0]
			}
		default:
			err = nil
		}
	}
	if typ == "" {
		typ = "error"
	}
	return typ
}

// The replacements of NormalizeError, in order: each sees the text the earlier ones left.
var (
	quotedText = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`|«[^»]*»")
	timestamp  = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?`)
	uuidText   = regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	hexPrefix  = regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b`)
	// ulidText is a ULID: 26 characters of Crockford's base32, the first at most 7.
	ulidText     = regexp.MustCompile(`\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b`)
	hexWord      = regexp.MustCompile(`(?i)\b[0-9a-f]{8,}\b`)
	durationText = regexp.MustCompile(`\b(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+\b`)
	numberText   = regexp.MustCompile(`\d+(?:[.,]\d+)*`)
	spaces       = regexp.MustCompile(`\s+`)
)

// NormalizeError returns an error message with what varies from one occurrence of a fault to the next replaced:
// quoted values ("…", '…', `…`) by "?" in their quotes, timestamps by <time>, UUIDs by <uuid>, ULIDs by <ulid>,
// hexadecimal values (0x… and words of eight or more hex digits with a digit and a letter) by <hex>, durations
// (31ms, 1m30s) by <duration>, and every other run of digits (with its decimal or thousands separators) by <n>.
// Runs of white space become one space; the result is cut to 300 bytes. Invalid UTF-8 is replaced first.
func NormalizeError(msg string) string {
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	msg = quotedText.ReplaceAllStringFunc(msg, func(q string) string {
		open, size := utf8.DecodeRuneInString(q)
		closing, _ := utf8.DecodeLastRuneInString(q[size:])
		if open == '«' {
			closing = '»'
		}
		return string(open) + "?" + string(closing)
	})
	msg = timestamp.ReplaceAllString(msg, "<time>")
	msg = uuidText.ReplaceAllString(msg, "<uuid>")
	msg = hexPrefix.ReplaceAllString(msg, "<hex>")
	msg = ulidText.ReplaceAllString(msg, "<ulid>")
	msg = hexWord.ReplaceAllStringFunc(msg, func(w string) string {
		if strings.ContainsAny(w, "0123456789") && strings.ContainsAny(w, "abcdefABCDEF") {
			return "<hex>"
		}
		return w // all digits (a number, below) or all letters (a word)
	})
	msg = durationText.ReplaceAllString(msg, "<duration>")
	msg = numberText.ReplaceAllString(msg, "<n>")
	msg = strings.TrimSpace(spaces.ReplaceAllString(msg, " "))
	return cutText(msg, maxSignature)
}

// ErrorSignature returns err's signature: its ErrorType and its NormalizeError'd message, as "type: message". Two
// errors of one fault have the same signature; the dead letters and the failure history record it, and
// Admin.DeadLetterGroups groups by it. ErrorSignature(nil) is "".
func ErrorSignature(err error) string {
	if err == nil {
		return ""
	}
	return signatureOf(ErrorType(err), err.Error())
}

func signatureOf(typ, msg string) string {
	return cutText(typ+": "+NormalizeError(msg), maxSignature)
}

// cutText cuts s to at most n bytes, at a rune boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// failureRecord is what the failure history and a dead letter record of a failed attempt.
type failureRecord struct {
	typ, signature, text string
}

func recordFailure(cause error) failureRecord {
	typ := ErrorType(cause)
	msg := strings.ToValidUTF8(cause.Error(), "\uFFFD")
	return failureRecord{typ: typ, signature: signatureOf(typ, msg), text: cutText(msg, maxFailureText)}
}

// failureHistory is how many failures of each (message, target) the history keeps.
const failureHistory = 10

// queueFailure queues the entry of a failed attempt in the failure history.
func (o *Outbox) queueFailure(b *pgx.Batch, source, id, target, tenant string, attempt int, rec failureRecord,
	now time.Time) {
	b.Queue(o.q.recordFailure, source, id, target, tenant, attempt, rec.typ, rec.signature, rec.text, now,
		failureHistory)
}
