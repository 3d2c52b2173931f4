package console

import (
	"context"
	"time"

	"github.com/stagehand-es/stagehand/internal/heartbeat"
)

// processView is one running (or lately running) process of a component, from its heartbeat: relays with or
// without leader election, inbox handlers, projections and staging workers, active or standby.
type processView struct {
	Kind, Name, Instance clipped
	Host                 clipped
	PID                  int
	// State is "alive", "stopped" (it stopped cleanly), "gone" (no beat for three of its intervals) or, for an
	// inbox handler, which beats only when a message comes, "idle" (no message for three intervals: it may be
	// waiting, or gone).
	State string
	// BeatAgo is how old its latest beat is; Up how long it has run; ActivityAgo how long ago it last published,
	// handled or applied something (Active false: never since it started); Activity how many since it started.
	BeatAgo, Up, ActivityAgo time.Duration
	Active                   bool
	Activity                 int64
	// Did says what Activity counts.
	Did string
}

// processes reads the heartbeats (estate-wide consoles only: processes serve every tenant).
func (c *Console) processes(ctx context.Context, now time.Time) ([]processView, error) {
	if !c.estate() {
		return nil, nil
	}
	ps, err := heartbeat.List(ctx, c.cfg.Pool, c.cfg.Schema)
	if err != nil {
		return nil, err
	}
	out := make([]processView, 0, len(ps))
	for _, p := range ps {
		v := processView{Kind: clip(p.Kind, 100), Name: clip(p.Name, 200), Instance: clip(p.Instance, 200),
			Host: clip(p.Host, 200), PID: p.PID, State: "alive", BeatAgo: max(p.Age, 0),
			Up: max(p.HeartbeatAt.Sub(p.StartedAt), 0) + max(p.Age, 0), Activity: p.Activity, Did: did(p.Kind)}
		switch {
		case !p.StoppedAt.IsZero():
			v.State = "stopped"
		case p.Gone() && p.Kind == "inbox":
			v.State = "idle"
		case p.Gone():
			v.State = "gone"
		}
		if !p.LastActivityAt.IsZero() {
			v.Active, v.ActivityAgo = true, max(now.Sub(p.LastActivityAt), 0)
		}
		out = append(out, v)
	}
	return out, nil
}

// did names what a kind's activity counts.
func did(kind string) string {
	switch kind {
	case "relay":
		return "published"
	case "inbox":
		return "handled"
	case "projection", "stager", "reconciler", "subscriber":
		return "events applied"
	}
	return "done"
}
