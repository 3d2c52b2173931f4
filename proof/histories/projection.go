package histories

import (
	"fmt"
	"sort"
	"strings"
)

// Projection reads. A projection folds the committed log into a read model; what a reader sees of it must be the
// fold of some prefix of the log (a projection applies events in log order, its writes committing with its
// checkpoint), and a reader that reads again later must not see a shorter prefix.
//
//	projection-read() -> ok ReadModel | fail     (KindProjectionRead)

// KindProjectionRead is a read of a projection's read model.
const KindProjectionRead = "projection-read"

// ReadModel is the output of a projection read: for each key, how many of its events the projection had applied.
// A key absent has none.
type ReadModel struct {
	Counts map[string]int64
}

// LogEvent is one event of the committed log, in log order: the key (stream) it belongs to.
type LogEvent struct {
	Key string
}

// ProjectionViolation is one anomaly of a projection read.
type ProjectionViolation struct {
	// Kind is "no prefix" (the read is the fold of no prefix of the log) or "went back" (a read saw a shorter
	// prefix than one completed before it began).
	Kind   string
	Detail string
	Ops    []Op
}

// ProjectionReport is the verdict on the projection reads of a history.
type ProjectionReport struct {
	Seed       uint64
	Reads      int
	Violations []ProjectionViolation
}

// Err returns nil when there is no violation, and otherwise an error naming the seed and each violation with its
// reads.
func (r ProjectionReport) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	var b strings.Builder
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "%s: %s\n", v.Kind, v.Detail)
		for _, o := range v.Ops {
			fmt.Fprintf(&b, "  %s\n", o)
		}
	}
	return fmt.Errorf("histories: seed %d: %d projection violations:\n%s", r.Seed, len(r.Violations), b.String())
}

// CheckProjectionReads checks every ok KindProjectionRead of h against the committed log: each must equal, key by
// key, the counts of the events of the first L events of the log for some L, and the prefixes a read can be must
// not all be shorter than every prefix a read completed before its invocation can be. Failed reads are ignored.
func CheckProjectionReads(h []Op, log []LogEvent, seed uint64) ProjectionReport {
	rep := ProjectionReport{Seed: seed}
	// at[key][n] is the index in the log of the n-th event (1-based) of key.
	at := map[string][]int{}
	for i, e := range log {
		at[e.Key] = append(at[e.Key], i)
	}
	keys := make([]string, 0, len(at))
	for k := range at {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	type span struct {
		op     Op
		lo, hi int // the prefix lengths L the read can be: lo <= L <= hi
	}
	var spans []span
	for _, o := range h {
		if o.Kind != KindProjectionRead || o.Outcome != OK {
			continue
		}
		rep.Reads++
		rm, _ := o.Output.(ReadModel)
		lo, hi := 0, len(log)
		var bad []string
		for k, n := range rm.Counts {
			if n < 0 || n > int64(len(at[k])) {
				bad = append(bad, fmt.Sprintf("key %s: %d events applied, %d in the log", k, n, len(at[k])))
			}
		}
		if len(bad) == 0 {
			for _, k := range keys {
				n := int(rm.Counts[k])
				if n > 0 {
					lo = max(lo, at[k][n-1]+1) // the prefix holds the n-th event
				}
				if n < len(at[k]) {
					hi = min(hi, at[k][n]) // and not the next
				}
			}
		}
		sort.Strings(bad)
		switch {
		case len(bad) > 0:
			rep.Violations = append(rep.Violations, ProjectionViolation{Kind: "no prefix",
				Detail: strings.Join(bad, "; "), Ops: []Op{o}})
		case lo > hi:
			rep.Violations = append(rep.Violations, ProjectionViolation{Kind: "no prefix",
				Detail: fmt.Sprintf("the counts need at least %d events of the log and at most %d", lo, hi),
				Ops:    []Op{o}})
		default:
			spans = append(spans, span{op: o, lo: lo, hi: hi})
		}
	}
	for _, b := range spans {
		for _, a := range spans {
			if a.op.Complete < b.op.Invoke && b.hi < a.lo {
				rep.Violations = append(rep.Violations, ProjectionViolation{Kind: "went back",
					Detail: fmt.Sprintf("a read saw at most %d events of the log after one that saw at least %d "+
						"had completed", b.hi, a.lo), Ops: []Op{a.op, b.op}})
				break
			}
		}
	}
	return rep
}
