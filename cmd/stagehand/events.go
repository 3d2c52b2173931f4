package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/pgnotify"
)

func (a *app) eventsCommand() *cobra.Command {
	return group("events", "Read the event log; partition and archive it",
		`Read the global event log (in position order, gap-safe: an event that commits late is never skipped) or
one stream, and manage the partitions of an events table partitioned by position.`,
		a.eventsTailCommand(), a.eventsStreamCommand(), a.partitionsCommand())
}

type eventJSON struct {
	Position    int64             `json:"position"`
	Tenant      string            `json:"tenant"`
	StreamType  string            `json:"stream_type"`
	StreamID    string            `json:"stream_id"`
	Version     int64             `json:"version"`
	EventID     string            `json:"event_id"`
	Type        string            `json:"type"`
	TypeVersion int               `json:"type_version"`
	OccurredAt  time.Time         `json:"occurred_at"`
	RecordedAt  time.Time         `json:"recorded_at"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	payloadJSON
}

func toEventJSON(r eventstore.Record) eventJSON {
	return eventJSON{Position: r.Position, Tenant: r.Tenant, StreamType: r.StreamType, StreamID: r.StreamID,
		Version: r.Version, EventID: r.EventID.String(), Type: r.Type, TypeVersion: r.TypeVersion,
		OccurredAt: r.OccurredAt.UTC(), RecordedAt: r.RecordedAt.UTC(), Metadata: r.Metadata,
		payloadJSON: encodePayload(r.Payload)}
}

const eventTime = "2006-01-02T15:04:05.000Z07:00"

// eventLine is the human form of an event in the log.
func eventLine(r eventstore.Record) string {
	tenant := ""
	if r.Tenant != stagehand.NoTenant {
		tenant = " tenant=" + r.Tenant
	}
	return fmt.Sprintf("#%d %s %s/%s@%d %s%s %s\n", r.Position, r.RecordedAt.UTC().Format(eventTime), r.StreamType,
		r.StreamID, r.Version, r.Type, tenant, payloadText(r.Payload))
}

// resolveFrom turns --from into the position to read after.
func resolveFrom(from string, follow bool, head int64) (int64, error) {
	bad := func() (int64, error) {
		return 0, usageErrorf("--from %q: want start, head, a position N (from N on) or -N (the last N positions)",
			from)
	}
	switch from {
	case "":
		if follow {
			return head, nil
		}
		return 0, nil
	case "start":
		return 0, nil
	case "head", "end":
		return head, nil
	}
	n, err := strconv.ParseInt(from, 10, 64)
	switch {
	case err != nil || n == 0:
		return bad()
	case n < 0:
		return max(head+n, 0), nil
	}
	return n - 1, nil
}

// eventSink writes events as lines, JSON lines, or one JSON document.
type eventSink struct {
	a        *app
	lines    bool // JSON lines (--json --follow)
	document bool // one JSON document (--json)
	n        int
}

func (s *eventSink) open() error {
	if s.document {
		return s.a.printf(`{"schema":%s,"events":[`, quoteJSON(s.a.schema))
	}
	return nil
}

func (s *eventSink) write(r eventstore.Record) error {
	defer func() { s.n++ }()
	switch {
	case s.document || s.lines:
		b, err := json.Marshal(toEventJSON(r))
		if err != nil {
			return fmt.Errorf("encode event %d: %w", r.Position, err)
		}
		sep := "\n"
		if s.document && s.n > 0 {
			sep = ",\n"
		}
		if s.lines {
			return s.a.printf("%s\n", b)
		}
		return s.a.printf("%s%s", sep, b)
	}
	return s.a.printf("%s", eventLine(r))
}

func (s *eventSink) close(last int64) error {
	if s.document {
		return s.a.printf("\n],\"last_position\":%d}\n", last)
	}
	return nil
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

func (a *app) eventsTailCommand() *cobra.Command {
	var (
		from                      string
		limit, batch              int
		follow                    bool
		types, streamTypes, tents []string
		poll                      time.Duration
	)
	c := &cobra.Command{
		Use:   "tail",
		Short: "Print the global event log, and follow it live",
		Long: `Print events of the global log in position order, from --from up to the head of the log, then stop.
With --follow keep printing new events as they are appended (woken by the store's notifications, with polling as
the safety net) until Ctrl-C.

--from takes start (the default without --follow), head (the default with --follow: only new events), a position N
(from N on) or -N (the last N positions of the log). --type, --stream-type and --tenant filter (each repeatable).
With --json: one JSON document, or one JSON object per line with --follow.`,
		Example: `  stagehand events tail --from -20
  stagehand events tail --follow --type account.opened --tenant acme
  stagehand events tail --from 1000 --limit 50 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case limit < 0:
				return usageErrorf("--limit must not be negative")
			case batch < 1 || batch > 10000:
				return usageErrorf("--batch-size must be between 1 and 10000")
			case poll < 10*time.Millisecond:
				return usageErrorf("--poll-interval must be at least 10ms")
			}
			ctx := cmd.Context()
			store, err := a.eventStore(ctx)
			if err != nil {
				return err
			}
			head, err := store.HeadPosition(ctx)
			if err != nil {
				return a.dbError(err)
			}
			after, err := resolveFrom(from, follow, head)
			if err != nil {
				return err
			}
			tenants := make([]string, 0, len(tents))
			for _, t := range tents {
				tenants = append(tenants, stagehand.NormalizeTenant(t))
			}
			q := eventstore.LogQuery{Limit: batch, EventTypes: types, StreamTypes: streamTypes, Tenants: tenants}
			sink := &eventSink{a: a, lines: a.json && follow, document: a.json && !follow}
			if follow {
				return a.follow(ctx, store, q, after, limit, poll, sink)
			}
			if err := sink.open(); err != nil {
				return err
			}
			for after < head && (limit == 0 || sink.n < limit) {
				q.After = after
				page, err := store.ReadLog(ctx, q)
				if err != nil {
					return a.dbError(err)
				}
				for _, r := range page.Records {
					if limit > 0 && sink.n >= limit {
						break
					}
					if err := sink.write(r); err != nil {
						return err
					}
					after = r.Position
				}
				if limit > 0 && sink.n >= limit {
					break
				}
				if page.Last <= after && len(page.Records) == 0 {
					break // an append still in flight holds the next position: stop at what is settled
				}
				after = max(after, page.Last)
			}
			return sink.close(after)
		},
	}
	f := c.Flags()
	f.StringVar(&from, "from", "", "where to start: start, head, a position N, or -N (the last N positions)")
	f.IntVar(&limit, "limit", 0, "stop after this many events (0: no limit)")
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new events until interrupted")
	f.StringArrayVar(&types, "type", nil, "only events of this type (repeatable)")
	f.StringArrayVar(&streamTypes, "stream-type", nil, "only events of streams of this type (repeatable)")
	f.StringArrayVar(&tents, "tenant", nil, "only events of this tenant (repeatable; empty: the no-tenant value)")
	f.DurationVar(&poll, "poll-interval", time.Second, "with --follow: how often to look when no notification comes")
	f.IntVar(&batch, "batch-size", 500, "log positions read per query")
	return c
}

