package projection

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/aggregate"
	"github.com/stagehand-es/stagehand/eventstore"
	"github.com/stagehand-es/stagehand/internal/lease"
	"github.com/stagehand-es/stagehand/internal/logfollow"
	"github.com/stagehand-es/stagehand/internal/telemetry"
)

// Event is an event of the global log as a handler sees it.
type Event struct {
	eventstore.Record
	// Data is the event decoded into its current Go type (after upcasting) when the projection has a Registry;
	// nil otherwise.
	Data any
}

// Handler applies events to a read model. Writes made through tx commit together with the projection's
// checkpoint, exactly once. Handle is called for one event at a time, in log order (per stream in partitioned
// mode); several events may share one transaction. An error rolls the whole transaction back and the event is
// retried (Config.MaxAttempts, Config.OnFailure). Effects outside tx (HTTP calls, another database) are
// at-least-once: they may be repeated after a crash or a retry.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, e Event) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, e Event) error

// Handle implements Handler.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, e Event) error { return f(ctx, tx, e) }

// Resetter is implemented by handlers that can be rebuilt: Reset clears the read model (delete its rows, or
// truncate its tables) in the transaction that also moves the checkpoint back to the start.
type Resetter interface {
	Reset(ctx context.Context, tx pgx.Tx) error
}

// StreamDeleter is implemented by handlers whose read model keeps data of streams that may be deleted
// (eventstore.LifecycleStore.DeleteStream). StreamDeleted is called, in log order, at the position of each deletion
// of a stream the projection follows (its StreamTypes and Tenants filters apply, EventTypes does not), on the
// transaction that moves the checkpoint: delete the stream's rows there. e.Record names the stream (Tenant,
// StreamID, StreamType) and its Type is eventstore.StreamDeletedType; e.Data is nil. A projection rebuilt after the
// deletion never sees the stream's events (the log passes over their tombstones) and is still called. Handlers that
// do not implement it are not called for deletions; Handle never receives a deletion.
type StreamDeleter interface {
	StreamDeleted(ctx context.Context, tx pgx.Tx, e Event) error
}

// HandlerError is returned by Run when an event failed MaxAttempts times under the Stop failure mode (or failed
// for good at once: an event that cannot be decoded). It matches errors.Is(err, ErrHandler), and unwraps to the
// handler's last error.
type HandlerError struct {
	// Name is the checkpoint that stopped: the projection's name, or "name#i/n" for partition i of n.
	Name string
	// Record is the event that failed, Attempts how many times it was tried, Err the last error.
	Record   eventstore.Record
	Attempts int
	Err      error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("projection %s stopped: event %q at position %d (stream %q version %d, tenant %q) failed "+
		"%d times: %v", e.Name, e.Record.Type, e.Record.Position, e.Record.StreamID, e.Record.Version,
		e.Record.Tenant, e.Attempts, e.Err)
}

// Is matches ErrHandler.
func (e *HandlerError) Is(target error) bool { return target == ErrHandler }

// Unwrap returns the handler's last error.
func (e *HandlerError) Unwrap() error { return e.Err }

// ErrHandler matches the *HandlerError returned by Run in Stop mode.
var ErrHandler = errors.New("projection: handler failed")

// handlerError is the public form of a log follower's give-up.
func handlerError(f *logfollow.HandlerError) *HandlerError {
	return &HandlerError{Name: f.Name, Record: f.Record, Attempts: f.Attempts, Err: f.Err}
}

// Projection follows the global log and applies it to a read model through a Handler. Create it with New, run it
// with Run, and Close it when it is no longer needed (Close unregisters its lag gauges).
type Projection struct {
	pool      *pgxpool.Pool
	store     eventstore.Store
	handler   Handler
	reg       *aggregate.Registry
	cfg       Config
	followers []*logfollow.Follower
	share     *lease.Share // the partitions' spread over processes (nil: one partition)
	tel       instruments
}

const kind = "projection"

