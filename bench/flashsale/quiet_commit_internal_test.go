package flashsale

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestP99RankIsPercentiles says which commit, from the slowest, the p99
// is, for the sample sizes the rehearsal uses: the slowest of 30, the 4th
// slowest of 300.
func TestP99RankIsPercentiles(t *testing.T) {
	for n, want := range map[int]int{1: 1, 30: 1, 99: 1, 100: 2, 300: 4, 352: 4, 5000: 51} {
		require.Equal(t, want, p99Rank(n), "n=%d", n)
	}
	require.Zero(t, p99Rank(0))
	for n := 1; n <= 1000; n++ {
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i+1) * time.Millisecond
		}
		require.Equal(t, s[n-p99Rank(n)], Percentile(s, 0.99), "n=%d", n)
	}
	require.Equal(t, "the slowest", rankWord(1))
	require.Equal(t, "the 2nd slowest", rankWord(2))
	require.Equal(t, "the 4th slowest", rankWord(4))
	require.Equal(t, "the 12th slowest", rankWord(12))
	require.Equal(t, "the 21st slowest", rankWord(21))
	require.Equal(t, "the 51st slowest", rankWord(51))
}

// TestQuietCommitsDefaultIsASample checks that the default number of quiet
// commits makes their p99 something other than their slowest one.
func TestQuietCommitsDefaultIsASample(t *testing.T) {
	require.Greater(t, p99Rank(DefaultConfig().QuietCommits), 1)
}
