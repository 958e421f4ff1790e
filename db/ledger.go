package db

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// Errors the ledger translates from Postgres, so callers never see pgx types.
var (
	// ErrNotFound means the row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists means a row with the same key exists already.
	ErrExists = errors.New("already exists")
	// ErrWouldOversell means the sale would take sold above total; Postgres
	// refused it. It can only happen after Redis lost state it had promised.
	ErrWouldOversell = errors.New("sale would exceed the total stock")
	// ErrInvalid means Postgres rejected the values (a CHECK constraint).
	ErrInvalid = errors.New("invalid values")
	// ErrRefused means Postgres answered and refused the statement on its
	// values (a data exception, a constraint, a malformed statement): sending
	// the same values again fails the same way, unlike an outage. Errors that
	// wrap it may wrap ErrInvalid or ErrNotFound as well.
	ErrRefused = errors.New("refused by Postgres")
	// ErrEnded means the reservation is CANCELLED or EXPIRED in the ledger:
	// it can no longer be sold. EndedError says which.
	ErrEnded = errors.New("the reservation has ended")
	// ErrSchemaBehind means the database lacks a table, column or function
	// this version uses: a migration is not applied yet (`dropline migrate`).
	// It is not a refusal of the values: the same statement succeeds once the
	// schema is current.
	ErrSchemaBehind = errors.New("the database schema is behind this version: run `dropline migrate`")
)

// EndedError is ErrEnded with the status the ledger has.
type EndedError struct {
	Status string // StatusCancelled or StatusExpired
}

func (e *EndedError) Error() string { return "the reservation is " + e.Status + " in the ledger" }

// Is makes errors.Is(err, ErrEnded) true.
func (e *EndedError) Is(target error) bool { return target == ErrEnded }

// Ledger is Dropline's durable record in PostgreSQL: the catalogue, the
// reservations, the sales and the stock movements.
type Ledger struct {
	pool *pgxpool.Pool
	// tracer is nil unless Traced gave the ledger one.
	tracer trace.Tracer
	// copyMinRows is the fewest fresh reservations for which ApplyEvents
	// writes them by COPY (applyRowsCopy); copied counts those batches.
	copyMinRows int
	copied      *atomic.Int64
	// sales gathers concurrent sales into batches (sale_batcher.go);
	// salePool writes them: pool, unless WithSalePool gave one.
	sales    *saleBatcher
	salePool *pgxpool.Pool
	// snapshots holds a slot for each snapshot in flight (WithSnapshot):
	// half the pool's connections, so that each has one for its seal.
	snapshots chan struct{}
}

// NewLedger wraps a pool. The pool is the caller's to close.
func NewLedger(pool *pgxpool.Pool) *Ledger {
	l := &Ledger{pool: pool, salePool: pool, copyMinRows: defaultCopyMinRows, copied: new(atomic.Int64),
		snapshots: make(chan struct{}, snapshotSlots(pool.Config().MaxConns))}
	l.sales = newSaleBatcher(l)
	return l
}

// SaleConns is how many connections a pool of its own for the sales
// (WithSalePool) needs: one for each batch of sales on its way. The sales
// of a refused batch, retried one by one when a SKU sells out, share them
// too, so those retries wait for each other.
const SaleConns = saleBatchesInFlight

// WithSalePool returns a ledger that writes its sales (RecordSale's
// batches, and the sales then written alone) over pool, and everything
// else over l's: a commit then never waits for a connection behind the
// write-behind's batches, the cancels' releases or the reads. The pool is
// the caller's to close, and needs SaleConns connections. Nil: l itself.
func (l *Ledger) WithSalePool(pool *pgxpool.Pool) *Ledger {
	if pool == nil {
		return l
	}
	c := *l
	c.salePool = pool
	c.sales = newSaleBatcher(&c)
	return &c
}

// Product is one row of the catalogue.
type Product struct {
	SKU           string
	Name          string
	PriceAmount   int64
	PriceCurrency string
	Total         int
	Sold          int
	// MaxPerUser is 0 when a principal may buy any number of units.
	MaxPerUser   int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	Version      int64
	CreatedAt    time.Time
	UpdatedAt    time.Time
	// DropID is the drop the product joined when it was created ("" for
	// none); it never changes.
	DropID string
	// Draw is true for a product sold by draw (draws.go): Redis refuses its
	// reserves. It is set at creation only.
	Draw bool
	// Queued is true for a product sold behind an admission queue (its own,
	// or its drop's: queues.go): Redis asks a reserve of it for a pass. Set
	// at creation only.
	Queued bool
}

