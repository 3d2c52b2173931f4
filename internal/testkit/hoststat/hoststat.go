package hoststat

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// CPU is the machine's cumulative CPU time in clock ticks, summed over all CPUs, at one moment.
type CPU struct {
	// Total is every state's time (user, nice, system, idle, iowait, irq, softirq, steal); guest time is already
	// counted in user and nice.
	Total uint64
	// Steal is the time the hypervisor ran something else while a virtual CPU was runnable.
	Steal uint64
	// Idle is the time no CPU had work (idle and iowait).
	Idle uint64
}

// Busy is the CPU time between earlier and c that ran this machine's own work (neither idle nor steal), in
// seconds of one CPU (USER_HZ, 100 ticks a second on Linux).
func (c CPU) Busy(earlier CPU) float64 {
	total, idle, steal := c.Total-earlier.Total, c.Idle-earlier.Idle, c.Steal-earlier.Steal
	if c.Total < earlier.Total || c.Idle < earlier.Idle || c.Steal < earlier.Steal || idle+steal > total {
		return 0
	}
	return float64(total-idle-steal) / ticksPerSecond
}

// ticksPerSecond is USER_HZ, the unit of /proc/stat: 100 on every Linux architecture Go runs on.
const ticksPerSecond = 100

// StealSince is the share (0 to 1) of the CPU time between earlier and c that was steal, or 0 when no time passed.
func (c CPU) StealSince(earlier CPU) float64 {
	if c.Total <= earlier.Total || c.Steal < earlier.Steal {
		return 0
	}
	return float64(c.Steal-earlier.Steal) / float64(c.Total-earlier.Total)
}

// ErrUnavailable is returned where /proc/stat cannot be read (a system other than Linux).
var ErrUnavailable = errors.New("hoststat: /proc/stat is not available")

// Read samples /proc/stat.
func Read() (CPU, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPU{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer func() { _ = f.Close() }()
	return parse(f)
}

// parse reads the aggregate "cpu" line of /proc/stat: "cpu user nice system idle iowait irq softirq steal guest
// guest_nice", where kernels before 2.6.11 stop before steal.
func parse(r io.Reader) (CPU, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "cpu" {
			continue
		}
		var c CPU
		for i, f := range fields[1:] {
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return CPU{}, fmt.Errorf("hoststat: /proc/stat field %d of the cpu line: %w", i+1, err)
			}
			c.Total += v
			switch i {
			case 3, 4: // idle, iowait
				c.Idle += v
			case 7:
				c.Steal = v
			}
		}
		return c, nil
	}
	if err := sc.Err(); err != nil {
		return CPU{}, fmt.Errorf("hoststat: read /proc/stat: %w", err)
	}
	return CPU{}, fmt.Errorf("%w: no cpu line", ErrUnavailable)
}

// Steal measures the steal share of an interval: call the returned function at its end. It reports -1 where the
// counters cannot be read.
func Steal() func() float64 {
	start, err := Read()
	return func() float64 {
		if err != nil {
			return -1
		}
		end, err := Read()
		if err != nil {
			return -1
		}
		return end.StealSince(start)
	}
}

// Percent formats a share from Steal for a report line: "steal 12%", or "steal unknown" for -1.
func Percent(share float64) string {
	if share < 0 {
		return "steal unknown"
	}
	return fmt.Sprintf("steal %.0f%%", share*100)
}
