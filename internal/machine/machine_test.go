package machine

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCPUReadingsGrowWithWork: this process's CPU, read both ways, grows
// while it works, and CPUSince counts it.
func TestCPUReadingsGrowWithWork(t *testing.T) {
	pid := os.Getpid()
	before, self0 := CPUByPid([]int{pid}), SelfCPU()
	// Spin until the reading shows 50 ms of work, not for a wall-clock
	// time: on a loaded machine 100 ms of wall time can be 40 ms of CPU.
	// A reading that never grows fails at the deadline.
	for end := time.Now().Add(10 * time.Second); SelfCPU()-self0 < 50*time.Millisecond && time.Now().Before(end); {
	}
	require.GreaterOrEqual(t, SelfCPU()-self0, 50*time.Millisecond)
	require.Greater(t, CPUSince(before, CPUByPid([]int{pid})), time.Duration(0))
	require.Equal(t, time.Duration(0), PidCPU(-1), "a process that does not exist reads 0")
	require.Empty(t, CPUByPid([]int{-1}), "and is left out of a reading")
	require.NotEqual(t, "unknown", LoadAverage())
}

// TestReadBusyGrows: the machine's CPU time grows, its busy share
// stays within 0..1.
func TestReadBusyGrows(t *testing.T) {
	b0 := ReadBusy()
	self0 := SelfCPU()
	for end := time.Now().Add(10 * time.Second); SelfCPU()-self0 < 50*time.Millisecond && time.Now().Before(end); {
	}
	b1 := ReadBusy()
	require.Greater(t, b1.Total, b0.Total)
	require.GreaterOrEqual(t, b1.Busy, b0.Busy)
	share := b1.Since(b0)
	require.True(t, share > 0 && share <= 1, "busy share %v", share)
}
