package inventory

import (
	"context"
	"errors"
	"fmt"

	"github.com/dropline/dropline/lua"
)

// Cancel releases a principal's hold and returns its units to stock. An admin
// may cancel anyone's hold. Cancelling twice restocks once: the second call
// returns the reservation with Replayed set. A hold that reached its expiry
// first is reported as EXPIRED. Refusals: ErrAlreadyCommitted, ErrForbidden,
// *NotFoundError.
func (e *Engine) Cancel(ctx context.Context, p Principal, token string) (res Reservation, err error) {
	defer func() { e.metrics.outcome("cancel", err) }()
	partition, err := parseToken(token)
	if err != nil {
		return Reservation{}, err
	}
	if err := checkPrincipal(p); err != nil {
		return Reservation{}, err
	}
	for attempt := 0; ; attempt++ {
		res, err := e.release(ctx, partition, token, p, "CANCELLED")
		if err != nil {
			return Reservation{}, fmt.Errorf("cancelling %s: %w", token, err)
		}
		switch res.code() {
		case "OK":
			return holdFromReply(res), nil
		case "FORBIDDEN":
			return Reservation{}, ErrForbidden
		case "ALREADY_COMMITTED":
			return Reservation{}, ErrAlreadyCommitted
		case "COMMIT_IN_PROGRESS":
			return Reservation{}, unavailable("cancelling "+token, errCommitInProgress)
		case "NEEDS_HYDRATION":
			if attempt > 0 {
				return Reservation{}, fmt.Errorf("cancelling %s: SKU still missing after rebuild", token)
			}
			if err := e.Rebuild(ctx, res.str(1)); err != nil {
				return Reservation{}, fmt.Errorf("cancelling %s: %w", token, err)
			}
		case "NOT_FOUND":
			if attempt > 0 {
				return Reservation{}, reservationNotFound(token)
			}
			rebuilt, r, err := e.fromLedger(ctx, p, token)
			if err != nil {
				return Reservation{}, err
			}
			if rebuilt {
				continue
			}
			if r.Status == StatusCommitted {
				return Reservation{}, ErrAlreadyCommitted
			}
			r.Replayed = true
			return r, nil
		default:
			return Reservation{}, fmt.Errorf("cancelling %s: unexpected script reply %q", token, res.code())
		}
	}
}

// errCommitInProgress is why a cancel of a hold being committed is refused
// as retryable: the commit's outcome decides, within seconds.
var errCommitInProgress = errors.New("a commit of this reservation is in progress")

// release runs release_hold.lua, shared by cancel and expiry.
func (e *Engine) release(ctx context.Context, partition int, token string, p Principal, status string) (reply, error) {
	admin := "0"
	if p.Admin {
		admin = "1"
	}
	r, err := e.run(ctx, lua.ReleaseHold, []string{e.keys.Hold(partition, token)},
		e.keys.Base(partition), token, p.ID, admin, status, int64(e.cfg.Retention.Seconds()))
	return reply(r), err
}
