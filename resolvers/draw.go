package resolvers

import (
	"context"
	"encoding/hex"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

func drawModel(d inventory.Draw) *model.Draw {
	m := &model.Draw{
		ClosesAt: d.ClosesAt, Status: model.DrawStatus(d.Status), Entries: d.Entries, SeedHash: d.SeedHash,
		WinnerHoldSeconds: int(d.WinnerHold.Seconds()), AppliedAt: d.AppliedAt,
	}
	if d.Status == inventory.DrawDrawn {
		seed, winners := hex.EncodeToString(d.Seed), d.Winners
		m.Seed, m.Winners = &seed, &winners
	}
	return m
}

func drawEntryModel(e inventory.DrawEntry) *model.DrawEntry {
	m := &model.DrawEntry{Sku: e.SKU, Quantity: e.Quantity, Status: model.DrawEntryStatus(e.Status), EnteredAt: e.EnteredAt}
	if e.Place > 0 {
		place := e.Place
		m.Place = &place
	}
	if e.Reservation != nil {
		m.Reservation = reservationModel(*e.Reservation)
	}
	return m
}

func drawEntryRefused(ue *model.UserError) *model.DrawEntryPayload {
	return &model.DrawEntryPayload{UserErrors: []*model.UserError{ue}}
}

// drawEntryResult maps an entry's outcome to its payload.
func drawEntryResult(e inventory.DrawEntry, err error) (*model.DrawEntryPayload, error) {
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return drawEntryRefused(ue), nil
	}
	return &model.DrawEntryPayload{Entry: drawEntryModel(e), UserErrors: []*model.UserError{}}, nil
}

// enterDraw enters the caller in a draw. The mutation budget is spent
// after the entry, and only by an answer that is not a fresh entry (a
// replay or a refusal): a principal's first entry in a draw is made once
// whatever it sends, so it cannot be repeated to load the service, and
// sparing it a Redis script run per entry is most of a large draw's
// Redis time. Anything sent again, which is what a flood is, still spends
// the budget and is refused RATE_LIMITED once it is spent.
func (d *deps) enterDraw(ctx context.Context, input model.EnterDrawInput) (*model.DrawEntryPayload, error) {
	p, refused := d.reserveCaller(ctx)
	if refused != nil {
		return drawEntryRefused(refused), nil
	}
	e, err := d.engine.Draws().EnterDraw(ctx, p, input.Sku, input.Quantity)
	if err != nil || e.Replayed {
		if allowed, retry := d.limiter.allow(ctx, p.ID); !allowed {
			return drawEntryRefused(rateLimitedError(retry)), nil
		}
	}
	return drawEntryResult(e, err)
}

const fieldMyDrawEntryChanged = "myDrawEntryChanged"

// myDrawEntryChanged watches the caller's entry in a SKU's draw: its
// current state first, then its result once the draw is applied, after
// which it completes. The result comes from the hub, which reads a draw's
// whole result once per process on the draw's one message (live/draw.go),
// so the entrants watching cost no read each; only a winner's reservation
// is read for it.
func (d *deps) myDrawEntryChanged(ctx context.Context, sku string) (<-chan *model.DrawEntry, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	if d.hub == nil {
		return nil, errLiveUnavailable
	}
	first, err := d.engine.Draws().MyDrawEntry(ctx, p, sku)
	if err != nil {
		return nil, queryError(err)
	}
	s, err := d.admit(ctx, fieldMyDrawEntryChanged)
	if err != nil {
		return nil, err
	}
	var result <-chan inventory.DrawEntry
	if !drawDecided(first) {
		if result, err = d.hub.SubscribeDrawEntry(ctx, sku, p.ID); err != nil {
			s.done("refused")
			return nil, liveError(err)
		}
	}
	out := make(chan *model.DrawEntry)
	go func() {
		defer close(out)
		if !send(ctx, s, out, drawEntryModel(first)) {
			s.done("client")
			return
		}
		if result == nil {
			s.done("complete")
			return
		}
		select {
		case e, ok := <-result:
			if !ok {
				if ctx.Err() == nil {
					s.dropped(ctx)
					s.done("dropped")
				} else {
					s.done("client")
				}
				return
			}
			if !send(ctx, s, out, drawEntryModel(d.engine.Draws().WithReservation(ctx, p, e))) {
				s.done("client")
				return
			}
			s.done("complete")
		case <-ctx.Done():
			s.done("client")
		}
	}()
	return out, nil
}

// drawDecided says an entry's result is all there: lost, or won with its
// reservation in Redis.
func drawDecided(e inventory.DrawEntry) bool {
	return e.Status == inventory.EntryLost || e.Status == inventory.EntryWon && e.Reservation != nil
}
