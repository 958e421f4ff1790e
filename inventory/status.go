package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
)

// Reservation returns a reservation for its holder or an admin (ErrForbidden
// for anyone else). It reads Redis; when Redis has lost the hold it answers
// from Postgres, rebuilding the SKU first if Postgres still has it as HELD.
func (e *Engine) Reservation(ctx context.Context, p Principal, token string) (Reservation, error) {
	partition, err := parseToken(token)
	if err != nil {
		return Reservation{}, err
	}
	for attempt := 0; attempt < 2; attempt++ {
		h, err := e.rdb.HGetAll(ctx, e.keys.Hold(partition, token)).Result()
		if err != nil {
			return Reservation{}, unavailable("reading reservation", err)
		}
		if len(h) > 0 {
			e.keys.PlaceAt(h["sku"], partition) // a hold lives in its SKU's partition
			gen, err := e.rdb.HGet(ctx, e.keys.SKU(h["sku"]), "gen").Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return Reservation{}, unavailable("reading reservation", err)
			}
			if gen == "" && attempt == 0 {
				if err := e.Rebuild(ctx, h["sku"]); err != nil {
					return Reservation{}, err
				}
				continue
			}
			if gen != h["gen"] {
				h = nil // left over from an earlier life of the SKU
			}
		}
		if len(h) > 0 {
			r := holdFromHash(token, h).reservation()
			if r.Principal != p.ID && !p.Admin {
				return Reservation{}, ErrForbidden
			}
			return r, nil
		}
		rebuilt, r, err := e.fromLedger(ctx, p, token)
		if err != nil {
			return Reservation{}, err
		}
		if !rebuilt {
			return r, nil
		}
	}
	return Reservation{}, fmt.Errorf("reading reservation %s: missing after rebuild", token)
}

// ReservationPage is a page of a principal's reservations, newest first.
type ReservationPage struct {
	Reservations []Reservation
	HasMore      bool
}

// ReservationCursor is the keyset position after which a listing continues.
type ReservationCursor struct {
	CreatedAt time.Time
	Token     string
}

// MyReservations lists the caller's own reservations from the Postgres
// ledger, newest first. The ledger is fed by the write-behind worker, so a
// hold made in the last moments may not be listed yet; Reservation(token)
// always reads the live state. status "" lists every status.
func (e *Engine) MyReservations(ctx context.Context, p Principal, status Status, after *ReservationCursor, limit int) (ReservationPage, error) {
	if err := checkPrincipal(p); err != nil {
		return ReservationPage{}, err
	}
	if limit < 1 || limit > 100 {
		return ReservationPage{}, &InvalidInputError{Field: "first", Reason: "must be between 1 and 100"}
	}
	var cur *db.ReservationCursor
	if after != nil {
		cur = &db.ReservationCursor{CreatedAt: after.CreatedAt, Token: after.Token}
	}
	rows, err := e.ledger.Reservations().ReservationsByPrincipal(ctx, p.ID, string(status), cur, limit+1)
	if err != nil {
		return ReservationPage{}, unavailable("listing reservations", err)
	}
	page := ReservationPage{HasMore: len(rows) > limit}
	if page.HasMore {
		rows = rows[:limit]
	}
	for _, r := range rows {
		page.Reservations = append(page.Reservations, holdFromLedger(r))
	}
	return page, nil
}
