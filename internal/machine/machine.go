// Package machine reads what the benchmarks report about the machine they
// ran on: the CPU time of processes (this one, a child, a database backend)
// and the load average, so that a figure taken on a busy machine says so.
// On a system without /proc or getrusage the readings are 0 and "unknown".
package machine

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// PidCPU is the user plus system CPU time process pid has used so far
// (/proc/PID/stat), or 0 when it cannot be read: a process that is gone, or
// one on another machine.
func PidCPU(pid int) time.Duration {
	d, _ := pidCPU(pid)
	return d
}

// CPUByPid reads PidCPU of each process it can read; one it cannot is left
// out, so that CPUSince never counts a process that went away as negative.
func CPUByPid(pids []int) map[int]time.Duration {
	out := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if d, ok := pidCPU(pid); ok {
			out[pid] = d
		}
	}
	return out
}

func pidCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; fields count from after it.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	// USER_HZ is 100 on every Linux this runs on.
	return time.Duration(utime+stime) * 10 * time.Millisecond, true
}

// CPUSince is the CPU time the processes of now used since before, two
// readings of CPUByPid; a process seen only in now counts from its start.
func CPUSince(before, now map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, t := range now {
		d += t - before[pid]
	}
	return d
}

// LoadAverage is the machine's 1, 5 and 15 minute load average, or
// "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
