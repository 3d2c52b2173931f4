package outbox

import (
	"sync"
	"time"

	"github.com/stagehand-es/stagehand/internal/heartbeat"
)

// Heartbeats. Every running relay (leader-elected or not) and every inbox handler records in the heartbeats table
// (migration 046), every heartbeat.DefaultInterval, that its process is alive, when it last published or handled
// a message and how many it did since it started, so operators (the console) see every process. A relay beats from
// a loop of its subscription or drain, which ends with it; an inbox handler has no loop of its own, so it beats inline, after
// a message, at most once per interval (an idle handler's row ages and shows as gone). Counting costs two atomic
// operations per message; a beat is one single-row UPSERT.

// inboxBeats are the beats of an outbox's inbox handlers, one per handler name, created on first use.
type inboxBeats struct {
	mu       sync.Mutex
	instance string
	beats    map[string]*heartbeat.Beat
}

// inboxBeat returns the beat of inbox handler name (nil when it cannot be made: heartbeats are best effort).
func (o *Outbox) inboxBeat(name string) *heartbeat.Beat {
	o.inboxBeats.mu.Lock()
	defer o.inboxBeats.mu.Unlock()
	if b, ok := o.inboxBeats.beats[name]; ok {
		return b
	}
	if o.inboxBeats.beats == nil {
		o.inboxBeats.beats = map[string]*heartbeat.Beat{}
		o.inboxBeats.instance = heartbeat.Instance()
	}
	b, err := heartbeat.New(o.pool, heartbeat.Config{Schema: o.schema, Kind: "inbox", Name: name,
		Instance: o.inboxBeats.instance, Logger: o.logger})
	if err != nil {
		b = nil
	}
	o.inboxBeats.beats[name] = b
	return b
}

// handledBeat records an inbox handler's run: a handled message counts as activity; a failure only keeps it
// visible.
func handledBeat(b *heartbeat.Beat, err error) {
	n := int64(1)
	if err != nil {
		n = 0
	}
	b.Touch(n, time.Now())
}

// newRelayBeat returns a relay's beat: kind "relay", named by its election (or "relay" without one), its
// instance the relay's lease owner.
func newRelayBeat(r *Relay) *heartbeat.Beat {
	name := r.s.LeaderElection
	if name == "" {
		name = "relay"
	}
	b, err := heartbeat.New(r.o.pool, heartbeat.Config{Schema: r.o.schema, Kind: "relay", Name: name,
		Instance: r.owner, Logger: r.s.Logger})
	if err != nil {
		return nil
	}
	return b
}
