package db

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MaxDropSKUs bounds the SKUs of one drop: a reserve of a drop's SKU reads
// the buyer's count of every SKU of the drop in one script.
const MaxDropSKUs = 100

// ErrDropFull means the drop has MaxDropSKUs SKUs already.
var ErrDropFull = errors.New("the drop has the most SKUs a drop may have")

// Drop groups SKUs under one per-person limit and one sale window.
type Drop struct {
	ID           string
	Name         string
	MaxPerUser   int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	// Version rises with every SKU that joins; Redis keeps the newest.
	Version   int64
	CreatedAt time.Time
	// SKUs are the drop's products, in SKU order (filled by Drop).
	SKUs []string
}

const dropColumns = `id, name, max_per_user, sale_starts_at, sale_ends_at, version, created_at`

func scanDrop(row pgx.Row) (Drop, error) {
	var d Drop
	err := row.Scan(&d.ID, &d.Name, &d.MaxPerUser, &d.SaleStartsAt, &d.SaleEndsAt, &d.Version, &d.CreatedAt)
	return d, interpret(err)
}

// CreateDrop inserts a drop without SKUs; ErrExists when the id is taken.
func (dp Drops) CreateDrop(ctx context.Context, d Drop) (Drop, error) {
	out, err := scanDrop(dp.l.pool.QueryRow(ctx, `
		INSERT INTO drops (id, name, max_per_user, sale_starts_at, sale_ends_at)
		VALUES ($1, $2, $3, $4, $5) RETURNING `+dropColumns,
		d.ID, d.Name, d.MaxPerUser, d.SaleStartsAt, d.SaleEndsAt))
	if err != nil {
		return Drop{}, fmt.Errorf("creating drop %s: %w", d.ID, err)
	}
	out.SKUs = []string{}
	return out, nil
}

// CreateDropWith is CreateDrop for a drop sold behind an admission queue
// when q is not nil: every product that joins it later is queued.
func (dp Drops) CreateDropWith(ctx context.Context, d Drop, q *NewQueue) (Drop, error) {
	var out Drop
	err := dp.l.inTx(ctx, "create_drop", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = scanDrop(tx.QueryRow(ctx, `
			INSERT INTO drops (id, name, max_per_user, sale_starts_at, sale_ends_at)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+dropColumns,
			d.ID, d.Name, d.MaxPerUser, d.SaleStartsAt, d.SaleEndsAt))
		if err != nil {
			return err
		}
		if q != nil {
			return insertQueue(ctx, tx, "drop", d.ID, *q)
		}
		return nil
	})
	if err != nil {
		return Drop{}, fmt.Errorf("creating drop %s: %w", d.ID, err)
	}
	out.SKUs = []string{}
	return out, nil
}

// Drop returns a drop with its SKUs, read in one statement (one view of
// the drop and its members); ErrNotFound when there is none.
func (dp Drops) Drop(ctx context.Context, id string) (Drop, error) {
	list, err := dp.DropsByID(ctx, []string{id})
	if err != nil {
		return Drop{}, fmt.Errorf("reading drop %s: %w", id, err)
	}
	if len(list) == 0 {
		return Drop{}, fmt.Errorf("reading drop %s: %w", id, ErrNotFound)
	}
	return list[0], nil
}

// DropsByID returns the drops of several ids with their SKUs, in one
// statement; an unknown id has no entry. It exists for per-request
// batching.
func (dp Drops) DropsByID(ctx context.Context, ids []string) ([]Drop, error) {
	rows, err := dp.l.pool.Query(ctx, `SELECT `+dropColumns+`, coalesce(
			(SELECT array_agg(p.sku ORDER BY p.sku) FROM products p WHERE p.drop_id = drops.id), '{}')
		FROM drops WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("reading drops: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Drop, error) {
		var d Drop
		err := r.Scan(&d.ID, &d.Name, &d.MaxPerUser, &d.SaleStartsAt, &d.SaleEndsAt, &d.Version, &d.CreatedAt, &d.SKUs)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading drops: %w", interpret(err))
	}
	return out, nil
}

// joinDrop locks a drop's row for a SKU joining it and raises its version,
// so the drop's Redis copy is brought up to date with the new member.
func joinDrop(ctx context.Context, tx pgx.Tx, id string) error {
	var members int
	err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM products WHERE drop_id = $1)
		FROM drops WHERE id = $1 FOR UPDATE`, id).Scan(&members)
	if err != nil {
		return fmt.Errorf("drop %s: %w", id, interpret(err))
	}
	if members >= MaxDropSKUs {
		return ErrDropFull
	}
	_, err = tx.Exec(ctx, `UPDATE drops SET version = version + 1 WHERE id = $1`, id)
	return interpret(err)
}

// ProductDrop returns the drop a SKU belongs to ("" for none), or ErrNotFound
// for an unknown SKU.
func (dp Drops) ProductDrop(ctx context.Context, sku string) (string, error) {
	var drop string
	err := dp.l.pool.QueryRow(ctx, `SELECT coalesce(drop_id, '') FROM products WHERE sku = $1`, sku).Scan(&drop)
	if err != nil {
		return "", fmt.Errorf("reading the drop of %s: %w", sku, interpret(err))
	}
	return drop, nil
}
