package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/eventstore"
)

func (a *app) streamsCommand() *cobra.Command {
	return group("streams", "Archive, delete and inspect single event streams",
		`Manage the lifecycle of one event stream. archive moves a finished stream's events out of the hot events
table into the archive: loads still read them, the global log still has them (a projection rebuilt from the start
sees them), and appends to the stream are refused. delete erases a stream where the law requires it: its events'
data is removed, tombstones keep their positions so log readers pass over them without waiting, projections are
told through their deletion handler, and who, when and why is kept (never the data). Both are irreversible and ask
for confirmation: type the stream ID when asked on a terminal, or pass --yes.`,
		a.streamsShowCommand(), a.streamsArchiveCommand(), a.streamsDeleteCommand())
}

type streamLifecycleJSON struct {
	Schema         string     `json:"schema"`
	Tenant         string     `json:"tenant"`
	StreamID       string     `json:"stream_id"`
	StreamType     string     `json:"stream_type"`
	State          string     `json:"state"`
	Version        int64      `json:"version"`
	Events         int64      `json:"events"`
	FirstPosition  int64      `json:"first_position,omitempty"`
	LastPosition   int64      `json:"last_position,omitempty"`
	MarkerPosition int64      `json:"marker_position,omitempty"`
	ArchivedAt     *time.Time `json:"archived_at,omitempty"`
	ArchivedBy     string     `json:"archived_by,omitempty"`
	DeletedAt      *time.Time `json:"deleted_at,omitempty"`
	DeletedBy      string     `json:"deleted_by,omitempty"`
	Reason         string     `json:"reason,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// printLifecycle prints a stream's lifecycle record, as a table or JSON.
func (a *app) printLifecycle(lc eventstore.StreamLifecycle) error {
	if a.json {
		return a.writeJSON(streamLifecycleJSON{Schema: a.schema, Tenant: lc.Tenant, StreamID: lc.StreamID,
			StreamType: lc.StreamType, State: string(lc.State), Version: lc.Version, Events: lc.Events,
			FirstPosition: lc.FirstPosition, LastPosition: lc.LastPosition, MarkerPosition: lc.MarkerPosition,
			ArchivedAt: timePtr(lc.ArchivedAt), ArchivedBy: lc.ArchivedBy, DeletedAt: timePtr(lc.DeletedAt),
			DeletedBy: lc.DeletedBy, Reason: lc.Reason})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Stream %s (tenant %s, type %s): %s at version %d\n", lc.StreamID, displayTenant(lc.Tenant),
		lc.StreamType, lc.State, lc.Version)
	if lc.Events > 0 {
		fmt.Fprintf(&b, "  moved events: %d (positions %d to %d)\n", lc.Events, lc.FirstPosition, lc.LastPosition)
	}
	if !lc.ArchivedAt.IsZero() {
		fmt.Fprintf(&b, "  archived: %s by %s\n", lc.ArchivedAt.Format(time.RFC3339), lc.ArchivedBy)
	}
	if !lc.DeletedAt.IsZero() {
		fmt.Fprintf(&b, "  deleted: %s by %s, reason: %s\n", lc.DeletedAt.Format(time.RFC3339), lc.DeletedBy,
			lc.Reason)
	}
	if !lc.State.Done() {
		fmt.Fprintf(&b, "  not finished: appends are refused but the events have not moved; run the command again\n")
	}
	return a.printf("%s", b.String())
}

func (a *app) streamsShowCommand() *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show a stream's lifecycle: active, archived or deleted, and by whom, when and why",
		Example: `  stagehand streams show acc-42
  stagehand streams show acc-42 --tenant acme --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := a.eventStore(cmd.Context())
			if err != nil {
				return err
			}
			lc, err := store.Lifecycle(cmd.Context(), stagehand.NormalizeTenant(tenant), args[0])
			if err != nil {
				return a.dbError(err)
			}
			return a.printLifecycle(lc)
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "the stream's tenant (default: the no-tenant value)")
	return c
}

