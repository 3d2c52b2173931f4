package histories

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The stream model: each stream is a register holding its list of event IDs, in version order. Its operations are
//
//	append(expected, events) -> ok(version) | conflict | fail | info
//	load -> (version, events)
//
// An appended OK took effect at one instant between its invocation and completion: the stream was at the expected
// version (unless the append expected any version), and is now at the returned version, holding its events. A
// conflict took no effect, and a plain one (no Reason: a failed version check) of an exact expectation saw another
// version; a conflict with a Reason (a serialization failure, a deadlock), a conflict of an append that expected
// any version (the store gives up when concurrent appends keep winning: at once in AppendWith, whose transaction
// cannot retry, after 20 tries elsewhere) and every other failure took no effect whatever the version.
// An Info append is possibly applied (as Jepsen treats an indeterminate operation): at any instant after its
// invocation it either took effect, if the stream was at its expected version then, or it never did. A load saw,
// at one instant between invocation and completion, exactly the stream's events. Failed and indeterminate loads
// are left out: they observed nothing.

// AnyVersion is the Expected of an append that accepts the stream at any version.
const AnyVersion int64 = -1

// AppendInput is the input of an append.
type AppendInput struct {
	// Expected is the version the stream must be at, or AnyVersion.
	Expected int64
	// Events are the IDs of the appended events, in order.
	Events []string
}

func (a AppendInput) String() string {
	exp := fmt.Sprint(a.Expected)
	if a.Expected == AnyVersion {
		exp = "any"
	}
	return fmt.Sprintf("(expected %s, %s)", exp, shortIDs(a.Events))
}

// AppendOutput is the output of an append: its new version when OK; Conflict (with the store's Reason, if it gave
// one) when it failed its version check.
type AppendOutput struct {
	Version  int64
	Conflict bool
	Reason   string
	// Events, when not nil, are the IDs of the records an OK append returned; they must be the input's.
	Events []string
}

func (a AppendOutput) String() string {
	if a.Conflict {
		if a.Reason != "" {
			return "conflict (" + a.Reason + ")"
		}
		return "conflict"
	}
	if a.Events != nil {
		return fmt.Sprintf("version %d %s", a.Version, shortIDs(a.Events))
	}
	return fmt.Sprintf("version %d", a.Version)
}

// LoadOutput is what a load saw: the stream's version and its events' IDs in version order (version 0 and none for
// a stream that does not exist).
type LoadOutput struct {
	Version int64
	Events  []string
}

func (l LoadOutput) String() string {
	return fmt.Sprintf("version %d %s", l.Version, shortIDs(l.Events))
}

func shortIDs(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = shortID(id)
	}
	return "[" + strings.Join(out, " ") + "]"
}

// shortID keeps the last 8 characters of a long ID (a UUIDv7's random tail), for reading.
func shortID(id string) string {
	if len(id) > 12 {
		return id[len(id)-8:]
	}
	return id
}

// streamState is a stream's event IDs joined by spaces (comparable with ==); its version is their count.
type streamState struct {
	ids     string
	version int64
}

func (s streamState) with(ids []string) streamState {
	out := s
	for _, id := range ids {
		if out.ids != "" {
			out.ids += " "
		}
		out.ids += id
	}
	out.version += int64(len(ids))
	return out
}

// stepInput pairs an operation's kind with its input for the model.
type stepInput struct {
	kind    string
	outcome Outcome
	input   any
}

// streamModel is the porcupine model of one stream.
func streamModel() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Init: func() []any { return []any{streamState{}} },
		Step: func(state, input, output any) []any {
			s := state.(streamState)
			in := input.(stepInput)
			switch in.kind {
			case KindLoad:
				out := output.(LoadOutput)
				if out.Version == s.version && strings.Join(out.Events, " ") == s.ids {
					return []any{s}
				}
				return nil
			case KindAppend:
				a := in.input.(AppendInput)
				fits := a.Expected == AnyVersion || a.Expected == s.version
				switch in.outcome {
				case OK:
					out := output.(AppendOutput)
					next := s.with(a.Events)
					if fits && out.Version == next.version && (out.Events == nil || slices.Equal(out.Events, a.Events)) {
						return []any{next}
					}
					return nil
				case Fail:
					if out, ok := output.(AppendOutput); ok && out.Conflict && out.Reason == "" && fits &&
						a.Expected != AnyVersion {
						return nil // a failed version check, while the version fitted
					}
					return []any{s}
				default: // Info, Pending: possibly applied
					if fits {
						return []any{s, s.with(a.Events)}
					}
					return []any{s}
				}
			}
			return []any{s}
		},
		Equal: func(a, b any) bool { return a.(streamState) == b.(streamState) },
		DescribeOperation: func(input, output any) string {
			in := input.(stepInput)
			out := in.outcome.String()
			if output != nil {
				out = fmt.Sprintf("%s %v", in.outcome, output)
			}
			if in.kind == KindLoad {
				return "load -> " + fmt.Sprint(output)
			}
			return fmt.Sprintf("append%v -> %s", in.input, out)
		},
		DescribeState: func(state any) string {
			s := state.(streamState)
			return fmt.Sprintf("version %d %s", s.version, shortIDs(strings.Fields(s.ids)))
		},
	}
	return m.ToModel()
}

// StreamCheckOptions configure CheckStreams.
type StreamCheckOptions struct {
	// Seed is the run's seed, printed with a failure. Default 0.
	Seed uint64
	// VisualizationDir receives an HTML rendering of a failing stream's minimal window. Default os.TempDir().
	VisualizationDir string
	// Timeout bounds the check of one stream; a stream not decided in time is reported as unknown. Default 1m.
	Timeout time.Duration
}

