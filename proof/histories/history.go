package histories

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Outcome is how an operation ended, as its client saw it.
type Outcome int

const (
	// Pending: invoked, not completed (the run ended first). Checkers treat it as Info.
	Pending Outcome = iota
	// OK: the operation took effect and its output is what the client was told.
	OK
	// Fail: the operation definitely took no effect (a conflict, an error the store reports as definite).
	Fail
	// Info: the client cannot know whether the operation took effect (eventstore.ErrCommitUnknown); checkers treat
	// it as possibly applied, at any time after its invocation.
	Info
)

func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case OK:
		return "ok"
	case Fail:
		return "fail"
	case Info:
		return "info"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Operation kinds recorded by the stream workload.
const (
	KindAppend = "append"
	KindLoad   = "load"
)

// Op is one recorded operation.
type Op struct {
	// Index is the operation's place in the history, in invocation order.
	Index int
	// Process is the client that ran it; a client runs one operation at a time.
	Process int
	// Kind names the operation (KindAppend, KindLoad...).
	Kind string
	// Key is what the operation touched (a stream); checkers partition by it.
	Key string
	// Input and Output are the operation's arguments and result (AppendInput, AppendOutput, LoadOutput...).
	Input, Output any
	// Outcome is how it ended.
	Outcome Outcome
	// Err is the error the client got, if any.
	Err string
	// Invoke and Complete are monotonic times since the recorder started; Complete is 0 while pending.
	Invoke, Complete time.Duration
}

// String renders the operation on one line.
func (o Op) String() string {
	s := fmt.Sprintf("#%d p%d %s %s", o.Index, o.Process, o.Kind, o.Key)
	if o.Input != nil {
		s += fmt.Sprintf(" %v", o.Input)
	}
	s += " -> " + o.Outcome.String()
	if o.Output != nil {
		s += fmt.Sprintf(" %v", o.Output)
	}
	if o.Err != "" {
		s += " (" + o.Err + ")"
	}
	end := "never"
	if o.Outcome != Pending {
		end = o.Complete.String()
	}
	return s + fmt.Sprintf(" [%s, %s]", o.Invoke, end)
}

// Recorder records a history: every operation's invocation and completion, with monotonic times. It is safe for
// concurrent use. The zero Recorder is not usable: use NewRecorder.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder returns an empty recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Invocation is an operation invoked and not yet completed. Complete it exactly once.
type Invocation struct {
	r *Recorder
	i int
}

// Invoke records that process invoked an operation of kind on key with input.
func (r *Recorder) Invoke(process int, kind, key string, input any) Invocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := len(r.ops)
	r.ops = append(r.ops, Op{Index: i, Process: process, Kind: kind, Key: key, Input: input,
		Invoke: time.Since(r.start)})
	return Invocation{r: r, i: i}
}

// invokeAt is Invoke for an operation another process invoked at wall-clock time at (a worker process reports
// its operations with the times it read; both processes read the same system clock).
func (r *Recorder) invokeAt(at time.Time, process int, kind, key string, input any) Invocation {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := len(r.ops)
	r.ops = append(r.ops, Op{Index: i, Process: process, Kind: kind, Key: key, Input: input,
		Invoke: max(0, at.Round(0).Sub(r.start.Round(0)))})
	return Invocation{r: r, i: i}
}

// OK records that the operation took effect with output.
func (inv Invocation) OK(output any) { inv.complete(OK, output, nil) }

// Fail records that the operation definitely took no effect; output may describe how (a conflict).
func (inv Invocation) Fail(output any, err error) { inv.complete(Fail, output, err) }

// Info records that the operation's effect is unknown.
func (inv Invocation) Info(err error) { inv.complete(Info, nil, err) }

func (inv Invocation) complete(o Outcome, output any, err error) {
	inv.completeAt(time.Time{}, o, output, err)
}

// completeAt completes the operation at wall-clock time at (now when zero), never before its invocation.
func (inv Invocation) completeAt(at time.Time, o Outcome, output any, err error) {
	inv.r.mu.Lock()
	defer inv.r.mu.Unlock()
	op := &inv.r.ops[inv.i]
	if op.Outcome != Pending {
		panic(fmt.Sprintf("histories: operation %d completed twice", inv.i)) // a bug in the workload, not input
	}
	op.Outcome, op.Output, op.Complete = o, output, time.Since(inv.r.start)
	if !at.IsZero() {
		op.Complete = max(op.Invoke, at.Round(0).Sub(inv.r.start.Round(0)))
	}
	if err != nil {
		op.Err = err.Error()
	}
}

// History returns a copy of the operations recorded so far, in invocation order.
func (r *Recorder) History() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Counts tallies a history's operations by kind and outcome ("append/ok" -> 12).
func Counts(h []Op) map[string]int {
	m := map[string]int{}
	for _, o := range h {
		m[o.Kind+"/"+o.Outcome.String()]++
	}
	return m
}

// FormatCounts renders Counts sorted by key on one line.
func FormatCounts(h []Op) string {
	m := Counts(h)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
