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
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
	}
	require.Greater(t, SelfCPU()-self0, 50*time.Millisecond)
	require.Greater(t, CPUSince(before, CPUByPid([]int{pid})), time.Duration(0))
	require.Equal(t, time.Duration(0), PidCPU(-1), "a process that does not exist reads 0")
	require.Empty(t, CPUByPid([]int{-1}), "and is left out of a reading")
	require.NotEqual(t, "unknown", LoadAverage())
}