// ProductUpdate changes some settings of a product; nil fields stay as they are.
type ProductUpdate struct {
	Name          *string
	PriceAmount   *int64
	PriceCurrency *string
	// MaxPerUser 0 removes the limit.
	MaxPerUser *int
	// SaleStartsAt and SaleEndsAt: a pointer to the zero time clears the bound.
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
}

const productColumns = `sku, name, price_amount, price_currency, total, sold, coalesce(max_per_user, 0),
	sale_starts_at, sale_ends_at, version, created_at, updated_at, coalesce(drop_id, ''), draw, queued`

func scanProduct(row pgx.Row) (Product, error) {
	var p Product
	err := row.Scan(&p.SKU, &p.Name, &p.PriceAmount, &p.PriceCurrency, &p.Total, &p.Sold, &p.MaxPerUser,
		&p.SaleStartsAt, &p.SaleEndsAt, &p.Version, &p.CreatedAt, &p.UpdatedAt, &p.DropID, &p.Draw, &p.Queued)
	return p, interpret(err)
}

// interpret turns pgx and Postgres errors into the ledger's own.
func interpret(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == fencedCode:
			return ErrFenced
		case schemaBehind(pgErr.Code):
			return fmt.Errorf("%w: %w", ErrSchemaBehind, err)
		case pgErr.Code == "23505":
			return fmt.Errorf("%w: %s", ErrExists, pgErr.ConstraintName)
		case pgErr.Code == "23514" && pgErr.ConstraintName == "products_not_oversold":
			return ErrWouldOversell
		case pgErr.Code == "23514" || pgErr.Code == "23502" || pgErr.Code == "22001" || pgErr.Code == "22003":
			return fmt.Errorf("%w: %s", ErrInvalid, pgErr.ConstraintName)
		case pgErr.Code == "23503":
			return fmt.Errorf("%w: %s", ErrNotFound, pgErr.ConstraintName)
		case refusedClass(pgErr.Code):
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	return err
}

// fencedCode is the SQLSTATE worker_fence raises for a fenced-off writer
// (migration 0009).
const fencedCode = "DL001"

// schemaBehind reports whether an SQLSTATE says an object the statement
// names does not exist (undefined table, column or function): the database
// is behind this version's migrations, which `dropline serve` starts with
// (its workers run while /readyz waits for them).
func schemaBehind(code string) bool {
	switch code {
	case "42P01", "42703", "42883":
		return true
	}
	return false
}

// refusedClass reports whether an SQLSTATE says the statement itself is
// wrong (class 22 data exception, 23 integrity, 42 syntax or undefined
// object) rather than the server being unavailable or busy (08 connection,
// 40 serialization, 53 resources, 55 lock, 57 shutdown or cancel, ...).
func refusedClass(code string) bool {
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "22", "23", "42":
		return true
	}
	return false
}

func nullInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

// CreateProduct inserts a product and records its initial stock as a movement.
// A product with a DropID joins that drop: the drop's row is locked and its
// version raised in the same transaction (ErrNotFound for an unknown drop,
// ErrDropFull when it has MaxDropSKUs already).
func (l *Ledger) CreateProduct(ctx context.Context, p Product) (Product, error) {
	return l.CreateProductWithDraw(ctx, p, nil)
}

// CreateProductWithDraw is CreateProduct for a product sold by draw when d
// is not nil: the product and its draw are one transaction.
func (l *Ledger) CreateProductWithDraw(ctx context.Context, p Product, d *NewDraw) (Product, error) {
	return l.CreateProductWith(ctx, p, d, nil)
}

