package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/stagehand-es/stagehand/internal/lease"
)

// Errors of leader-elected (fenced) relays; see RelayConfig.LeaderElection.
var (
	// ErrFenced is matched by a *FencedError: a relay that lost its leadership tried to claim or mark rows.
	ErrFenced = errors.New("outbox: fenced out")
	// ErrCannotFence is matched by a *CannotFenceError: leader election is configured, but the database cannot
	// fence the relay's writes, so the relay refuses to start rather than drain unfenced.
	ErrCannotFence = errors.New("outbox: leader election configured but the relay cannot be fenced")
	// ErrNotLeader is returned by Drain under leader election when another relay leads every partition.
	ErrNotLeader = errors.New("outbox: another relay is the leader")
)

// FencedError reports a relay write rejected because the relay's leadership term is over: another relay took the
// leader lease (a higher fencing token), or it was released. The rows it concerned stay in the outbox for the new
// leader. It matches ErrFenced.
type FencedError struct {
	// Op is the rejected write: "mark sent", "backoff", "dead-letter move", "release" or "lease renewal".
	Op string
	// Lease is the leader lease's name; Token and Owner are this relay's, CurrentToken and CurrentOwner the
	// lease's now (0 and "" when the lease row is gone).
	Lease               string
	Token, CurrentToken int64
	Owner, CurrentOwner string
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("outbox: %s rejected: relay %q was demoted (leader lease %q has token %d, held by %q; the "+
		"relay's token is %d)", e.Op, e.Owner, e.Lease, e.CurrentToken, e.CurrentOwner, e.Token)
}

// Is reports whether target is ErrFenced.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// CannotFenceError names the reason a leader-elected relay cannot be fenced. It matches ErrCannotFence.
type CannotFenceError struct {
	// Lease is the leader lease name (RelayConfig.LeaderElection).
	Lease string
	// Reason says what is missing, and how to fix it.
	Reason string
}

func (e *CannotFenceError) Error() string {
	return fmt.Sprintf("outbox: leader election %q configured but the relay cannot be fenced: %s (run "+
		"stagehand.Migrate and grant the privileges, or set RelayConfig.SingleWriter without LeaderElection if "+
		"exactly one relay drains this outbox)", e.Lease, e.Reason)
}

// Is reports whether target is ErrCannotFence.
func (e *CannotFenceError) Is(target error) bool { return target == ErrCannotFence }

// fenceLoss is how a term learnt it was fenced out: the error reported to the caller, and the lease package's
// error, which makes lease.Manager.Run contend again.
type fenceLoss struct {
	err      *FencedError
	leaseErr error
}

// checkFenceable fails fast when leader election is configured but the database cannot fence the relay's writes:
//   - the leases table is missing (stagehand.Migrate was not run on this schema);
//   - the relay's role cannot lock its rows (FOR SHARE needs SELECT and UPDATE on the leases table);
//   - the session is read-only (a hot standby, or default_transaction_read_only), where no lease can be taken.
//
// It runs once per relay, at the first Subscribe or Drain.
func (r *Relay) checkFenceable(ctx context.Context) error {
	if r.leases == nil || r.fenceChecked.Load() {
		return nil
	}
	reason, err := lease.Fenceable(ctx, r.o.pool, r.o.schema)
	if err != nil {
		return fmt.Errorf("outbox: checking that the relay can be fenced: %w", err)
	}
	if reason != "" {
		return &CannotFenceError{Lease: r.s.LeaderElection, Reason: reason}
	}
	r.fenceChecked.Store(true)
	return nil
}

// leaseName is the leader lease of partition p.
func (r *Relay) leaseName(p int) string {
	if r.s.Partitions == 1 {
		return r.s.LeaderElection
	}
	return fmt.Sprintf("%s/%d", r.s.LeaderElection, p)
}
