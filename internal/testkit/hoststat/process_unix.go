//go:build unix

package hoststat

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time this process has used so far (user and system), or 0 where it cannot be read.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
