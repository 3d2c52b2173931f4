package stagehand

import "errors"

// ErrPermanent is matched (errors.Is) by every error marked with Permanent.
var ErrPermanent = errors.New("stagehand: permanent failure")

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() []error      { return []error{e.err, ErrPermanent} }
func (e permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks err as a failure that retrying cannot fix (an undecodable payload, a message type nobody
// handles), so whoever retries gives up at once: the inbox dead-letters the message, a projection or a staging
// worker parks the event or stops at it (its OnFailure). The error still matches what err matches. Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err: err}
}
