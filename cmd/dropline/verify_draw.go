package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/drawverify"
)

// verifyDraw recomputes a drawn SKU's result from its revealed seed and its
// entries, as read from the ledger (DATABASE_URL), compares it with the
// result the ledger records, and checks what the draw handed out
// (drawverify.Verify).
func (e env) verifyDraw(ctx context.Context, args []string) error {
	fs := e.flags("verify-draw", "verify-draw --sku S")
	sku := fs.String("sku", "", "the SKU whose draw to verify")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if *sku == "" {
		return usageError{errors.New("--sku is required")}
	}
	cfg, err := config.Load(e.getenv)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("connecting to the database: %w", err)
	}
	defer pool.Close()
	return drawverify.Verify(ctx, e.stdout, db.NewLedger(pool), *sku)
}
