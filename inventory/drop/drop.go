// Package drop creates and reads drops: SKUs (the sizes of one sneaker,
// say) under one per-person limit and one sale window, on top of each SKU's
// own (see Drops in package inventory's doc). A drop lives in the ledger
// and, with its SKUs, in one Redis hash of its own partition, which every
// script that hands out units of its SKUs reads.
package drop

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// Drops creates and reads drops; package inventory's Engine.Drops hands
// them out.
type Drops struct{ c *core.Core }

// New is the drops of the engine whose shared parts c are.
func New(c *core.Core) Drops { return Drops{c: c} }

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

// MaxSKUs is the most SKUs one drop may have.
const MaxSKUs = db.MaxDropSKUs

// Input creates a drop.
type Input struct {
	ID           string
	Name         string
	MaxPerUser   int
	SaleStartsAt *time.Time
	SaleEndsAt   *time.Time
	// Queue, when set, sells every SKU of the drop behind one admission
	// queue: one pass buys any of them.
	Queue *core.QueueSettings
}

func from(d db.Drop) Drop {
	return Drop{ID: d.ID, Name: d.Name, MaxPerUser: d.MaxPerUser, SaleStartsAt: core.UTCPtr(d.SaleStartsAt),
		SaleEndsAt: core.UTCPtr(d.SaleEndsAt), CreatedAt: d.CreatedAt.UTC(), SKUs: d.SKUs}
}

// CreateDrop makes a drop, without SKUs: products join it when they are
// created (package inventory's ProductInput.Drop). Postgres first, then Redis. Admins only.
func (a Drops) CreateDrop(ctx context.Context, p core.Principal, in Input) (Drop, error) {
	c := a.c
	if err := core.RequireAdmin(p); err != nil {
		return Drop{}, err
	}
	if !core.ValidSKU(in.ID) {
		return Drop{}, &outcome.InvalidInputError{Field: "id", Reason: "must be 1-64 characters of A-Z a-z 0-9 . _ -"}
	}
	if err := errors.Join(core.CheckName(in.Name), core.CheckWindow(in.SaleStartsAt, in.SaleEndsAt)); err != nil {
		return Drop{}, core.FirstInvalid(err)
	}
	if in.MaxPerUser < 1 || in.MaxPerUser > core.MaxStock {
		return Drop{}, &outcome.InvalidInputError{Field: "maxPerUser", Reason: fmt.Sprintf("must be between 1 and %d", core.MaxStock)}
	}
	queue, err := core.NewQueue(in.Queue, "queue")
	if err != nil {
		return Drop{}, err
	}
	row, err := c.Ledger.Drops().CreateDropWith(ctx, db.Drop{ID: in.ID, Name: in.Name, MaxPerUser: in.MaxPerUser,
		SaleStartsAt: in.SaleStartsAt, SaleEndsAt: in.SaleEndsAt}, queue)
	if errors.Is(err, db.ErrExists) {
		return Drop{}, &outcome.InvalidInputError{Field: "id", Reason: "a drop with this id exists"}
	}
	if err != nil {
		return Drop{}, core.LedgerError("creating drop", in.ID, err)
	}
	if err := Apply(ctx, c, in.ID); err != nil {
		// Postgres has the drop; the rebuild of its first SKU writes it.
		c.Log.Warn().Err(err).Str("drop", in.ID).Msg("drop created in Postgres, Redis not yet written")
	}
	return from(row), nil
}

// Drop returns a drop with its SKUs, from the ledger; *NotFoundError when
// there is none.
func (a Drops) Drop(ctx context.Context, id string) (Drop, error) {
	list, err := a.DropsByID(ctx, []string{id})
	if err != nil {
		return Drop{}, err
	}
	if list[0] == nil {
		return Drop{}, &outcome.NotFoundError{Kind: "drop", Key: id, Field: "id"}
	}
	return *list[0], nil
}

// DropsByID returns the drops of several ids with their SKUs in one
// Postgres query; a nil entry is an unknown id. It exists for per-request
// batching.
func (a Drops) DropsByID(ctx context.Context, ids []string) ([]*Drop, error) {
	c := a.c
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if core.ValidSKU(id) {
			valid = append(valid, id)
		}
	}
	rows, err := c.Ledger.Drops().DropsByID(ctx, valid)
	if err != nil {
		return nil, core.Unavailable("reading drops", err)
	}
	byID := make(map[string]Drop, len(rows))
	for _, row := range rows {
		for _, sku := range row.SKUs {
			core.Place(c.Keys, sku, row.ID)
		}
		byID[row.ID] = from(row)
	}
	out := make([]*Drop, len(ids))
	for i, id := range ids {
		if d, ok := byID[id]; ok {
			out[i] = &d
		}
	}
	return out, nil
}

// Apply writes the ledger's drop, with its SKUs, to Redis under its
// version (apply_drop.lua): an older copy is replaced, a newer one kept. A
// rebuild of one of its SKUs calls it too.
func Apply(ctx context.Context, c *core.Core, id string) error {
	d, err := c.Ledger.Drops().Drop(ctx, id)
	if err != nil {
		return core.Unavailable("reading drop "+id, err)
	}
	for _, sku := range d.SKUs {
		core.Place(c.Keys, sku, id)
	}
	r, err := script.RunApplyDrop(ctx, c.Run, c.Keys, script.ApplyDrop{Drop: id, Version: d.Version, MaxPerUser: d.MaxPerUser,
		StartsMs: core.TimeMs(d.SaleStartsAt), EndsMs: core.TimeMs(d.SaleEndsAt), SKUs: d.SKUs})
	if err != nil {
		return fmt.Errorf("writing drop %s: %w", id, err)
	}
	if code := core.ReplyCode(r.Code); code != core.CodeOK && code != core.CodeStale {
		return fmt.Errorf("writing drop %s: unexpected script reply %q", id, code)
	}
	return nil
}
