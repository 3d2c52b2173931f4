package histories

import (
	"fmt"
	"sort"
	"strings"
)

// The pipeline history: saves that stage messages (an aggregate's save with its outbox rows), and the effects the
// handlers behind the inbox applied for the messages delivered to them.
//
//	save(messages) -> ok | fail | info          (KindSave)
//	effect(message) -> ok | ok duplicate | fail | info   (KindEffect)
//
// An ok effect is a handler transaction that committed; a duplicate one committed nothing for the message because
// the inbox had already recorded it. CheckPipeline asserts, for every message:
//
//   - lost: a message of an acknowledged (ok) save has no effect;
//   - duplicate: a message has more than one effect;
//   - aborted: a message of a failed save has an effect;
//   - phantom: a message that no save staged has an effect;
//   - reordered: (when PipelineOptions.Ordered) two effects of one key, one completed before the other was
//     invoked, in the opposite order of their Seq.
//
// A message of an indeterminate save may have no effect or one. An effect whose outcome is unknown (the handler's
// commit was lost) counts as possibly applied: it makes neither "lost" nor "duplicate" certain. When the run reads
// the committed effects back at the end (PipelineOptions.Final), those counts are the truth for lost, duplicate,
// aborted and phantom, and the history's ok effects must agree with them.

// Operation kinds of the pipeline history.
const (
	KindSave   = "save"
	KindEffect = "effect"
)

// PipelineMessage is a staged message: its ID, its ordering key and its place in that key's order.
type PipelineMessage struct {
	ID  string
	Key string
	Seq int64
}

// SaveInput is the input of a save: the messages it staged, and the save's own ID when the run can tell from the
// committed log whether it committed (ResolveSaves).
type SaveInput struct {
	Save     string
	Messages []PipelineMessage
}

// EffectInput is the input of an effect: the message delivered to the handler.
type EffectInput struct {
	Message PipelineMessage
}

// EffectOutput is the output of an ok effect: Duplicate when the inbox had already recorded the message, so the
// handler applied nothing.
type EffectOutput struct {
	Duplicate bool
}

// PipelineOptions configure CheckPipeline.
type PipelineOptions struct {
	// Ordered checks per-key order at the handler (where the README promises it). Default false.
	Ordered bool
	// Final, when not nil, is how many effects each message has in the committed state read after the run (a
	// message absent has none).
	Final map[string]int
}

// PipelineViolation is one anomaly.
type PipelineViolation struct {
	// Kind is "lost", "duplicate", "aborted", "phantom", "reordered" or "disagrees" (the history's ok effects and
	// the final state differ).
	Kind    string
	Message string
	Detail  string
	// Ops are the operations involved.
	Ops []Op
}

// PipelineReport is the verdict on a pipeline history.
type PipelineReport struct {
	Seed       uint64
	Violations []PipelineViolation
	// Unconfirmed counts messages of acknowledged saves whose only effects are indeterminate (no final state).
	Unconfirmed int
	// Messages counts the messages staged by saves of each outcome.
	Messages map[Outcome]int
}

// Err returns nil when there is no violation, and otherwise an error naming the seed and each violation with its
// operations.
func (r PipelineReport) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	var b strings.Builder
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "%s: message %s: %s\n", v.Kind, v.Message, v.Detail)
		for _, o := range v.Ops {
			fmt.Fprintf(&b, "  %s\n", o)
		}
	}
	return fmt.Errorf("histories: seed %d: %d pipeline violations:\n%s", r.Seed, len(r.Violations), b.String())
}