// confirm asks the operator to type the stream ID before an irreversible action, unless --yes was given. Without
// a terminal to ask on, it refuses (a usage error): scripts pass --yes.
func (a *app) confirm(action, id string, yes bool) error {
	if yes {
		return nil
	}
	in := a.opts.stdin
	if in == nil || !a.opts.isInputTerminal(in) {
		return usageErrorf("%s stream %q is irreversible: pass --yes to confirm (no terminal to ask on)", action, id)
	}
	fmt.Fprintf(a.stderr, "%s stream %q (schema %s)? This cannot be undone. Type the stream ID to confirm: ",
		action, id, a.schema)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && err != io.EOF {
		return fmt.Errorf("read the confirmation: %w", err)
	}
	if strings.TrimSpace(line) != id {
		return usageErrorf("not confirmed: %s of stream %q cancelled, nothing changed", action, id)
	}
	return nil
}

func isInputTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (a *app) streamsArchiveCommand() *cobra.Command {
	var req eventstore.LifecycleRequest
	var yes bool
	c := &cobra.Command{
		Use:   "archive ID",
		Short: "Archive a finished stream: its events leave the hot table, loads still read them, appends are refused",
		Long: `Archive a finished stream. Its events move from the events table to the archive (stream_archive),
where loads read them transparently and the global log keeps them at their positions. Appends to it are refused
with ErrStreamArchived from then on. Safe while the application appends and projections run: an append racing the
archive either lands before it (and is archived) or is refused. The events move once every transaction that began
before the archive has ended (at most 30 s); if one is still open then, the stream stays refused and the command
fails: run it again.`,
		Example: `  stagehand streams archive order-2019-0042 --yes
  stagehand streams archive acc-42 --tenant acme --actor "jane (ops)" --reason "closed 2019" --json --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.StreamID, req.Tenant = args[0], stagehand.NormalizeTenant(req.Tenant)
			if err := a.confirm("archive", req.StreamID, yes); err != nil {
				return err
			}
			store, err := a.eventStore(cmd.Context())
			if err != nil {
				return err
			}
			lc, err := store.ArchiveStream(cmd.Context(), req)
			if err != nil {
				return a.dbError(err)
			}
			return a.printLifecycle(lc)
		},
	}
	c.Flags().StringVar(&req.Tenant, "tenant", "", "the stream's tenant (default: the no-tenant value)")
	c.Flags().StringVar(&req.Actor, "actor", "", "who archives it, for the record (default: the database user)")
	c.Flags().StringVar(&req.Reason, "reason", "", "why, for the record")
	c.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return c
}

func (a *app) streamsDeleteCommand() *cobra.Command {
	var req eventstore.LifecycleRequest
	var yes bool
	c := &cobra.Command{
		Use:   "delete ID --reason REASON",
		Short: "Delete a stream where the law requires it: its events' data is erased, tombstones keep the log whole",
		Long: `Delete a stream (an erasure request, an expired retention). Its events' payloads and metadata are
removed, from the hot table and from the archive alike, and its snapshot is deleted; a tombstone per event keeps
its position (with stream, version, event ID and type), so log readers pass over it without waiting. The deletion
is an event of its own in the log: projections that handle deletions remove what they derived from the stream.
Loads and appends of the stream fail with ErrStreamDeleted from then on; its ID is never reused. --reason is
required and kept with who and when (never put personal data in it). Outbox messages already staged from the
stream's events and read models without a deletion handler are not touched.`,
		Example: `  stagehand streams delete customer-17 --reason "erasure request #4711" --yes
  stagehand streams delete customer-17 --tenant acme --actor dpo --reason "GDPR art. 17" --json --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.StreamID, req.Tenant = args[0], stagehand.NormalizeTenant(req.Tenant)
			if strings.TrimSpace(req.Reason) == "" {
				return usageErrorf("--reason is required: say why the stream is deleted (it is kept for the audit)")
			}
			if err := a.confirm("delete", req.StreamID, yes); err != nil {
				return err
			}
			store, err := a.eventStore(cmd.Context())
			if err != nil {
				return err
			}
			lc, err := store.DeleteStream(cmd.Context(), req)
			if err != nil {
				return a.dbError(err)
			}
			return a.printLifecycle(lc)
		},
	}
	c.Flags().StringVar(&req.Tenant, "tenant", "", "the stream's tenant (default: the no-tenant value)")
	c.Flags().StringVar(&req.Actor, "actor", "", "who deletes it, for the record (default: the database user)")
	c.Flags().StringVar(&req.Reason, "reason", "", "why (required; kept for the audit, never personal data)")
	c.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return c
}
