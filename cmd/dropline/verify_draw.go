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
// entries, as read from the ledger (DATABASE_URL), and compares it with the
// result the ledger records (drawverify.Check).
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
	l := db.NewLedger(pool)
	d, err := l.Draw(ctx, *sku)
	if err != nil {
		return fmt.Errorf("reading the draw of %s: %w", *sku, err)
	}
	if d.Status != db.DrawDrawn {
		return fmt.Errorf("the draw of %s is %s: its seed is revealed only once it is drawn", *sku, d.Status)
	}
	entries, err := l.DrawEntries(ctx, *sku)
	if err != nil {
		return fmt.Errorf("reading the entries of %s: %w", *sku, err)
	}
	return drawverify.Check(e.stdout, d, entries)
}
