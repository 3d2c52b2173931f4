package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/stagehand-es/stagehand/eventstore"
)

func (a *app) partitionsCommand() *cobra.Command {
	return group("partitions", "Partition the events table by position, and archive old partitions",
		`An events table can be range-partitioned by global position so that old partitions are detached and
archived without downtime. It is opt-in: convert runs once, on a live table. Then keep partitions ahead of the log
(create, from cron, or eventstore.Partitions.Ensure in the application): an append whose position has no partition
fails. archive detaches the oldest partition once nothing needs it.`,
		a.partitionsListCommand(), a.partitionsConvertCommand(), a.partitionsCreateCommand(),
		a.partitionsArchiveCommand())
}

// partitions opens the partition operations of the schema.
func (a *app) partitions(cmd *cobra.Command, cfg eventstore.PartitionConfig) (*eventstore.Partitions, error) {
	pool, err := a.connect(cmd.Context())
	if err != nil {
		return nil, err
	}
	cfg.Schema = a.schema
	p, err := eventstore.NewPartitions(pool, &cfg)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	return p, nil
}

type partitionJSON struct {
	Name          string     `json:"name"`
	From          int64      `json:"from"`
	To            int64      `json:"to"`
	State         string     `json:"state"`
	Events        int64      `json:"events"`
	Bytes         int64      `json:"bytes"`
	ArchiveSchema string     `json:"archive_schema,omitempty"`
	ArchivedAt    *time.Time `json:"archived_at,omitempty"`
}

func toPartitionJSON(p eventstore.Partition) partitionJSON {
	j := partitionJSON{Name: p.Name, From: p.From, To: p.To, State: string(p.State), Events: p.Events,
		Bytes: p.Bytes, ArchiveSchema: p.ArchiveSchema}
	if !p.ArchivedAt.IsZero() {
		t := p.ArchivedAt.UTC()
		j.ArchivedAt = &t
	}
	return j
}

func partitionsJSON(ps []eventstore.Partition) []partitionJSON {
	out := make([]partitionJSON, 0, len(ps))
	for _, p := range ps {
		out = append(out, toPartitionJSON(p))
	}
	return out
}

type partitionsListJSON struct {
	Schema      string          `json:"schema"`
	Partitioned bool            `json:"partitioned"`
	Drawn       int64           `json:"drawn"`
	End         int64           `json:"end"`
	Headroom    int64           `json:"headroom"`
	Attached    []partitionJSON `json:"attached"`
	Archived    []partitionJSON `json:"archived"`
}

