package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Money is an amount in minor units (cents) of an ISO 4217 currency.
type Money struct {
	Amount   int64
	Currency string
}

// Product is a catalogue entry. Its stock lives in Stock.
type Product struct {
	SKU          string
	Name         string
	Price        Money
	MaxPerUser   int // 0: no limit
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	// Draw is true for a product sold by draw (see DrawOf).
	Draw bool
	// Queued is true for a product sold behind an admission queue, its own
	// or its drop's.
	Queued    bool
	Version   int64
	CreatedAt time.Time
	UpdatedAt time.Time
	// Drop is the drop the product belongs to ("" for none).
	Drop string
}

// ProductInput creates a product.
type ProductInput struct {
	SKU          string
	Name         string
	Price        Money
	Stock        int
	MaxPerUser   int // 0: no limit
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	// Drop, when set, makes the product one SKU of that drop (which must
	// exist): the drop's limit and sale window apply to it as well as its
	// own, and its keys live in the drop's partition. It is set for good.
	Drop string
	// Draw, when set, sells the product by draw instead of first come.
	Draw *DrawInput
	// Queue, when set, sells the product behind an admission queue. A
	// product of a drop is queued when its drop is, never on its own.
	Queue *QueueSettings
}

// ProductUpdate changes a product; nil fields stay as they are. A pointer to 0
// for MaxPerUser removes the limit; a pointer to the zero time clears a bound.
type ProductUpdate struct {
	Name         *string
	Price        *Money
	MaxPerUser   *int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
}

var currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// maxStock bounds the stock, each restock and the total they add up to, so
// counters never approach overflow (and the total fits its Postgres column).
const maxStock = core.MaxStock

// MaxStock is the largest total a product may reach.
const MaxStock = maxStock

// productFrom is a ledger row as callers see it. Every product row the
// engine reads also tells its key builder where the SKU's keys live.
func (e *Engine) productFrom(p db.Product) Product {
	place(e.keys, p.SKU, p.DropID)
	return Product{
		SKU: p.SKU, Name: p.Name, Price: Money{Amount: p.PriceAmount, Currency: p.PriceCurrency},
		MaxPerUser: p.MaxPerUser, SaleStartsAt: utcPtr(p.SaleStartsAt), SaleEndsAt: utcPtr(p.SaleEndsAt),
		Version: p.Version, CreatedAt: p.CreatedAt.UTC(), UpdatedAt: p.UpdatedAt.UTC(), Drop: p.DropID,
		Draw: p.Draw, Queued: p.Queued,
	}
}

func checkName(name string) error { return core.CheckName(name) }

func checkPrice(m Money) error {
	if m.Amount < 0 {
		return &InvalidInputError{Field: "price.amount", Reason: "must not be negative"}
	}
	if !currencyPattern.MatchString(m.Currency) {
		return &InvalidInputError{Field: "price.currency", Reason: "must be a three-letter ISO 4217 code"}
	}
	return nil
}

func checkWindow(start, end *time.Time) error { return core.CheckWindow(start, end) }

func requireAdmin(p Principal) error { return core.RequireAdmin(p) }

