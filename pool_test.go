package stagehand_test

import (
	"testing"

	"github.com/stagehand-es/stagehand"
)

// PoolSize adds what each component holds at once: a relay subscription 2 per partition plus 1 (plus 1 under
// leader election), a follower 3, an inbox handler 1, and the application's own.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		use  stagehand.PoolUse
		want int
	}{
		{"nothing", stagehand.PoolUse{}, 0},
		{"one relay", stagehand.PoolUse{RelaySubscriptions: 1}, 3},
		{"partitions 0 means 1", stagehand.PoolUse{RelaySubscriptions: 1, RelayPartitions: 0}, 3},
		{"four partitions, elected", stagehand.PoolUse{RelaySubscriptions: 1, RelayPartitions: 4,
			RelayLeaderElection: true}, 10},
		{"two subscriptions", stagehand.PoolUse{RelaySubscriptions: 2, RelayPartitions: 2}, 10},
		{"a projection", stagehand.PoolUse{Followers: 1}, 3},
		{"the library-loans service", stagehand.PoolUse{RelaySubscriptions: 1, Followers: 1, InboxHandlers: 4,
			Other: 4}, 14},
		{"negative counts count nothing", stagehand.PoolUse{RelaySubscriptions: -1, Followers: -2,
			InboxHandlers: -3, Other: -4}, 0},
	} {
		if got := stagehand.PoolSize(c.use); got != c.want {
			t.Errorf("%s: PoolSize(%+v) = %d, want %d", c.name, c.use, got, c.want)
		}
	}
}
