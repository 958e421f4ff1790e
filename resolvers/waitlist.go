package resolvers

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/rs/zerolog"

	"github.com/dropline/dropline/graph/model"
	"github.com/dropline/dropline/inventory"
)

const fieldWaitlistChanged = "waitlistChanged"

func waitlistModel(w inventory.WaitlistEntry) *model.WaitlistEntry {
	m := &model.WaitlistEntry{
		Sku: w.SKU, Quantity: w.Quantity, Status: model.WaitlistStatus(w.Status),
		HoldSeconds: int(w.HoldFor / time.Second),
	}
	if w.Position > 0 {
		pos := w.Position
		m.Position = &pos
	}
	if !w.JoinedAt.IsZero() && w.Status != inventory.WaitLeft {
		at := w.JoinedAt
		m.JoinedAt = &at
	}
	if w.Reservation != nil {
		m.Reservation = reservationModel(*w.Reservation)
	}
	return m
}

func waitlistRefused(ue *model.UserError) *model.WaitlistPayload {
	return &model.WaitlistPayload{UserErrors: []*model.UserError{ue}}
}

// waitlistResult maps a join's or a leave's outcome to its payload.
func waitlistResult(w inventory.WaitlistEntry, err error) (*model.WaitlistPayload, error) {
	if err != nil {
		ue, err := userError(err)
		if err != nil {
			return nil, err
		}
		return waitlistRefused(ue), nil
	}
	return &model.WaitlistPayload{Entry: waitlistModel(w), UserErrors: []*model.UserError{}}, nil
}

// waitlistChanged watches the caller's own entry in a SKU's waitlist. Like
// reservationChanged it has no channel of its own: every waitlist change
// (join, leave, offer) moves its SKU's stock sequence and is announced, so
// the entry is re-read whenever the SKU's stock moves, and every
// ReservationRecheck in case a message was coalesced away or lost. Only
// changes are sent.
func (d *deps) waitlistChanged(ctx context.Context, sku string) (<-chan *model.WaitlistEntry, error) {
	p, ok := principal(ctx)
	if !ok {
		return nil, errUnauthenticated
	}
	if d.hub == nil {
		return nil, errLiveUnavailable
	}
	first, err := d.engine.Waitlists().Waitlist(ctx, p, sku)
	if err != nil {
		return nil, queryError(err)
	}
	s, err := d.admit(ctx, fieldWaitlistChanged)
	if err != nil {
		return nil, err
	}
	subCtx, cancel := context.WithCancel(ctx)
	wake, err := d.hub.Subscribe(subCtx, []string{sku})
	if err != nil {
		cancel()
		s.done("refused")
		return nil, liveError(err)
	}
	out := make(chan *model.WaitlistEntry)
	go func() {
		defer cancel()
		defer close(out)
		last := waitlistModel(first)
		if !send(ctx, s, out, last) {
			s.done("client")
			return
		}
		tick := time.NewTicker(d.recheck)
		defer tick.Stop()
		for {
			if !awaitChange(ctx, s, wake, tick.C) {
				return
			}
			rctx, rcancel := context.WithTimeout(ctx, rereadTimeout)
			w, err := d.engine.Waitlists().Waitlist(rctx, p, sku)
			rcancel()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, context.Canceled) {
					s.done("client")
					return
				}
				zerolog.Ctx(ctx).Warn().Err(err).Msg("re-reading a watched waitlist entry (retried)")
				continue
			}
			cur := waitlistModel(w)
			if reflect.DeepEqual(last, cur) {
				continue
			}
			last = cur
			if !send(ctx, s, out, last) {
				s.done("client")
				return
			}
		}
	}()
	return out, nil
}
