package resolvers

import (
	"encoding/hex"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

func drawModel(d inventory.Draw) *model.Draw {
	m := &model.Draw{
		ClosesAt: d.ClosesAt, Status: model.DrawStatus(d.Status), Entries: d.Entries, SeedHash: d.SeedHash,
		WinnerHoldSeconds: int(d.WinnerHold.Seconds()),
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
