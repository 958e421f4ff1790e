package machine

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// Busy is the CPU time the whole machine has spent (every core, every
// process) and how much of it was busy, from /proc/stat's first line; zeros
// where there is no /proc. Two readings' difference says whether the
// machine's cores were saturated between them: Busy/Total near 1 means
// every process waited for a core.
type Busy struct {
	Busy, Total time.Duration
}

// ReadBusy reads Busy now.
func ReadBusy() Busy {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Busy{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return Busy{}
	}
	var total, idle int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 {
			break // guest times are counted in user already
		}
		total += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	tick := 10 * time.Millisecond // USER_HZ
	return Busy{Busy: time.Duration(total-idle) * tick, Total: time.Duration(total) * tick}
}

// Since is the machine's busy share, from 0 to 1, between before and b.
func (b Busy) Since(before Busy) float64 {
	if t := b.Total - before.Total; t > 0 {
		return float64(b.Busy-before.Busy) / float64(t)
	}
	return 0
}
