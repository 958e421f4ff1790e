package resolvers

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// The zero limits take the exported defaults (which config's settings
// default to), and a rate without a burst gets twice the rate, but never a
// burst too small for the largest cart.
func TestLimitDefaults(t *testing.T) {
	l := Limits{}.withDefaults()
	require.Equal(t, DefaultMutationRate, l.MutationRate)
	require.Equal(t, DefaultMutationBurst, l.MutationBurst)
	require.Equal(t, inventory.MaxCartLines, DefaultMutationBurst, "a cart of 50 lines spends 50 units")
	require.Equal(t, 200, Limits{MutationRate: 100}.withDefaults().MutationBurst)
	require.Equal(t, inventory.MaxCartLines, Limits{MutationRate: 3}.withDefaults().MutationBurst)
	require.Equal(t, 7, Limits{MutationRate: 100, MutationBurst: 7}.withDefaults().MutationBurst)
}
