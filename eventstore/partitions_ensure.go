package eventstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// createSQL returns the statements that create partition [from, to) and attach it (sql/partitions.sql): a plain
// table first, its indexes, then ATTACH PARTITION, which takes only a SHARE UPDATE EXCLUSIVE lock on the events
// table (appends go on; CREATE TABLE ... PARTITION OF would lock them out).
func (p *Partitions) createSQL(from, to int64) ([]string, error) {
	idents := p.partitionIdents(partitionName(from))
	raw := bound("from", from)
	raw["to"] = strconv.FormatInt(to, 10)
	var out []string
	for _, name := range []string{"create_partition", "create_partition_stream_index",
		"create_partition_event_id_index", "attach_partition"} {
		stmt, err := ddl(name, raw, idents)
		if err != nil {
			return nil, err
		}
		out = append(out, stmt)
	}
	return out, nil
}

// Ensure creates the partitions missing between the end of the last one and Ahead partitions past the one that
// holds the next position to draw, and returns them. Run it periodically (or `stagehand events partitions create` from cron): an
// append whose position has no partition fails with a *NoPartitionError. Creating a partition does not block
// appends; each waits at most LockTimeout for a conflicting operation.
func (p *Partitions) Ensure(ctx context.Context) ([]Partition, error) {
	s, err := p.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer s.release()
	return s.ensure(ctx)
}

// Keep runs Ensure now and then every interval until ctx ends, and returns nil then: the maintenance step that
// keeps partitions ahead of the log from inside an application (run it in every instance: Ensure takes the
// schema's partition lock, so they take turns and find nothing left to do). A failed Ensure is logged and tried
// again at the next interval. A table never converted is checked at each interval and left alone until it is.
// interval must be positive.
func (p *Partitions) Keep(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("eventstore: keep partitions ahead: interval must be positive, got %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		created, err := p.Ensure(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrNotPartitioned):
		case err != nil:
			p.cfg.Logger.WarnContext(ctx, "stagehand: could not create events partitions ahead; retrying",
				"schema", p.cfg.Schema, "retry_in", interval, "error", err)
		case len(created) > 0:
			p.cfg.Logger.InfoContext(ctx, "stagehand: events partitions created ahead", "schema", p.cfg.Schema,
				"created", len(created), "up_to", created[len(created)-1].To)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *session) ensure(ctx context.Context) ([]Partition, error) {
	p := s.p
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	st, err := p.status(ctx, tx)
	if err != nil {
		return nil, err
	}
	if !st.Partitioned {
		return nil, fmt.Errorf("%w: %s (convert it first)", ErrNotPartitioned, p.t.events)
	}
	created, err := p.createAhead(ctx, tx, st.Drawn, st.End, p.size(st))
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: commit: %w", err)
	}
	return created, nil
}

// createAhead creates, on tx, partitions from end until they reach Ahead partitions past drawn.
func (p *Partitions) createAhead(ctx context.Context, tx pgx.Tx, drawn, end, size int64) ([]Partition, error) {
	if _, err := tx.Exec(ctx, strings.Replace(p.lockTimeout(), "SET", "SET LOCAL", 1)); err != nil {
		return nil, fmt.Errorf("eventstore: create partitions: %w", err)
	}
	var created []Partition
	// The partition of the next position to draw, and Ahead more after it.
	want := boundary(drawn+1, size) + int64(p.cfg.Ahead)*size
	for from := end; from < want; from += size {
		to := from + size
		stmts, err := p.createSQL(from, to)
		if err != nil {
			return nil, err
		}
		for _, stmt := range stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return nil, fmt.Errorf("eventstore: create partition %s: %w", partitionName(from), err)
			}
		}
		created = append(created, Partition{Name: partitionName(from), From: from, To: to, State: PartitionAttached})
		p.cfg.Logger.InfoContext(ctx, "stagehand: events partition created", "schema", p.cfg.Schema,
			"partition", partitionName(from), "from", from, "to", to)
	}
	return created, nil
}
