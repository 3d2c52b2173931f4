package stagehand

import "errors"

// ErrPooledConnection is matched (errors.Is) by the error of a component that needs a session of its own and was
// given a pool whose connections go through a pooler that does not keep one: a relay or a log follower (a
// projection, a Deferred stager, a reconciler) listening for wake-up notifications (LISTEN) through PgBouncer in
// transaction pooling mode, where notifications never arrive. The error names the setting that turns listening
// off (outbox.RelayConfig.DisableNotify, projection.Config.DisableListen...); the other way is to give that
// component a pool with a direct connection to PostgreSQL, beside the pooled pool the application's transactions
// use (see the repository README, "Behind a connection pooler").
var ErrPooledConnection = errors.New("stagehand: the connection goes through a pooler that does not keep a session")

// PoolUse counts the long-running stagehand components of one process that share one pgxpool.Pool, for PoolSize.
// The outbox README's "Pool size" section explains every count.
type PoolUse struct {
	// RelaySubscriptions is the number of relay subscriptions: outbox.Relay.Subscribe and SubscribeTopics calls,
	// and handlers added with Relay.AddToRouter (one subscription each while the router runs).
	RelaySubscriptions int
	// RelayPartitions is the relays' outbox.RelayConfig.Partitions; 0 means 1.
	RelayPartitions int
	// RelayLeaderElection reports whether the relays use outbox.RelayConfig.LeaderElection.
	RelayLeaderElection bool
	// Followers is the number of log followers reading an event store on this pool: one per projection partition
	// (1 for an unpartitioned projection), Deferred stager and reconciler.
	Followers int
	// InboxHandlers is how many inbox-wrapped handler runs can be under way at once. A Watermill router runs each
	// message its subscriber hands over in a goroutine of its own, so this is what the subscribers have in flight:
	// a broker's prefetch or max-ack-pending per subscription; on gochannel with BlockPublishUntilSubscriberAck,
	// what its publishers have in flight (a relay's MaxDegreeOfParallelism); on gochannel without it, no bound.
	InboxHandlers int
	// Other is what the application holds at once besides: its own transactions (a repository Save or Update
	// holds one connection while it runs, so count the concurrent requests that save), health checks, admin
	// calls.
	Other int
}

// Connections each component holds at once, the terms of PoolSize.
const (
	poolPerRelayPartition = 2 // a claim loop's claim and mark, which run concurrently
	poolPerRelay          = 1 // row-lease renewals, vacuums, failure records and maintenance, which come and go
	poolRelayLeader       = 1 // leader-lease renewals
	poolPerFollower       = 3 // the batch's transaction, the next page's read, lease renewals
	poolPerInboxHandler   = 1 // the handler's transaction
)

// PoolSize returns the pool size (pgxpool's MaxConns) at which the components counted by u never wait for each
// other's connections:
//
//	RelaySubscriptions × (2 × RelayPartitions + 1 + (1 with RelayLeaderElection))
//	+ 3 × Followers + InboxHandlers + Other
//
// A smaller pool still works, down to one connection, with statements queuing for connections (latency, and lease
// renewals that may arrive late enough to lose a lease): no component holds one connection while it waits for
// another. Negative counts count as 0. The LISTEN connections of relays
// and followers are opened beside the pool (one per relay subscription and per follower, unless notifications are
// disabled): the server's max_connections must hold them too.
func PoolSize(u PoolUse) int {
	partitions := max(1, u.RelayPartitions)
	relay := poolPerRelayPartition*partitions + poolPerRelay
	if u.RelayLeaderElection {
		relay += poolRelayLeader
	}
	return max(0, u.RelaySubscriptions)*relay + poolPerFollower*max(0, u.Followers) +
		poolPerInboxHandler*max(0, u.InboxHandlers) + max(0, u.Other)
}
