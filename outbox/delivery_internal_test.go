package outbox

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A worker's ack-deadline timer is reused from one delivery to the next: a deadline that fired during one delivery,
// unread because the ack won the race, must not end the next at once. With Go 1.23's timers stopping is enough;
// with the older ones (GODEBUG asynctimerchan=1, which a program may set) the fired value stays in the channel
// unless stopTimer empties it. The test runs itself again under that setting.
func TestReusedTimerForgetsADeadlineThatFired(t *testing.T) {
	if os.Getenv("STAGEHAND_TIMER_CHILD") == "" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run", "^TestReusedTimerForgetsADeadlineThatFired$", "-test.count", "1")
		cmd.Env = append(os.Environ(), "STAGEHAND_TIMER_CHILD=1", "GODEBUG=asynctimerchan=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	timer := time.NewTimer(time.Millisecond)
	time.Sleep(20 * time.Millisecond) // fired, and nobody read it
	stopTimer(timer)
	timer.Reset(time.Hour)
	select {
	case <-timer.C:
		t.Fatal("the next delivery saw the previous deadline")
	case <-time.After(50 * time.Millisecond):
	}
	stopTimer(timer)
}
