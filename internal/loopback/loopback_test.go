package loopback

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The ports handed out lie below the kernel's range for outgoing
// connections, can be listened on, and so can their offsets.
func TestFreePortIsBelowTheOutgoingRangeAndFree(t *testing.T) {
	low := ephemeralLow()
	require.Greater(t, low-10000, lowest+1000, "this machine leaves room below its range (%d)", low)
	seen := map[int]bool{}
	for range 200 {
		p, err := FreePort(10000)
		require.NoError(t, err)
		require.GreaterOrEqual(t, p, lowest)
		require.Less(t, p+10000, low, "the bus port too is below the range")
		for _, q := range []int{p, p + 10000} {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(q)))
			require.NoError(t, err, "port %d is free", q)
			require.NoError(t, l.Close())
		}
		seen[p] = true
	}
	require.Greater(t, len(seen), 150, "ports are spread, not one reused")
}

// A port someone listens on, or whose offset someone listens on, is not free.
func TestAPortInUseIsNotFree(t *testing.T) {
	p, err := FreePort(7)
	require.NoError(t, err)
	require.True(t, free(p, nil) && free(p+7, nil), "both free before")
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err)
	defer l.Close()
	require.False(t, free(p, nil))
	require.False(t, free(p+7, []int{-7}), "its offset is in use")
}