// bytesHuman formats a size for tables.
func bytesHuman(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func (a *app) partitionsListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the events table's partitions, attached and archived",
		Long: `List the partitions of the events table: attached ones (positions FROM to TO-1, PostgreSQL's estimate of
their events, size) and archived ones (where they went, their exact count). The headroom is how many positions
can still be drawn before appends fail for lack of a partition; below one partition's worth a warning is printed
on stderr. A table never converted is reported as such (exit 0).`,
		Example: `  stagehand events partitions list
  stagehand events partitions list --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.partitions(cmd, eventstore.PartitionConfig{})
			if err != nil {
				return err
			}
			st, err := p.Status(cmd.Context())
			if err != nil {
				return a.dbError(err)
			}
			if st.Partitioned && len(st.Attached) > 0 {
				last := st.Attached[len(st.Attached)-1]
				if st.Headroom() < last.To-last.From {
					a.warnf("only %d positions left before the last partition ends: run 'stagehand events "+
						"partitions create'", st.Headroom())
				}
			}
			if a.json {
				return a.writeJSON(partitionsListJSON{Schema: a.schema, Partitioned: st.Partitioned,
					Drawn: st.Drawn, End: st.End, Headroom: st.Headroom(), Attached: partitionsJSON(st.Attached),
					Archived: partitionsJSON(st.Archived)})
			}
			if !st.Partitioned {
				return a.printf("The events table of schema %q is not partitioned (opt-in: 'stagehand events "+
					"partitions convert'); last position drawn %d.\n", a.schema, st.Drawn)
			}
			if err := a.printf("Events table of schema %q: last position drawn %d, partitions end at %d "+
				"(headroom %d positions).\n", a.schema, st.Drawn, st.End, st.Headroom()); err != nil {
				return err
			}
			rows := [][]string{}
			for _, part := range append(append([]eventstore.Partition{}, st.Archived...), st.Attached...) {
				where := "attached"
				switch part.State {
				case eventstore.PartitionMoved:
					where = "moved to schema " + part.ArchiveSchema
				case eventstore.PartitionDropped:
					where = "dropped"
				case eventstore.PartitionDetached:
					where = "detached, in schema " + a.schema
				case eventstore.PartitionDetaching:
					where = "DETACHING (run archive again to finish)"
				}
				events := fmt.Sprint(part.Events)
				if part.State == eventstore.PartitionAttached {
					events = "~" + events
				}
				rows = append(rows, []string{part.Name, fmt.Sprint(part.From), fmt.Sprint(part.To - 1), events,
					bytesHuman(part.Bytes), where})
			}
			return a.table([]string{"PARTITION", "FROM", "TO", "EVENTS", "SIZE", "STATE"}, rows)
		},
	}
}

type convertJSON struct {
	Schema          string          `json:"schema"`
	Already         bool            `json:"already"`
	First           partitionJSON   `json:"first"`
	Created         []partitionJSON `json:"created"`
	Streams         int64           `json:"streams"`
	Events          int64           `json:"events"`
	CopySeconds     float64         `json:"copy_seconds"`
	ValidateSeconds float64         `json:"validate_seconds"`
	SwapSeconds     float64         `json:"swap_seconds"`
	DurationSeconds float64         `json:"duration_seconds"`
}

// partitionFlags are the flags that configure Partitions.
func partitionFlags(c *cobra.Command, cfg *eventstore.PartitionConfig, headroom bool) {
	c.Flags().Int64Var(&cfg.Size, "size", 0, fmt.Sprintf("positions per new partition (default: the newest "+
		"partition's size, else %d)", eventstore.DefaultPartitionSize))
	c.Flags().IntVar(&cfg.Ahead, "ahead", 0, fmt.Sprintf("partitions kept ahead of the log (default %d)",
		eventstore.DefaultPartitionsAhead))
	c.Flags().DurationVar(&cfg.LockTimeout, "lock-timeout", 0, fmt.Sprintf("longest wait for a lock appends "+
		"would queue behind (default %s)", eventstore.DefaultPartitionLockTimeout))
	if headroom {
		c.Flags().Int64Var(&cfg.Headroom, "headroom", 0, fmt.Sprintf("positions past the last one drawn that "+
			"the existing table keeps taking (default %d)", eventstore.DefaultConvertHeadroom))
	}
}

func (a *app) partitionsConvertCommand() *cobra.Command {
	var cfg eventstore.PartitionConfig
	c := &cobra.Command{
		Use:   "convert",
		Short: "Partition the events table by position (opt-in, once, on a live table)",
		Long: `Convert the events table into one range-partitioned by global position, while the application runs.
Appends, loads and log readers go on; they wait three times, each time at most --lock-timeout (installing the
conversion's trigger, adding the positions' bound, and the swap, which takes milliseconds). The existing table becomes the first partition,
taking every position up to --headroom past the last one drawn; --ahead partitions of --size positions follow.
Run 'stagehand migrate up' first. Running it again resumes an interrupted conversion, or only creates partitions
ahead on a table already converted. Keep partitions ahead afterwards ('create').`,
		Example: `  stagehand events partitions convert
  stagehand events partitions convert --size 5000000 --headroom 20000000 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.partitions(cmd, cfg)
			if err != nil {
				return err
			}
			sp := a.newSpinner("converting the events table")
			res, err := p.Convert(cmd.Context())
			sp.stop()
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(convertJSON{Schema: a.schema, Already: res.Already,
					First: toPartitionJSON(res.First), Created: partitionsJSON(res.Created), Streams: res.Streams,
					Events: res.Events, CopySeconds: seconds(res.Copy), ValidateSeconds: seconds(res.Validate),
					SwapSeconds: seconds(res.Swap), DurationSeconds: seconds(res.Duration)})
			}
			if res.Already {
				return a.printf("The events table of schema %q was already partitioned; created %d partition(s) "+
					"ahead.\n", a.schema, len(res.Created))
			}
			return a.printf("Partitioned the events table of schema %q in %s: %s holds positions below %d; %d "+
				"partition(s) created after it.\nCopied %d stream heads and %d event IDs in %s, validated positions "+
				"in %s; appends waited %s for the swap.\n", a.schema, human(res.Duration), res.First.Name,
				res.First.To, len(res.Created), res.Streams, res.Events, human(res.Copy), human(res.Validate),
				human(res.Swap))
		},
	}
	partitionFlags(c, &cfg, true)
	return c
}

type createJSON struct {
	Schema   string          `json:"schema"`
	Created  []partitionJSON `json:"created"`
	End      int64           `json:"end"`
	Headroom int64           `json:"headroom"`
}

