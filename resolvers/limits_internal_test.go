package resolvers

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The zero limits take the exported defaults (which config's settings
// default to), and a rate without a burst gets twice the rate.
func TestLimitDefaults(t *testing.T) {
	l := Limits{}.withDefaults()
	require.Equal(t, DefaultMutationRate, l.MutationRate)
	require.Equal(t, DefaultMutationBurst, l.MutationBurst)
	require.Equal(t, 200, Limits{MutationRate: 100}.withDefaults().MutationBurst)
	require.Equal(t, 7, Limits{MutationRate: 100, MutationBurst: 7}.withDefaults().MutationBurst)
}
