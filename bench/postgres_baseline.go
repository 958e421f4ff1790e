package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrOutOfStock is the baseline's refusal.
var ErrOutOfStock = errors.New("out of stock")

// PostgresReserver is the PostgreSQL-only reservation path Dropline is
// measured against: the obvious design without Redis. The stock row is
// decremented by a conditional UPDATE (the row lock makes check-and-deduct
// atomic, so it cannot oversell either) and the hold is inserted, in one
// transaction. It is a baseline for the benchmarks, not product code: no
// expiry, no idempotency, no quota.
type PostgresReserver struct {
	pool *pgxpool.Pool
}

// NewPostgresReserver creates the baseline's two tables (if absent) in the
// database of pool.
func NewPostgresReserver(ctx context.Context, pool *pgxpool.Pool) (*PostgresReserver, error) {
	_, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS baseline_stock (
			sku       text    PRIMARY KEY,
			available integer NOT NULL CHECK (available >= 0)
		);
		CREATE TABLE IF NOT EXISTS baseline_holds (
			id         bigserial   PRIMARY KEY,
			sku        text        NOT NULL REFERENCES baseline_stock (sku),
			principal  text        NOT NULL,
			quantity   integer     NOT NULL CHECK (quantity > 0),
			expires_at timestamptz NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now()
		);`)
	if err != nil {
		return nil, fmt.Errorf("creating the baseline tables: %w", err)
	}
	return &PostgresReserver{pool: pool}, nil
}

// SetStock creates or resets a SKU's available units.
func (r *PostgresReserver) SetStock(ctx context.Context, sku string, units int) error {
	_, err := r.pool.Exec(ctx, `INSERT INTO baseline_stock (sku, available) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET available = excluded.available`, sku, units)
	return err
}

// Reserve takes quantity units of sku for principal, or returns
// ErrOutOfStock.
func (r *PostgresReserver) Reserve(ctx context.Context, sku, principal string, quantity int, hold time.Duration) error {
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE baseline_stock SET available = available - $2 WHERE sku = $1 AND available >= $2`, sku, quantity)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrOutOfStock
		}
		_, err = tx.Exec(ctx, `INSERT INTO baseline_holds (sku, principal, quantity, expires_at) VALUES ($1, $2, $3, now() + $4::interval)`,
			sku, principal, quantity, hold)
		return err
	})
}

// Available reads a SKU's available units.
func (r *PostgresReserver) Available(ctx context.Context, sku string) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `SELECT available FROM baseline_stock WHERE sku = $1`, sku).Scan(&n)
	return n, err
}