func (a *app) partitionsCreateCommand() *cobra.Command {
	var cfg eventstore.PartitionConfig
	c := &cobra.Command{
		Use:   "create",
		Short: "Create the partitions ahead of the log that are missing",
		Long: `Create partitions after the last one until --ahead partitions follow the one that holds the next
position to draw. Appends go on while partitions are created. Without --size, new partitions have the size of the
newest one. Run it from cron, often enough that the headroom ('list') never runs out: an append whose position has
no partition fails (nothing is appended).`,
		Example: `  stagehand events partitions create
  stagehand events partitions create --ahead 4 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			p, err := a.partitions(cmd, cfg)
			if err != nil {
				return err
			}
			created, err := p.Ensure(ctx)
			if err != nil {
				return a.dbError(err)
			}
			st, err := p.Status(ctx)
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(createJSON{Schema: a.schema, Created: partitionsJSON(created), End: st.End,
					Headroom: st.Headroom()})
			}
			names := make([]string, len(created))
			for i, c := range created {
				names[i] = c.Name
			}
			list := ""
			if len(names) > 0 {
				list = ": " + strings.Join(names, ", ")
			}
			return a.printf("Created %d partition(s)%s. Partitions end at %d (headroom %d positions).\n",
				len(created), list, st.End, st.Headroom())
		},
	}
	partitionFlags(c, &cfg, false)
	return c
}

type archiveJSON struct {
	Schema          string        `json:"schema"`
	Partition       partitionJSON `json:"partition"`
	Uncovered       int64         `json:"uncovered"`
	CheckSeconds    float64       `json:"check_seconds"`
	DetachSeconds   float64       `json:"detach_seconds"`
	DurationSeconds float64       `json:"duration_seconds"`
}

func (a *app) partitionsArchiveCommand() *cobra.Command {
	var (
		req       eventstore.ArchiveRequest
		to        string
		lockLimit time.Duration
	)
	c := &cobra.Command{
		Use:   "archive",
		Short: "Detach the oldest partition and move, drop or leave it",
		Long: `Detach the oldest attached partition without blocking appends or reads (DETACH PARTITION
CONCURRENTLY), then --to move (default: into --archive-schema, default SCHEMA_archive), drop, or detach (leave
it in the schema as a plain table, to pg_dump and drop yourself). Its event IDs leave event_ids.

It refuses, naming every reason, while anything still needs the partition: a projection, Deferred stager,
reconciler or log subscriber whose checkpoint has not passed it (or with a rebuild pending), an outbox watermark
that has not passed it, events parked in it, or streams with events in it that no snapshot taken after them
covers. --allow-uncovered archives those streams anyway: loading them then fails with ErrArchived, naming the
stream and the archived range. An interrupted archive is finished by running it again.`,
		Example: `  stagehand events partitions archive
  stagehand events partitions archive --to drop --allow-uncovered --json
  stagehand events partitions archive --to detach   # then: pg_dump -t 'stagehand.events_p...' ; DROP TABLE`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch to {
			case "move", "drop", "detach":
				req.Disposition = eventstore.ArchiveDisposition(to)
			default:
				return usageErrorf("--to %q: want move, drop or detach", to)
			}
			p, err := a.partitions(cmd, eventstore.PartitionConfig{LockTimeout: lockLimit})
			if err != nil {
				return err
			}
			sp := a.newSpinner("archiving the oldest partition")
			res, err := p.Archive(cmd.Context(), req)
			sp.stop()
			if err != nil {
				return a.dbError(err)
			}
			if a.json {
				return a.writeJSON(archiveJSON{Schema: a.schema, Partition: toPartitionJSON(res.Partition),
					Uncovered: res.Uncovered, CheckSeconds: seconds(res.Check), DetachSeconds: seconds(res.Detach),
					DurationSeconds: seconds(res.Duration)})
			}
			part := res.Partition
			where := map[eventstore.PartitionState]string{
				eventstore.PartitionMoved:    "moved to schema " + part.ArchiveSchema,
				eventstore.PartitionDropped:  "dropped",
				eventstore.PartitionDetached: "left in schema " + a.schema + " as a plain table",
			}[part.State]
			msg := fmt.Sprintf("Archived %s (positions %d to %d, %d events): %s. Checks %s, detach %s, total %s.\n",
				part.Name, part.From, part.To-1, part.Events, where, human(res.Check), human(res.Detach),
				human(res.Duration))
			if res.Uncovered > 0 {
				msg += fmt.Sprintf("%d stream(s) no snapshot covers now fail to load (ErrArchived).\n", res.Uncovered)
			}
			return a.printf("%s", msg)
		},
	}
	c.Flags().StringVar(&req.Partition, "partition", "", "the partition to archive; it must be the oldest "+
		"attached one (default: that one)")
	c.Flags().StringVar(&to, "to", "move", "what to do with the detached table: move, drop or detach")
	c.Flags().StringVar(&req.ArchiveSchema, "archive-schema", "", "where --to move puts it (default SCHEMA_archive)")
	c.Flags().BoolVar(&req.AllowUncovered, "allow-uncovered", false, "archive events of streams no snapshot "+
		"covers (their loads then fail)")
	c.Flags().DurationVar(&lockLimit, "lock-timeout", 0, fmt.Sprintf("longest wait for a lock appends would "+
		"queue behind (default %s)", eventstore.DefaultPartitionLockTimeout))
	return c
}
