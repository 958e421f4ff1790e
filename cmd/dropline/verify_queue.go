package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/config"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/inventory/queue"
)

// verifyQueue recomputes a queue's pre-queue order from its revealed seed
// (DATABASE_URL) and the principals its numbers name (REDIS_URL), and
// compares them (queue.Service.VerifyPreQueue).
func (e env) verifyQueue(ctx context.Context, args []string) error {
	fs := e.flags("verify-queue", "verify-queue --sku S | --drop D")
	sku := fs.String("sku", "", "the product whose queue to verify")
	drop := fs.String("drop", "", "the drop whose queue to verify")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	ref := queue.Ref{Kind: queue.OfProduct, ID: *sku}
	switch {
	case (*sku == "") == (*drop == ""):
		return usageError{errors.New("give one of --sku and --drop")}
	case *drop != "":
		ref = queue.Ref{Kind: queue.OfDrop, ID: *drop}
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
	opts, err := cfg.RedisOptions()
	if err != nil {
		return fmt.Errorf("%s: %w", config.EnvRedisURL, err)
	}
	rdb := opts.NewClient()
	defer func() { _ = rdb.Close() }()
	engine, err := inventory.NewEngine(ctx, inventory.Config{KeyPrefix: cfg.KeyPrefix}, rdb, pool, zerolog.Nop())
	if err != nil {
		return err
	}
	v, err := queue.New(queue.Config{}, rdb, engine).VerifyPreQueue(ctx, ref)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "queue %s verified: %d pre-queue tickets numbered as seed %s... gives\n", ref, v.PreQueue, v.SeedHash[:16])
	return nil
}
