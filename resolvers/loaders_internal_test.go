package resolvers

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// An operation's loaders are made when a resolver first asks for one, and
// that one serves the rest of the operation: an operation that reads no
// stock, product, drop or draw (a reserve, a commit) builds none.
func TestLoadersAreMadeOnFirstUse(t *testing.T) {
	l := loadersFrom(withLoaders(context.Background(), &inventory.Engine{}))
	require.Nil(t, l.stockL)
	require.Nil(t, l.productL)
	require.Nil(t, l.dropL)
	require.Nil(t, l.drawL)
	s := l.stock()
	require.NotNil(t, s)
	require.Same(t, s, l.stock())
	require.Nil(t, l.productL, "asking for one makes only that one")
	require.Nil(t, l.dropL)
	require.Same(t, l.product(), l.product())
	require.Same(t, l.drop(), l.drop())
	require.Same(t, l.draw(), l.draw())
}