// New returns a projection that reads store and keeps its checkpoint, lease and parked events on pool (which
// must reach a database migrated with stagehand.Migrate; it is usually the pool of the read model and of
// eventstore.PostgresStore). store may be any eventstore.Store, including the in-memory one. Neither is closed
// by the projection.
func New(pool *pgxpool.Pool, store eventstore.Store, h Handler, cfg *Config) (*Projection, error) {
	if h == nil {
		return nil, &ConfigError{Package: "projection", Field: "handler", Reason: "must not be nil"}
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Projection{pool: pool, store: store, handler: h, reg: c.Registry, cfg: c}
	if m, ok := h.(*Mux); ok && p.reg == nil {
		p.reg = m.reg
	}
	if p.reg != nil {
		if err := p.reg.Validate(); err != nil {
			return nil, &ConfigError{Package: "projection", Field: "Registry",
				Reason: "has registration errors: " + err.Error()}
		}
	}
	if c.Partitions > 1 {
		// The partitions are spread over the processes running the projection: each leads at most its fair share.
		mgr, err := lease.New(pool, &lease.Config{Schema: c.Schema, Owner: c.Owner, TTL: c.LeaseTTL,
			RenewInterval: c.LeaseRenewInterval, AcquireInterval: c.LeaseAcquireInterval, Logger: c.Logger})
		if err != nil {
			var le *lease.ConfigError
			if errors.As(err, &le) {
				return nil, &ConfigError{Package: "projection", Field: "Lease" + le.Field, Reason: le.Reason}
			}
			return nil, err
		}
		p.share = lease.NewShare(mgr, logfollow.LeasePrefix+c.Name+"#members/", c.Partitions)
	}
	for i := range c.Partitions {
		fc := &logfollow.Config{
			Name: checkpointName(c.Name, i, c.Partitions), Kind: kind, ResetGroup: c.Name, Schema: c.Schema,
			EventTypes: c.EventTypes, StreamTypes: c.StreamTypes, Tenants: c.Tenants, Deletions: isDeleter(h),
			BatchSize: c.BatchSize, PagesPerTx: c.PagesPerTx, PollInterval: c.PollInterval, DisableListen: c.DisableListen,
			Owner: c.Owner, LeaseTTL: c.LeaseTTL, LeaseRenewInterval: c.LeaseRenewInterval,
			LeaseAcquireInterval: c.LeaseAcquireInterval,
			MaxAttempts:          c.MaxAttempts, RetryDelay: c.RetryDelay, MaxRetryDelay: c.MaxRetryDelay,
			OnReset: p.reset, Clock: c.Clock, Logger: c.Logger.With("projection", c.Name),
			Share: p.share, Partition: i,
		}
		if c.Partitions > 1 {
			part, n := i, c.Partitions
			fc.Select = func(r eventstore.Record) bool { return PartitionOf(r.Tenant, r.StreamID, n) == part }
		}
		if c.OnFailure == Park {
			name := fc.Name
			fc.OnExhausted = func(ctx context.Context, tx pgx.Tx, failure *logfollow.HandlerError) error {
				return p.park(ctx, tx, name, failure)
			}
		}
		f, err := logfollow.New(pool, store, p.batchHandler(fc.Name), fc)
		if err != nil {
			var fe *logfollow.ConfigError
			if errors.As(err, &fe) {
				return nil, &ConfigError{Package: "projection", Field: fe.Field, Reason: fe.Reason, Err: fe.Err}
			}
			return nil, err
		}
		p.followers = append(p.followers, f)
	}
	if err := p.instrument(); err != nil {
		return nil, err
	}
	return p, nil
}

// checkpointName is the projection's name, or "name#i/n" for partition i of n.
func checkpointName(name string, i, n int) string {
	if n == 1 {
		return name
	}
	return fmt.Sprintf("%s#%d/%d", name, i, n)
}

// PartitionOf returns the partition (0..n-1) of a stream in a projection with n partitions: FNV-1a of the
// tenant and the stream ID. It is stable across processes and releases. A blank tenant is stagehand.NoTenant, the
// tenant such a stream's events carry; n below 2 means one partition (0).
func PartitionOf(tenant, streamID string, n int) int {
	if n < 2 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(stagehand.NormalizeTenant(tenant)))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(streamID))
	return int(h.Sum32() % uint32(n))
}

// Name returns the projection's name.
func (p *Projection) Name() string { return p.cfg.Name }

// Run applies the log to the read model until ctx ends (returning nil), or until an event exhausts its attempts
// under the Stop failure mode (returning a *HandlerError). Only one process runs a projection (each partition)
// at a time: Run waits as a standby while another holds it, and takes over when that process stops or dies.
// In partitioned mode Run runs every partition and stops them all when one stops with an error.
//
// While it runs it also replays the parked events an operator asked for with RequestReplay.
func (p *Projection) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	stopMember := func() {}
	if p.share != nil { // this process's membership slot, held while it runs
		mctx, cancel := context.WithCancel(gctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.share.Member(mctx)
		}()
		stopMember = func() { cancel(); <-done }
	}
	for _, f := range p.followers {
		g.Go(func() error { return f.Run(gctx) })
	}
	stopReplay := logfollow.Every(gctx, p.pollInterval(), p.replayRequested)
	err := g.Wait()
	stopReplay()
	stopMember()
	if herr := (*logfollow.HandlerError)(nil); errors.As(err, &herr) {
		return handlerError(herr)
	}
	return err
}

func (p *Projection) pollInterval() time.Duration {
	if p.cfg.PollInterval > 0 {
		return p.cfg.PollInterval
	}
	return time.Second
}

// Rebuild asks the projection to rebuild its read model: the process running it calls the handler's Reset (see
// Resetter) and clears the parked events, in the transaction that moves every partition's checkpoint back to the
// start, then replays the whole log. It returns once the request is recorded; Status shows Rebuilding until the
// reset has happened. A projection that never ran has nothing to rebuild. Rebuild works across processes: the
// request is stored in the database (RequestRebuild is the same for code that has no Projection, such as a CLI).
func (p *Projection) Rebuild(ctx context.Context) error {
	if err := RequestRebuild(ctx, p.pool, p.cfg.Schema, p.cfg.Name); err != nil {
		return err
	}
	for _, f := range p.followers {
		f.Wake()
	}
	return nil
}