// CreateProduct adds a product with its initial stock. Postgres first, then
// Redis is built from Postgres. Admins only.
func (a Catalog) CreateProduct(ctx context.Context, p Principal, in ProductInput) (Product, error) {
	e := a.e
	if err := requireAdmin(p); err != nil {
		return Product{}, err
	}
	if !ValidSKU(in.SKU) {
		return Product{}, &InvalidInputError{Field: "sku", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	if err := errors.Join(checkName(in.Name), checkPrice(in.Price), checkWindow(in.SaleStartsAt, in.SaleEndsAt)); err != nil {
		return Product{}, firstInvalid(err)
	}
	if in.Stock < 0 || in.Stock > maxStock {
		return Product{}, &InvalidInputError{Field: "stock", Reason: fmt.Sprintf("must be between 0 and %d", maxStock)}
	}
	if in.MaxPerUser < 0 {
		return Product{}, &InvalidInputError{Field: "maxPerUser", Reason: "must be positive"}
	}
	if in.Drop != "" && !ValidSKU(in.Drop) {
		return Product{}, &InvalidInputError{Field: "drop", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	var draw *db.NewDraw
	if in.Draw != nil {
		if in.Drop != "" {
			return Product{}, &InvalidInputError{Field: "draw", Reason: "a product of a drop cannot also be sold by draw"}
		}
		if err := e.checkDraw(in); err != nil {
			return Product{}, err
		}
		draw = newDraw(*in.Draw)
	}
	if in.Queue != nil && (in.Drop != "" || in.Draw != nil) {
		return Product{}, &InvalidInputError{Field: "queue", Reason: "a product of a drop is queued by its drop's queue, and a draw is no queue"}
	}
	queue, err := newQueue(in.Queue, "queue")
	if err != nil {
		return Product{}, err
	}
	row, err := e.ledger.CreateProductWith(ctx, db.Product{
		SKU: in.SKU, Name: in.Name, PriceAmount: in.Price.Amount, PriceCurrency: in.Price.Currency,
		Total: in.Stock, MaxPerUser: in.MaxPerUser, SaleStartsAt: in.SaleStartsAt, SaleEndsAt: in.SaleEndsAt,
		DropID: in.Drop,
	}, draw, queue)
	switch {
	case errors.Is(err, db.ErrExists):
		return Product{}, &InvalidInputError{Field: "sku", Reason: "a product with this SKU exists"}
	case in.Drop != "" && errors.Is(err, db.ErrNotFound):
		return Product{}, &NotFoundError{Kind: "drop", Key: in.Drop, Field: "drop"}
	case errors.Is(err, db.ErrDropFull):
		return Product{}, &InvalidInputError{Field: "drop", Reason: fmt.Sprintf("a drop has at most %d SKUs", MaxDropSKUs)}
	}
	if err != nil {
		return Product{}, ledgerError("creating product", in.SKU, err)
	}
	if err := e.Rebuild(ctx, in.SKU); err != nil {
		// Postgres has the product; the next read, or the reconciler,
		// rebuilds it in Redis.
		e.log.Warn().Err(err).Str("sku", in.SKU).Msg("product created in Postgres, Redis not yet loaded")
	} else {
		e.markInRedis(ctx, row)
	}
	return e.productFrom(row), nil
}

// UpdateProduct changes a product's name, price, limit or sale window.
// Postgres first, then Redis under the product's version. Admins only.
func (a Catalog) UpdateProduct(ctx context.Context, p Principal, sku string, u ProductUpdate) (Product, error) {
	e := a.e
	if err := requireAdmin(p); err != nil {
		return Product{}, err
	}
	if !ValidSKU(sku) {
		return Product{}, productNotFound(sku)
	}
	var checks []error
	if u.Name != nil {
		checks = append(checks, checkName(*u.Name))
	}
	if u.Price != nil {
		checks = append(checks, checkPrice(*u.Price))
	}
	if u.MaxPerUser != nil && *u.MaxPerUser < 0 {
		checks = append(checks, &InvalidInputError{Field: "maxPerUser", Reason: "must be positive"})
	}
	checks = append(checks, checkWindow(u.SaleStartsAt, u.SaleEndsAt))
	if err := errors.Join(checks...); err != nil {
		return Product{}, firstInvalid(err)
	}
	upd := db.ProductUpdate{Name: u.Name, MaxPerUser: u.MaxPerUser, SaleStartsAt: u.SaleStartsAt, SaleEndsAt: u.SaleEndsAt}
	if u.Price != nil {
		upd.PriceAmount, upd.PriceCurrency = &u.Price.Amount, &u.Price.Currency
	}
	row, err := e.ledger.UpdateProduct(ctx, sku, upd)
	if err != nil {
		return Product{}, ledgerError("updating product", sku, err)
	}
	return e.productFrom(row), e.applyProduct(ctx, row)
}

// Restock adds units to a product's total. Admins only. eventID is required:
// it names the restock (a purchase order line, a delivery note), and it is
// what makes a retry safe. The same eventID for the same SKU and quantity
// restocks once, however often it is sent (after an UNAVAILABLE answer the
// client repeats the call as it was); the same eventID for another SKU is
// another restock; the same eventID for this SKU with another quantity is
// refused with ErrIdempotencyKeyReused. A total above MaxStock is
// *InvalidInputError. Postgres first, then Redis under the version guard.
func (a Catalog) Restock(ctx context.Context, p Principal, sku string, quantity int, eventID string) (Product, error) {
	e := a.e
	if err := requireAdmin(p); err != nil {
		return Product{}, err
	}
	if !ValidSKU(sku) {
		return Product{}, productNotFound(sku)
	}
	if quantity < 1 || quantity > maxStock {
		return Product{}, &InvalidInputError{Field: "quantity", Reason: fmt.Sprintf("must be between 1 and %d", maxStock)}
	}
	if !validEventID(eventID) {
		return Product{}, &InvalidInputError{Field: "eventId", Reason: "is required: 1-128 bytes of valid UTF-8 without control characters, naming this restock so that a retry adds once"}
	}
	row, err := e.ledger.Restock(ctx, sku, quantity, eventID)
	switch {
	case errors.Is(err, db.ErrEventReused):
		return Product{}, ErrIdempotencyKeyReused
	case errors.Is(err, db.ErrTotalTooLarge):
		return Product{}, &InvalidInputError{Field: "quantity", Reason: fmt.Sprintf("the total would exceed %d", maxStock)}
	case err != nil:
		return Product{}, ledgerError("restocking", sku, err)
	}
	return e.productFrom(row), e.applyProduct(ctx, row)
}

// validEventID accepts what a client may use to name a restock.
func validEventID(id string) bool {
	if id == "" || len(id) > 128 || !utf8.ValidString(id) {
		return false
	}
	for _, r := range id {
		if r < ' ' || r == 0x7f {
			return false
		}
	}
	return true
}

// Product returns a catalogue entry from Postgres.
func (a Catalog) Product(ctx context.Context, sku string) (Product, error) {
	e := a.e
	if !ValidSKU(sku) {
		return Product{}, productNotFound(sku)
	}
	row, err := e.ledger.Product(ctx, sku)
	if err != nil {
		return Product{}, ledgerError("reading product", sku, err)
	}
	return e.productFrom(row), nil
}

// Products lists the catalogue by SKU, after the given SKU.
func (a Catalog) Products(ctx context.Context, afterSKU string, limit int) ([]Product, error) {
	e := a.e
	rows, err := e.ledger.Products(ctx, afterSKU, limit)
	if err != nil {
		return nil, ledgerError("listing products", "", err)
	}
	out := make([]Product, len(rows))
	for i, r := range rows {
		out[i] = e.productFrom(r)
	}
	return out, nil
}

// applyProduct brings Redis up to the Postgres version of a product, then
// records in Postgres that Redis has it. When Redis cannot be reached the
// change stays durable in Postgres, marked as behind, and ReapplyProducts
// brings it over later.
func (e *Engine) applyProduct(ctx context.Context, row db.Product) error {
	_, err := e.applyProductResult(ctx, row)
	return err
}

// applyProductResult is applyProduct, also saying whether Redis changed
// (false when Redis had this version or a newer one already).
func (e *Engine) applyProductResult(ctx context.Context, row db.Product) (bool, error) {
	place(e.keys, row.SKU, row.DropID)
	defer e.adding(row.SKU)()
	rebuilt := false
	for {
		r, err := script.RunApplyProduct(ctx, e.run, e.keys, script.ApplyProduct{SKU: row.SKU, Version: row.Version,
			Total: row.Total, MaxPerUser: row.MaxPerUser, StartsMs: timeMs(row.SaleStartsAt), EndsMs: timeMs(row.SaleEndsAt),
			Nonce: newNonce()})
		if err != nil {
			return false, fmt.Errorf("applying product %s: %w", row.SKU, err)
		}
		switch replyCode(r.Code) {
		case codeNeedsHydration:
			if rebuilt {
				return false, unavailable("applying product "+row.SKU, errors.New("SKU still missing after rebuild"))
			}
			// The rebuild need not have read this version (a snapshot that
			// lost its lock before its publish did not): apply it again to
			// what it published, which is STALE when it has it.
			if err := e.Rebuild(ctx, row.SKU); err != nil {
				return false, err
			}
			rebuilt = true
			continue
		}
		e.markInRedis(ctx, row)
		// STALE: Redis had this version or a newer one, and changed only if
		// it was rebuilt.
		return rebuilt || replyCode(r.Code) != codeStale, nil
	}
}

// markInRedis records that Redis has row's version. A failure only costs a
// repeated, version-guarded apply later, so it is logged, not returned.
func (e *Engine) markInRedis(ctx context.Context, row db.Product) {
	if err := e.ledger.MarkInRedis(ctx, row.SKU, row.Version); err != nil {
		e.log.Warn().Err(err).Str("sku", row.SKU).Int64("version", row.Version).Msg("product applied to Redis, not yet marked in Postgres")
	}
}

// ReapplyProducts brings Redis up to Postgres for the products of one
// partition whose last write committed in Postgres but did not reach Redis
// (Redis was unreachable, or the call timed out): without it Redis would keep
// the old total, limit or sale window until the next write of the product.
// Each apply is the same version-guarded script as a write's own, so a
// repeated or late one changes nothing newer. It looks at no more than limit
// lagging products of all partitions at once and returns how many of this
// partition's it changed in Redis. The commit reconciler runs it every pass.
func (m *Maintenance) ReapplyProducts(ctx context.Context, partition, limit int) (int, error) {
	e := m.e
	rows, err := e.ledger.BehindInRedis(ctx, limit)
	if err != nil {
		return 0, unavailable("listing products behind in Redis", err)
	}
	applied := 0
	for _, row := range rows {
		place(e.keys, row.SKU, row.DropID)
		if e.keys.PartitionOf(row.SKU) != partition {
			continue
		}
		changed, err := e.applyProductResult(ctx, row)
		if err != nil {
			if ctx.Err() != nil {
				return applied, ctx.Err()
			}
			// One product failing never holds the others back.
			e.log.Warn().Err(err).Str("sku", row.SKU).Msg("could not re-apply a product change to Redis; retrying next pass")
			continue
		}
		if changed {
			applied++
			e.log.Info().Str("sku", row.SKU).Int64("version", row.Version).Msg("re-applied a product change Redis had missed")
		}
	}
	return applied, nil
}

func ledgerError(op, sku string, err error) error { return core.LedgerError(op, sku, err) }

func firstInvalid(err error) error { return core.FirstInvalid(err) }

// ProductsBySKU returns the products of several SKUs in one Postgres query; a
// nil entry is an unknown SKU. It exists for per-request batching.
func (a Catalog) ProductsBySKU(ctx context.Context, skus []string) ([]*Product, error) {
	e := a.e
	valid := make([]string, 0, len(skus))
	for _, s := range skus {
		if ValidSKU(s) {
			valid = append(valid, s)
		}
	}
	rows, err := e.ledger.ProductsBySKU(ctx, valid)
	if err != nil {
		return nil, ledgerError("reading products", "", err)
	}
	bySKU := make(map[string]Product, len(rows))
	for _, r := range rows {
		bySKU[r.SKU] = e.productFrom(r)
	}
	out := make([]*Product, len(skus))
	for i, s := range skus {
		if p, ok := bySKU[s]; ok {
			out[i] = &p
		}
	}
	return out, nil
}
