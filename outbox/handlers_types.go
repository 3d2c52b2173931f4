package outbox

import "slices"

// Types returns the message types that have a handler registered with Handle, sorted. A service can compare them
// at start with the types its mappings produce (staging.CheckHandled), instead of finding an unhandled type as
// ErrUnknownMessageType dead letters.
func (hs *Handlers) Types() []string {
	out := make([]string, 0, len(hs.byType))
	for t := range hs.byType {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}