// follow prints the log after position after until ctx ends (a clean stop) or limit events were printed. It
// listens for the store's append notifications and polls every poll besides; read errors after the first
// successful read are reported on stderr and retried.
func (a *app) follow(ctx context.Context, store *eventstore.PostgresStore, q eventstore.LogQuery, after int64,
	limit int, poll time.Duration, sink *eventSink) error {
	wake, stop := pgnotify.Listen(ctx, store.Pool(), store.NotifyChannel(), time.Second, nil)
	defer stop()
	t := time.NewTicker(poll)
	defer t.Stop()
	healthy, failing := false, false
	for {
		q.After = after
		page, err := store.ReadLog(ctx, q)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !healthy:
			return a.dbError(err)
		case err != nil:
			if !failing {
				a.warnf("reading the log failed, retrying every %s: %s", poll, oneLine(err))
				failing = true
			}
		default:
			healthy, failing = true, false
			for _, r := range page.Records {
				if err := sink.write(r); err != nil {
					return err
				}
				if limit > 0 && sink.n >= limit {
					return nil
				}
			}
			if page.Last > after {
				after = page.Last
				continue // there may be more right away
			}
		}
		if a.opts.followIdle != nil {
			a.opts.followIdle()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-t.C:
		}
	}
}

func (a *app) eventsStreamCommand() *cobra.Command {
	var (
		tenant      string
		fromVersion int64
	)
	c := &cobra.Command{
		Use:   "stream ID",
		Short: "Print the events of one stream, in version order",
		Example: `  stagehand events stream acc-42
  stagehand events stream acc-42 --tenant acme --from-version 10 --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromVersion < 1 {
				return usageErrorf("--from-version must be at least 1")
			}
			ctx, id := cmd.Context(), args[0]
			tenant = stagehand.NormalizeTenant(tenant)
			store, err := a.eventStore(ctx)
			if err != nil {
				return err
			}
			info, err := store.Stream(ctx, tenant, id)
			if errors.Is(err, eventstore.ErrStreamNotFound) {
				return fmt.Errorf("no stream %q for tenant %s in schema %q: %w", id, displayTenant(tenant), a.schema,
					err)
			}
			if err != nil {
				return a.dbError(err)
			}
			recs, err := store.ReadStream(ctx, tenant, id, fromVersion)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				evs := make([]eventJSON, 0, len(recs))
				for _, r := range recs {
					evs = append(evs, toEventJSON(r))
				}
				return a.writeJSON(struct {
					Schema     string      `json:"schema"`
					Tenant     string      `json:"tenant"`
					StreamID   string      `json:"stream_id"`
					StreamType string      `json:"stream_type"`
					Version    int64       `json:"version"`
					CreatedAt  time.Time   `json:"created_at"`
					UpdatedAt  time.Time   `json:"updated_at"`
					Events     []eventJSON `json:"events"`
				}{a.schema, info.Tenant, info.StreamID, info.StreamType, info.Version, info.CreatedAt.UTC(),
					info.UpdatedAt.UTC(), evs})
			}
			if err := a.printf("Stream %s/%s, tenant %s: version %d, created %s, updated %s\n\n", info.StreamType,
				info.StreamID, displayTenant(info.Tenant), info.Version, timestamp(info.CreatedAt),
				timestamp(info.UpdatedAt)); err != nil {
				return err
			}
			rows := make([][]string, 0, len(recs))
			for _, r := range recs {
				rows = append(rows, []string{fmt.Sprint(r.Version), fmt.Sprint(r.Position), r.Type,
					r.RecordedAt.UTC().Format(eventTime), strings.TrimSpace(payloadText(r.Payload))})
			}
			return a.table([]string{"VERSION", "POSITION", "TYPE", "RECORDED AT", "PAYLOAD"}, rows)
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the stream's tenant (default: the no-tenant value)")
	c.Flags().Int64Var(&fromVersion, "from-version", 1, "first version to print")
	return c
}
