package outbox

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stagehand-es/stagehand/eventstore"
)

// DefaultContentionRetries is how many times by default an inbox reruns a handler at once after contention
// (InboxConfig.ContentionRetries).
const DefaultContentionRetries = 10

// contention reports whether a handler run failed because of concurrent work on the same data rather than because
// of the message: an optimistic-concurrency conflict that escaped the handler (it matches
// eventstore.ErrConcurrencyConflict), or PostgreSQL rolling the transaction back for a serialization failure
// (40001) or a deadlock (40P01), in the handler or at the inbox's commit. Rerunning such a run can succeed; it says
// nothing about the message being poison.
func contention(err error) bool {
	if errors.Is(err, eventstore.ErrConcurrencyConflict) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// contentionPause is the jittered pause before rerun n (0-based) after contention: up to n+1 ms, so racing
// handlers spread out.
func contentionPause(n int) time.Duration {
	return time.Duration(rand.Int64N(int64(time.Millisecond)*int64(n+1))) + 200*time.Microsecond
}
