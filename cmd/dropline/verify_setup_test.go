package main

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
	"github.com/dropline/dropline/inventory"
)

// verifySetup is where the verify commands' tests start: a database and a
// Redis prefix of their own, an engine over both, and one product, made by
// an admin.
type verifySetup struct {
	ctx   context.Context
	dbURL string
	r     testenv.RedisEnv
	pool  *pgxpool.Pool
	e     *inventory.Engine
}

func newVerifySetup(t *testing.T, product inventory.ProductInput) verifySetup {
	t.Helper()
	s := verifySetup{ctx: context.Background(), dbURL: testenv.NewDatabase(t), r: testenv.Redis(t)}
	var err error
	s.pool, err = pgxpool.New(s.ctx, s.dbURL)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	s.e, err = inventory.NewEngine(s.ctx, inventory.Config{KeyPrefix: s.r.Prefix}, s.r.Client, s.pool, zerolog.Nop())
	require.NoError(t, err)
	_, err = s.e.Catalog().CreateProduct(s.ctx, inventory.Principal{ID: "ops", Admin: true}, product)
	require.NoError(t, err)
	return s
}
