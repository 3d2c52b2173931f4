package histories

import (
	"fmt"
	"slices"
	"time"
)

// Spread summarises durations: how many, their mean, median and 99th percentile (nearest rank).
type Spread struct {
	N              int
	Mean, P50, P99 time.Duration
}

func spreadOf(ds []time.Duration) Spread {
	if len(ds) == 0 {
		return Spread{}
	}
	slices.Sort(ds)
	var total time.Duration
	for _, d := range ds {
		total += d
	}
	rank := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds)-1)+0.5))] }
	return Spread{N: len(ds), Mean: total / time.Duration(len(ds)), P50: rank(0.5), P99: rank(0.99)}
}

func (s Spread) String() string {
	return fmt.Sprintf("n=%d mean %s p50 %s p99 %s", s.N, s.Mean.Round(100*time.Microsecond),
		s.P50.Round(100*time.Microsecond), s.P99.Round(100*time.Microsecond))
}

// Pace is how the handlers' deliveries followed one another from a point in the history on. A key's messages
// are handled one at a time (per-key order: the relay never has two of a key in flight), so with a backlog the
// handlers deliver at most Keys / (Handle.Mean + Gap.Mean) messages a second, however many partitions and
// deliveries in flight the relay allows.
type Pace struct {
	// Keys counts the keys with an effect; Effects the effects (ok, duplicates included) and Elapsed the time from
	// the first effect's invocation to the last one's completion.
	Keys, Effects int
	Elapsed       time.Duration
	// Handle is each ok effect's time from the delivery's start to its completion (the handler's inbox
	// transaction and the broker's acknowledgement); Gap the time from one effect of a key completing to the
	// next effect of that key starting (the relay marking, claiming and publishing the next message).
	Handle, Gap Spread
	// Load and Update are the handlers' LoadTx and UpdateTx calls inside those deliveries; First and Last the
	// handle times of the first and the last tenth of the effects (a handle time that grows through the drain is
	// work that grows with the streams the handler loads).
	Load, Update, First, Last Spread
}

// EffectPace measures the pace of the effects invoked at or after from in h.
func EffectPace(h []Op, from time.Duration) Pace {
	var handles, gaps, loads, updates []time.Duration
	last := map[string]time.Duration{}
	var first, end time.Duration = -1, 0
	for _, o := range h { // h is in invocation order
		if o.Outcome != OK || o.Invoke < from {
			continue
		}
		switch o.Kind {
		case KindLoadTx:
			loads = append(loads, o.Complete-o.Invoke)
		case KindUpdateTx:
			updates = append(updates, o.Complete-o.Invoke)
		}
		if o.Kind != KindEffect {
			continue
		}
		if first < 0 {
			first = o.Invoke
		}
		end = max(end, o.Complete)
		handles = append(handles, o.Complete-o.Invoke)
		if prev, ok := last[o.Key]; ok && o.Invoke >= prev {
			gaps = append(gaps, o.Invoke-prev)
		}
		last[o.Key] = o.Complete
	}
	tenth := max(1, len(handles)/10)
	p := Pace{Keys: len(last), Effects: len(handles), Load: spreadOf(loads), Update: spreadOf(updates),
		First: spreadOf(slices.Clone(handles[:min(tenth, len(handles))])),
		Last:  spreadOf(slices.Clone(handles[max(0, len(handles)-tenth):]))}
	p.Handle, p.Gap = spreadOf(handles), spreadOf(gaps)
	if first >= 0 {
		p.Elapsed = end - first
	}
	return p
}

// Rate is the effects a second over Elapsed; Bound is Keys over a key's mean time per message, the rate per-key
// order allows at this handle time and gap.
func (p Pace) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Effects) / p.Elapsed.Seconds()
}

// Bound is described with Rate.
func (p Pace) Bound() float64 {
	per := p.Handle.Mean + p.Gap.Mean
	if per <= 0 {
		return 0
	}
	return float64(p.Keys) / per.Seconds()
}

func (p Pace) String() string {
	return fmt.Sprintf("%d effects on %d keys in %s (%.0f/s; per-key order bounds it at %.0f/s); handle %s "+
		"(first tenth mean %s, last tenth mean %s; LoadTx mean %s, UpdateTx mean %s); gap to a key's next %s",
		p.Effects, p.Keys, p.Elapsed.Round(time.Millisecond), p.Rate(), p.Bound(), p.Handle,
		p.First.Mean.Round(100*time.Microsecond), p.Last.Mean.Round(100*time.Microsecond),
		p.Load.Mean.Round(100*time.Microsecond), p.Update.Mean.Round(100*time.Microsecond), p.Gap)
}
