package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
)

// Drop groups SKUs (the sizes of one sneaker, say) under one per-person
// limit and one sale window, on top of each SKU's own.
type Drop struct {
	ID   string
	Name string
	// MaxPerUser is the most units one principal may hold or buy across
	// every SKU of the drop.
	MaxPerUser   int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	CreatedAt    time.Time
	// SKUs are the drop's products, in SKU order.
	SKUs []string
}

// MaxDropSKUs is the most SKUs one drop may have.
const MaxDropSKUs = db.MaxDropSKUs

// DropInput creates a drop.
type DropInput struct {
	ID           string
	Name         string
	MaxPerUser   int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	// Queue, when set, sells every SKU of the drop behind one admission
	// queue: one pass buys any of them.
	Queue *QueueSettings
}

func dropFrom(d db.Drop) Drop {
	return Drop{ID: d.ID, Name: d.Name, MaxPerUser: d.MaxPerUser, SaleStartsAt: utcPtr(d.SaleStartsAt),
		SaleEndsAt: utcPtr(d.SaleEndsAt), CreatedAt: d.CreatedAt.UTC(), SKUs: d.SKUs}
}

// CreateDrop makes a drop, without SKUs: products join it when they are
// created (ProductInput.Drop). Postgres first, then Redis. Admins only.
func (a Drops) CreateDrop(ctx context.Context, p Principal, in DropInput) (Drop, error) {
	e := a.e
	if err := requireAdmin(p); err != nil {
		return Drop{}, err
	}
	if !ValidSKU(in.ID) {
		return Drop{}, &InvalidInputError{Field: "id", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	if err := errors.Join(checkName(in.Name), checkWindow(in.SaleStartsAt, in.SaleEndsAt)); err != nil {
		return Drop{}, firstInvalid(err)
	}
	if in.MaxPerUser < 1 || in.MaxPerUser > maxStock {
		return Drop{}, &InvalidInputError{Field: "maxPerUser", Reason: fmt.Sprintf("must be between 1 and %d", maxStock)}
	}
	queue, err := newQueue(in.Queue, "queue")
	if err != nil {
		return Drop{}, err
	}
	row, err := e.ledger.CreateDropWith(ctx, db.Drop{ID: in.ID, Name: in.Name, MaxPerUser: in.MaxPerUser,
		SaleStartsAt: in.SaleStartsAt, SaleEndsAt: in.SaleEndsAt}, queue)
	if errors.Is(err, db.ErrExists) {
		return Drop{}, &InvalidInputError{Field: "id", Reason: "a drop with this id exists"}
	}
	if err != nil {
		return Drop{}, ledgerError("creating drop", in.ID, err)
	}
	if err := e.applyDrop(ctx, in.ID); err != nil {
		// Postgres has the drop; the rebuild of its first SKU writes it.
		e.log.Warn().Err(err).Str("drop", in.ID).Msg("drop created in Postgres, Redis not yet written")
	}
	return dropFrom(row), nil
}

// Drop returns a drop with its SKUs, from the ledger; *NotFoundError when
// there is none.
func (a Drops) Drop(ctx context.Context, id string) (Drop, error) {
	e := a.e
	list, err := e.Drops().DropsByID(ctx, []string{id})
	if err != nil {
		return Drop{}, err
	}
	if list[0] == nil {
		return Drop{}, &NotFoundError{Kind: "drop", Key: id, Field: "id"}
	}
	return *list[0], nil
}

// DropsByID returns the drops of several ids with their SKUs in one
// Postgres query; a nil entry is an unknown id. It exists for per-request
// batching.
func (a Drops) DropsByID(ctx context.Context, ids []string) ([]*Drop, error) {
	e := a.e
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if ValidSKU(id) {
			valid = append(valid, id)
		}
	}
	rows, err := e.ledger.DropsByID(ctx, valid)
	if err != nil {
		return nil, unavailable("reading drops", err)
	}
	byID := make(map[string]Drop, len(rows))
	for _, row := range rows {
		for _, sku := range row.SKUs {
			place(e.keys, sku, row.ID)
		}
		byID[row.ID] = dropFrom(row)
	}
	out := make([]*Drop, len(ids))
	for i, id := range ids {
		if d, ok := byID[id]; ok {
			out[i] = &d
		}
	}
	return out, nil
}

// applyDrop writes the ledger's drop, with its SKUs, to Redis under its
// version (apply_drop.lua): an older copy is replaced, a newer one kept.
func (e *Engine) applyDrop(ctx context.Context, id string) error {
	d, err := e.ledger.Drop(ctx, id)
	if err != nil {
		return unavailable("reading drop "+id, err)
	}
	for _, sku := range d.SKUs {
		place(e.keys, sku, id)
	}
	r, err := script.RunApplyDrop(ctx, e.run, e.keys, script.ApplyDrop{Drop: id, Version: d.Version, MaxPerUser: d.MaxPerUser,
		StartsMs: timeMs(d.SaleStartsAt), EndsMs: timeMs(d.SaleEndsAt), SKUs: d.SKUs})
	if err != nil {
		return fmt.Errorf("writing drop %s: %w", id, err)
	}
	if c := replyCode(r.Code); c != codeOK && c != codeStale {
		return fmt.Errorf("writing drop %s: unexpected script reply %q", id, c)
	}
	return nil
}
