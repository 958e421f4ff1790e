package inventory

import (
	"github.com/dropline/dropline/inventory/script"

	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

// engineWithProduct is an engine on a Redis key prefix and a PostgreSQL
// database of its own, with one product an admin made.
func engineWithProduct(t *testing.T, product ProductInput) (*Engine, testenv.RedisEnv) {
	t.Helper()
	ctx := context.Background()
	r := testenv.Redis(t)
	e, err := NewEngine(ctx, Config{KeyPrefix: r.Prefix}, r.Client, testenv.Postgres(t), zerolog.Nop())
	require.NoError(t, err)
	_, err = e.Catalog().CreateProduct(ctx, Principal{ID: "admin", Admin: true}, product)
	require.NoError(t, err)
	return e, r
}

// plainReserveCall is the call Reserve would queue in partition p for qty
// units of sku by who, held 60 s, under a new token, with no idempotency key
// and no budget.
func plainReserveCall(e *Engine, p int, sku, who string, qty int) *reserveCall {
	tok := newToken(p)
	return &reserveCall{req: script.ReserveRequest{SKU: sku, Principal: who, Quantity: qty, HoldMs: 60_000, Token: tok,
		Budget: [3]any{"", "", ""}}}
}
