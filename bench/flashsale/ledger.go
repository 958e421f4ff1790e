package flashsale

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LedgerReader reads one SKU's state straight from Dropline's Postgres
// ledger. It deliberately uses its own SQL rather than package db: a checker
// that shared the product's queries would share their bugs.
type LedgerReader struct {
	pool *pgxpool.Pool
}

// OpenLedger connects to the ledger at url.
func OpenLedger(ctx context.Context, url string) (*LedgerReader, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the ledger: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to the ledger: %w", err)
	}
	return &LedgerReader{pool: pool}, nil
}

// Close closes the pool.
func (r *LedgerReader) Close() { r.pool.Close() }

// ErrNoProduct means the SKU has no products row.
var ErrNoProduct = errors.New("no such product in the ledger")

// Read returns the ledger state of sku in one repeatable-read snapshot, so
// the products row, the holds and the sales are from the same instant.
// Sales whose token is in baseline are left out of Sales (they predate the
// drop).
func (r *LedgerReader) Read(ctx context.Context, sku string, baseline map[string]int) (LedgerState, error) {
	var s LedgerState
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT total, sold FROM products WHERE sku = $1`, sku).Scan(&s.Total, &s.Sold)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoProduct
		}
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT coalesce(sum(quantity), 0) FROM reservations WHERE sku = $1 AND status = 'HELD'`,
			sku).Scan(&s.Held); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT token, quantity FROM sales WHERE sku = $1`, sku)
		if err != nil {
			return err
		}
		s.Sales = map[string]int{}
		var tok string
		var q int
		_, err = pgx.ForEachRow(rows, []any{&tok, &q}, func() error {
			s.SalesUnits += q
			if _, old := baseline[tok]; !old {
				s.Sales[tok] = q
			}
			return nil
		})
		return err
	})
	if err != nil {
		return LedgerState{}, fmt.Errorf("reading the ledger of %s: %w", sku, err)
	}
	return s, nil
}

// sameLedger compares two readings, sales included.
func sameLedger(a, b LedgerState) bool {
	return a.Total == b.Total && a.Sold == b.Sold && a.Held == b.Held && a.SalesUnits == b.SalesUnits &&
		maps.Equal(a.Sales, b.Sales)
}

// agrees reports whether the live stock and the ledger tell the same story.
func agrees(api Stock, l LedgerState) bool {
	return api.Total == l.Total && api.Sold == l.Sold && api.Held == l.Held && api.Available == l.Total-l.Sold-l.Held
}