// CheckPipeline checks the saves and effects of h (KindSave, KindEffect); other kinds are ignored.
func CheckPipeline(h []Op, seed uint64, opts PipelineOptions) PipelineReport {
	rep := PipelineReport{Seed: seed, Messages: map[Outcome]int{}}
	type staged struct {
		msg  PipelineMessage
		save Op
	}
	saves := map[string]staged{}
	var order []string
	effects := map[string][]Op{}
	for _, o := range h {
		switch o.Kind {
		case KindSave:
			in, _ := o.Input.(SaveInput)
			for _, m := range in.Messages {
				if _, seen := saves[m.ID]; !seen {
					order = append(order, m.ID)
				}
				saves[m.ID] = staged{msg: m, save: o}
				rep.Messages[outcomeOf(o)]++
			}
		case KindEffect:
			in, _ := o.Input.(EffectInput)
			effects[in.Message.ID] = append(effects[in.Message.ID], o)
		}
	}
	add := func(kind, msg, detail string, ops ...Op) {
		rep.Violations = append(rep.Violations, PipelineViolation{Kind: kind, Message: msg, Detail: detail, Ops: ops})
	}
	for _, id := range order {
		s := saves[id]
		applied, unknown := splitEffects(effects[id])
		n := len(applied)
		if opts.Final != nil {
			if f := opts.Final[id]; f < len(applied) || f > len(applied)+len(unknown) {
				add("disagrees", id, fmt.Sprintf("%d effects committed in the final state, %d acknowledged in the "+
					"history (%d indeterminate)", f, len(applied), len(unknown)), append([]Op{s.save}, effects[id]...)...)
			}
			n, unknown = opts.Final[id], nil
		}
		ops := append([]Op{s.save}, effects[id]...)
		switch outcomeOf(s.save) {
		case OK:
			if n == 0 && len(unknown) == 0 {
				add("lost", id, "the save was acknowledged; the message had no effect", ops...)
			} else if n == 0 {
				rep.Unconfirmed++
			}
			if n > 1 {
				add("duplicate", id, fmt.Sprintf("%d effects", n), ops...)
			}
		case Fail:
			if n > 0 {
				add("aborted", id, fmt.Sprintf("the save failed; the message had %d effects", n), ops...)
			}
		default:
			if n > 1 {
				add("duplicate", id, fmt.Sprintf("%d effects", n), ops...)
			}
		}
	}
	var phantoms []string
	unstaged := map[string]bool{}
	for id := range effects {
		unstaged[id] = true
	}
	for id := range opts.Final {
		unstaged[id] = true
	}
	for id := range unstaged {
		if _, ok := saves[id]; ok {
			continue
		}
		applied, _ := splitEffects(effects[id])
		n := len(applied)
		if opts.Final != nil {
			n = opts.Final[id]
		}
		if n > 0 {
			phantoms = append(phantoms, id)
		}
	}
	sort.Strings(phantoms)
	for _, id := range phantoms {
		add("phantom", id, "an effect of a message no save staged", effects[id]...)
	}
	if opts.Ordered {
		checkOrder(h, add)
	}
	return rep
}

// outcomeOf is an operation's outcome with Pending read as Info.
func outcomeOf(o Op) Outcome {
	if o.Outcome == Pending {
		return Info
	}
	return o.Outcome
}

// splitEffects returns the effects that applied the message (ok, not duplicate) and those whose outcome is unknown.
func splitEffects(ops []Op) (applied, unknown []Op) {
	for _, o := range ops {
		switch outcomeOf(o) {
		case OK:
			if out, _ := o.Output.(EffectOutput); !out.Duplicate {
				applied = append(applied, o)
			}
		case Info:
			unknown = append(unknown, o)
		}
	}
	return applied, unknown
}

// checkOrder flags, per key, two applied effects where one completed before the other was invoked but carries the
// higher Seq.
func checkOrder(h []Op, add func(kind, msg, detail string, ops ...Op)) {
	byKey := map[string][]Op{}
	for _, o := range h {
		if o.Kind != KindEffect || outcomeOf(o) != OK {
			continue
		}
		if out, _ := o.Output.(EffectOutput); out.Duplicate {
			continue
		}
		in, _ := o.Input.(EffectInput)
		byKey[in.Message.Key] = append(byKey[in.Message.Key], o)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ops := byKey[k]
		sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
		for j, b := range ops {
			for _, a := range ops[:j] {
				ma, mb := a.Input.(EffectInput).Message, b.Input.(EffectInput).Message
				if a.Complete < b.Invoke && ma.Seq > mb.Seq {
					add("reordered", mb.ID, fmt.Sprintf("key %s: seq %d applied after seq %d had completed", k,
						mb.Seq, ma.Seq), a, b)
				}
			}
		}
	}
}

// ResolveSaves holds the saves of h to the committed log read after the run, when nothing can commit any more:
// committed holds the IDs (SaveInput.Save) of the saves whose events are in the log. An indeterminate save is
// resolved to ok when it committed and to fail when it did not, so CheckPipeline then requires its messages'
// effects exactly as for an acknowledged save (a message of a save that committed after an ErrCommitUnknown must
// not be lost either). An acknowledged save missing from the log is flagged "lost save", a failed one present in
// it "failed save committed" (the client was told a definite failure of a save that took effect). Saves without
// an ID and other operations are returned as they are.
func ResolveSaves(h []Op, committed map[string]bool) ([]Op, []PipelineViolation) {
	out := make([]Op, len(h))
	var vs []PipelineViolation
	for i, o := range h {
		out[i] = o
		in, ok := o.Input.(SaveInput)
		if o.Kind != KindSave || !ok || in.Save == "" {
			continue
		}
		c := committed[in.Save]
		switch outcomeOf(o) {
		case OK:
			if !c {
				vs = append(vs, PipelineViolation{Kind: "lost save", Message: in.Save,
					Detail: "the save was acknowledged; its events are not in the committed log", Ops: []Op{o}})
			}
		case Fail:
			if c {
				vs = append(vs, PipelineViolation{Kind: "failed save committed", Message: in.Save,
					Detail: "the save was reported failed; its events are in the committed log", Ops: []Op{o}})
			}
		default:
			if c {
				out[i].Outcome = OK
			} else {
				out[i].Outcome = Fail
			}
			out[i].Err = strings.TrimSpace(o.Err + " (resolved from the committed log)")
		}
	}
	return out, vs
}
