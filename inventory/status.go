package inventory

import (
	"context"
	"fmt"
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
			r := holdFromHash(token, h)
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