// CreateProductWith is CreateProduct for a product sold by draw when d is
// not nil, or behind its own admission queue when q is not nil (queues.go):
// the product and its draw or queue are one transaction. A product that
// joins a queued drop is queued too (its drop's queue), and may not be sold
// by draw.
func (l *Ledger) CreateProductWith(ctx context.Context, p Product, d *NewDraw, q *NewQueue) (Product, error) {
	var out Product
	err := l.inTx(ctx, "create_product", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		if p.DropID != "" {
			if err := joinDrop(ctx, tx, p.DropID); err != nil {
				return err
			}
		}
		var err error
		out, err = scanProduct(tx.QueryRow(ctx, `
			INSERT INTO products (sku, name, price_amount, price_currency, total, max_per_user, sale_starts_at, sale_ends_at, drop_id, draw, queued)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), $10,
				$11 OR EXISTS (SELECT 1 FROM queues WHERE drop_id = nullif($9, '')))
			RETURNING `+productColumns,
			p.SKU, p.Name, p.PriceAmount, p.PriceCurrency, p.Total, nullInt(p.MaxPerUser), p.SaleStartsAt, p.SaleEndsAt, p.DropID, d != nil,
			q != nil))
		if err != nil {
			return err
		}
		if d != nil {
			if err := insertDraw(ctx, tx, p.SKU, *d); err != nil {
				return err
			}
		}
		if q != nil {
			if err := insertQueue(ctx, tx, "sku", p.SKU, *q); err != nil {
				return err
			}
		}
		if p.Total > 0 {
			_, err = tx.Exec(ctx, `
				INSERT INTO stock_movements (event_id, sku, kind, quantity, occurred_at)
				VALUES ($1, $2, 'create', $3, $4)`, "create:"+p.SKU, p.SKU, p.Total, out.CreatedAt)
		}
		return interpret(err)
	})
	if err != nil {
		return Product{}, fmt.Errorf("creating product %s: %w", p.SKU, err)
	}
	return out, nil
}

// UpdateProduct changes a product's settings and bumps its version.
func (l *Ledger) UpdateProduct(ctx context.Context, sku string, u ProductUpdate) (Product, error) {
	clear := func(t *time.Time) (set bool, v *time.Time) {
		if t == nil {
			return false, nil
		}
		if t.IsZero() {
			return true, nil
		}
		return true, t
	}
	setStart, start := clear(u.SaleStartsAt)
	setEnd, end := clear(u.SaleEndsAt)
	var maxSet bool
	var maxVal *int
	if u.MaxPerUser != nil {
		maxSet, maxVal = true, nullInt(*u.MaxPerUser)
	}
	p, err := scanProduct(l.pool.QueryRow(ctx, `
		UPDATE products SET
			name = coalesce($2, name),
			price_amount = coalesce($3, price_amount),
			price_currency = coalesce($4, price_currency),
			max_per_user = CASE WHEN $5 THEN $6 ELSE max_per_user END,
			sale_starts_at = CASE WHEN $7 THEN $8 ELSE sale_starts_at END,
			sale_ends_at = CASE WHEN $9 THEN $10 ELSE sale_ends_at END,
			version = version + 1,
			updated_at = now()
		WHERE sku = $1
		RETURNING `+productColumns,
		sku, u.Name, u.PriceAmount, u.PriceCurrency, maxSet, maxVal, setStart, start, setEnd, end))
	if err != nil {
		return Product{}, fmt.Errorf("updating product %s: %w", sku, err)
	}
	return p, nil
}

// MaxTotal bounds a product's total (the initial stock plus every restock):
// the column is a Postgres integer, and the counters in Redis stay far from
// any overflow below it.
const MaxTotal = 1_000_000_000

// ErrTotalTooLarge means a restock would raise the total above MaxTotal.
var ErrTotalTooLarge = errors.New("the total would exceed the maximum stock")

// ErrEventReused means a restock event id was already recorded for this SKU
// with another quantity: it is a different restock reusing the id.
var ErrEventReused = errors.New("restock event id already used with another quantity")

// RestockEventID is the stock movement id of a restock: the caller's event id
// scoped to the SKU, so one purchase order may restock several SKUs under one
// id. A SKU cannot contain ':', so the id is unambiguous.
func RestockEventID(sku, eventID string) string {
	return "restock:" + sku + ":" + eventID
}

