package testenv

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user and system) the test process has used so
// far: a benchmark reports the difference per operation.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