// StreamResult is the verdict on one stream.
type StreamResult struct {
	Stream string
	// Ops is how many of the stream's operations were checked.
	Ops int
	// Result is porcupine's verdict: Ok, Illegal or Unknown (timed out).
	Result porcupine.CheckResult
	// Window is, for an Illegal stream, the shortest prefix (by invocation) of its checked operations that is
	// still not linearizable: the anomaly and what led to it.
	Window []Op
	// Visualization is the path of the window's HTML rendering (porcupine's), for an Illegal stream.
	Visualization string
	// HistoryFile is the path of a text file listing every checked operation of an Illegal stream.
	HistoryFile string
}

// StreamReport is the verdict on every stream of a history.
type StreamReport struct {
	Seed    uint64
	Streams []StreamResult
}

// Err returns nil when every stream is linearizable, and otherwise an error naming the seed, each failing stream,
// its minimal window and the path of its rendering.
func (r StreamReport) Err() error {
	var b strings.Builder
	for _, s := range r.Streams {
		switch s.Result {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			fmt.Fprintf(&b, "stream %s: not decided in time (%d operations)\n", s.Stream, s.Ops)
			continue
		}
		fmt.Fprintf(&b, "stream %s is not linearizable (%d operations); the shortest failing prefix, %d operations:\n",
			s.Stream, s.Ops, len(s.Window))
		for _, o := range s.Window {
			fmt.Fprintf(&b, "  %s\n", o)
		}
		if s.Visualization != "" {
			fmt.Fprintf(&b, "  rendered: %s\n", s.Visualization)
		}
		if s.HistoryFile != "" {
			fmt.Fprintf(&b, "  the stream's whole history: %s\n", s.HistoryFile)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return fmt.Errorf("histories: seed %d:\n%s", r.Seed, b.String())
}

// CheckStreams checks that the appends and loads of h (KindAppend, KindLoad) are linearizable, stream by stream
// (Op.Key), under the stream model above. Other kinds are ignored.
func CheckStreams(h []Op, opts StreamCheckOptions) (StreamReport, error) {
	if opts.Timeout == 0 {
		opts.Timeout = time.Minute
	}
	if opts.VisualizationDir == "" {
		opts.VisualizationDir = os.TempDir()
	}
	byStream := map[string][]Op{}
	for _, o := range h {
		if !streamOp(o) {
			continue
		}
		byStream[o.Key] = append(byStream[o.Key], o)
	}
	keys := make([]string, 0, len(byStream))
	for k := range byStream {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rep := StreamReport{Seed: opts.Seed}
	model := streamModel()
	for _, k := range keys {
		ops := byStream[k]
		sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
		res := StreamResult{Stream: k, Ops: len(ops)}
		res.Result = porcupine.CheckOperationsTimeout(model, toPorcupine(ops), opts.Timeout)
		if res.Result == porcupine.Illegal {
			res.Window = minimalWindow(model, ops, opts.Timeout)
			_, info := porcupine.CheckOperationsVerbose(model, toPorcupine(res.Window), opts.Timeout)
			path := filepath.Join(opts.VisualizationDir, fmt.Sprintf("histories-seed%d-%s.html", opts.Seed,
				safeName(k)))
			if err := porcupine.VisualizePath(model, info, path); err != nil {
				return rep, fmt.Errorf("histories: render stream %s: %w", k, err)
			}
			res.Visualization = path
			var all strings.Builder
			for _, o := range ops {
				fmt.Fprintln(&all, o)
			}
			res.HistoryFile = strings.TrimSuffix(path, ".html") + ".txt"
			if err := os.WriteFile(res.HistoryFile, []byte(all.String()), 0o644); err != nil {
				return rep, fmt.Errorf("histories: write stream %s's history: %w", k, err)
			}
		}
		rep.Streams = append(rep.Streams, res)
	}
	return rep, nil
}

// streamOp reports whether o takes part in the stream check: appends, and loads that completed.
func streamOp(o Op) bool {
	switch o.Kind {
	case KindAppend:
		return true
	case KindLoad:
		return o.Outcome == OK
	}
	return false
}

// toPorcupine converts a stream's operations; one whose outcome is unknown never returns (its return is after
// every other operation's), so it may take effect at any time after its invocation, or never.
func toPorcupine(ops []Op) []porcupine.Operation {
	var end int64
	for _, o := range ops {
		if t := int64(max(o.Invoke, o.Complete)); t > end {
			end = t
		}
	}
	out := make([]porcupine.Operation, len(ops))
	for i, o := range ops {
		ret := int64(o.Complete)
		if o.Outcome == Info || o.Outcome == Pending {
			ret = end + 1
		}
		out[i] = porcupine.Operation{ClientId: o.Process, Input: stepInput{kind: o.Kind, outcome: o.Outcome,
			input: o.Input}, Call: int64(o.Invoke), Output: o.Output, Return: ret}
	}
	return out
}

// minimalWindow returns the shortest prefix of ops (sorted by invocation) that is not linearizable, found by
// bisection (ops itself is not).
func minimalWindow(model porcupine.Model, ops []Op, timeout time.Duration) []Op {
	lo, hi := 1, len(ops) // ops[:hi] is illegal; look for the smallest such hi
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(model, toPorcupine(ops[:mid]), timeout) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return ops[:hi]
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func safeName(s string) string { return unsafeChars.ReplaceAllString(s, "_") }