// Restock adds units to a product's total and records the movement under the
// caller's eventID, scoped to the SKU, in one transaction under the product's
// row lock. A restock retried with the same eventID and quantity adds nothing
// the second time and returns the product as it is; the same eventID with
// another quantity is refused with ErrEventReused; a total above MaxTotal
// with ErrTotalTooLarge. Restocks recorded before ids were scoped to their
// SKU ("restock:<eventID>") are still found for that SKU.
func (l *Ledger) Restock(ctx context.Context, sku string, quantity int, eventID string) (Product, error) {
	var out Product
	err := l.inTx(ctx, "restock", pgx.TxOptions{}, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, err = scanProduct(tx.QueryRow(ctx, `SELECT `+productColumns+` FROM products WHERE sku = $1 FOR UPDATE`, sku))
		if err != nil {
			return err
		}
		// The row lock serialises restocks of this SKU: the lookup below sees
		// every movement a concurrent restock with the same id committed.
		var recorded int
		err = tx.QueryRow(ctx, `
			SELECT quantity FROM stock_movements
			WHERE event_id = ANY($1) AND sku = $2 AND kind = 'restock'
			ORDER BY id LIMIT 1`,
			[]string{RestockEventID(sku, eventID), "restock:" + eventID}, sku).Scan(&recorded)
		switch {
		case err == nil && recorded == quantity:
			return nil // a retry: nothing to add
		case err == nil:
			return ErrEventReused
		case !errors.Is(err, pgx.ErrNoRows):
			return interpret(err)
		}
		if int64(out.Total)+int64(quantity) > MaxTotal {
			return ErrTotalTooLarge
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO stock_movements (event_id, sku, kind, quantity, occurred_at)
			VALUES ($1, $2, 'restock', $3, now())`, RestockEventID(sku, eventID), sku, quantity); err != nil {
			return interpret(err)
		}
		out, err = scanProduct(tx.QueryRow(ctx, `
			UPDATE products SET total = total + $2, version = version + 1, updated_at = now()
			WHERE sku = $1 RETURNING `+productColumns, sku, quantity))
		return err
	})
	if err != nil {
		return Product{}, fmt.Errorf("restocking %s: %w", sku, err)
	}
	return out, nil
}

// MarkInRedis records that Redis has a product at version or newer, after
// the engine applied it. It never lowers the mark.
func (l *Ledger) MarkInRedis(ctx context.Context, sku string, version int64) error {
	_, err := l.pool.Exec(ctx, `
		UPDATE products SET redis_version = $2 WHERE sku = $1 AND redis_version < $2`, sku, version)
	if err != nil {
		return fmt.Errorf("marking %s as applied to Redis: %w", sku, interpret(err))
	}
	return nil
}

// BehindInRedis returns up to limit products, by SKU, whose latest version
// is not known to have reached Redis: the Redis step of their last write
// failed, or has not finished yet.
func (l *Ledger) BehindInRedis(ctx context.Context, limit int) ([]Product, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+productColumns+` FROM products
		WHERE redis_version < version ORDER BY sku LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("listing products behind in Redis: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Product, error) { return scanProduct(r) })
	if err != nil {
		return nil, fmt.Errorf("listing products behind in Redis: %w", err)
	}
	return out, nil
}

// Product returns one product.
func (l *Ledger) Product(ctx context.Context, sku string) (Product, error) {
	p, err := scanProduct(l.pool.QueryRow(ctx, `SELECT `+productColumns+` FROM products WHERE sku = $1`, sku))
	if err != nil {
		return Product{}, fmt.Errorf("reading product %s: %w", sku, err)
	}
	return p, nil
}

// Products returns up to limit products ordered by SKU, starting after the
// given SKU (keyset pagination: stable while products are added).
func (l *Ledger) Products(ctx context.Context, afterSKU string, limit int) ([]Product, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+productColumns+` FROM products WHERE sku > $1 ORDER BY sku LIMIT $2`,
		afterSKU, limit)
	if err != nil {
		return nil, fmt.Errorf("listing products: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Product, error) { return scanProduct(r) })
	if err != nil {
		return nil, fmt.Errorf("listing products: %w", err)
	}
	return out, nil
}

// ProductsBySKU returns the products of the given SKUs that exist, in one
// query (for per-request batching).
func (l *Ledger) ProductsBySKU(ctx context.Context, skus []string) ([]Product, error) {
	rows, err := l.pool.Query(ctx, `SELECT `+productColumns+` FROM products WHERE sku = ANY($1)`, skus)
	if err != nil {
		return nil, fmt.Errorf("reading products: %w", interpret(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Product, error) { return scanProduct(r) })
	if err != nil {
		return nil, fmt.Errorf("reading products: %w", err)
	}
	return out, nil
}