// RebuildFrom is Rebuild from the events after position after instead of the whole log: the reset moves every
// partition's checkpoint to after. It is how a projection is rebuilt once the start of a partitioned log has been
// archived (eventstore.Partitions.Archive): a rebuild that would read archived events (from the start, or from any
// position before the end of the archived range) is refused with an *eventstore.ArchivedError, nothing recorded,
// rather than skip them; from the end of the archived range on (ArchivedError.ArchivedTo - 1), it reads on,
// knowingly without them. (Archive in turn refuses while a rebuild is pending.)
func (p *Projection) RebuildFrom(ctx context.Context, after int64) error {
	if err := RequestRebuildFrom(ctx, p.pool, p.cfg.Schema, p.cfg.Name, after); err != nil {
		return err
	}
	for _, f := range p.followers {
		f.Wake()
	}
	return nil
}

// RequestRebuild records a rebuild request for the projection name in schema; the process running the
// projection performs it (see Projection.Rebuild). A name with no checkpoint in schema (a projection that never
// ran there, or a typo) is an error matching ErrUnknownProjection, and nothing is recorded. Once the start of the
// log is archived it is refused (eventstore.ErrArchived): see RequestRebuildFrom.
func RequestRebuild(ctx context.Context, db DB, schema, name string) error {
	return RequestRebuildFrom(ctx, db, schema, name, 0)
}

// RequestRebuildFrom is RequestRebuild from the events after position after (see Projection.RebuildFrom). A
// negative position is an error.
func RequestRebuildFrom(ctx context.Context, db DB, schema, name string, after int64) error {
	if after < 0 {
		return fmt.Errorf("projection: rebuild %q from position %d: must not be negative", name, after)
	}
	if err := checkArgs(schema, name); err != nil {
		return err
	}
	if err := eventstore.CheckLogFrom(ctx, db, schema, after); err != nil {
		return fmt.Errorf("projection: rebuild %q: %w", name, err)
	}
	n, err := logfollow.RequestReset(ctx, db, schema, name, after)
	if err != nil {
		return fmt.Errorf("projection: rebuild %q: %w", name, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %q has no checkpoint in schema %q", ErrUnknownProjection, name, schema)
	}
	return nil
}

// Wake makes the projection read the log now instead of at its next poll. Useful with the in-memory store,
// which sends no notifications.
func (p *Projection) Wake() {
	for _, f := range p.followers {
		f.Wake()
	}
}

// batchHandler returns the batch handler of the log follower of checkpoint: p.handle in a stagehand.projection.batch
// span.
func (p *Projection) batchHandler(checkpoint string) logfollow.Handler {
	return func(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
		ctx, span := p.startBatch(ctx, checkpoint, recs)
		err := p.handle(ctx, tx, recs)
		telemetry.RecordError(span, err)
		span.End()
		return err
	}
}

// handle is the log follower's batch handler: decode, then the user's handler, event by event, on one tx.
func (p *Projection) handle(ctx context.Context, tx pgx.Tx, recs []eventstore.Record) error {
	for _, r := range recs {
		e := Event{Record: r}
		if r.Type == eventstore.StreamDeletedType {
			if err := p.callDeleted(ctx, tx, e); err != nil {
				return fmt.Errorf("projection %s: deletion of stream %q (tenant %q) at position %d: %w", p.cfg.Name,
					r.StreamID, r.Tenant, r.Position, err)
			}
			continue
		}
		if p.reg != nil {
			d, err := p.reg.Decode(r)
			if err != nil {
				return stagehand.Permanent(err) // retrying cannot fix an undecodable event
			}
			e.Data = d
		}
		if err := p.callHandler(ctx, tx, e); err != nil {
			return fmt.Errorf("projection %s: event %q at position %d: %w", p.cfg.Name, r.Type, r.Position, err)
		}
	}
	return nil
}

func (p *Projection) callHandler(ctx context.Context, tx pgx.Tx, e Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return p.handler.Handle(ctx, tx, e)
}

func isDeleter(h Handler) bool {
	if m, ok := h.(*Mux); ok {
		return m.deletes()
	}
	_, ok := h.(StreamDeleter)
	return ok
}

func (p *Projection) callDeleted(ctx context.Context, tx pgx.Tx, e Event) (err error) {
	d, ok := p.handler.(StreamDeleter)
	if !ok {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("StreamDeleted panicked: %v", r)
		}
	}()
	return d.StreamDeleted(ctx, tx, e)
}

// reset runs in the follower's reset transaction.
func (p *Projection) reset(ctx context.Context, tx pgx.Tx) error {
	if r, ok := p.handler.(Resetter); ok {
		if err := r.Reset(ctx, tx); err != nil {
			return fmt.Errorf("projection %s: Reset: %w", p.cfg.Name, err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{p.cfg.Schema, "projection_parked"}.Sanitize()+
		` WHERE projection = $1`, p.cfg.Name); err != nil {
		return fmt.Errorf("projection %s: clear parked events: %w", p.cfg.Name, err)
	}
	return nil
}
