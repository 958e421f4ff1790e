package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/script"
)

// WaitStatus is where a waitlist entry is:
//
//	join --> WAITING --units freed, its turn--> OFFERED (a HELD reservation)
//	            \--leave--> LEFT
type WaitStatus string

// The statuses of a waitlist entry.
const (
	WaitWaiting WaitStatus = "WAITING"
	WaitOffered WaitStatus = "OFFERED"
	WaitLeft    WaitStatus = "LEFT"
)

// WaitlistEntry is one principal's place in a SKU's waitlist.
type WaitlistEntry struct {
	SKU       string
	Principal string
	Quantity  int
	HoldFor   time.Duration
	Status    WaitStatus
	// Position is 1 for the next waiter to be served; 0 unless WAITING.
	Position int
	// Seq orders the SKU's entries by joining; it only grows.
	Seq      int64
	JoinedAt time.Time
	// Token names the reservation an OFFERED entry was handed; Reservation
	// is its state when the call read it (nil when it could not be read).
	Token       string
	Reservation *Reservation
	// Replayed is true when the call changed nothing: a join that found the
	// principal's entry, a leave that found none.
	Replayed bool
}

// JoinWaitlistRequest asks to be handed units of a SKU when they come back.
type JoinWaitlistRequest struct {
	SKU      string
	Quantity int
	// HoldFor is how long the reservation handed over lasts; 0 means the
	// configured default hold.
	HoldFor time.Duration
	// AdmissionPass is the caller's pass of the product's (or its drop's)
	// admission queue, for a queued product; "" for none. Joining spends it.
	AdmissionPass string
}

// JoinWaitlist puts the principal in the SKU's waitlist. Units freed later by
// a cancel, an expiry or a restock are handed to waiters in the order they
// joined, each as a HELD reservation of the duration it asked for (see
// handoff in lua/lib.lua); if units are available now that no waiter ahead
// can take, the entry is served at once. A principal has one entry per SKU:
// joining again returns it (Replayed). Refusals: *InvalidInputError,
// *NotFoundError, *SaleNotActiveError, *QuotaExceededError (what the
// principal holds or bought of the SKU, or of its drop, plus the quantity is
// above the limit: the join could never be served), *WaitlistFullError,
// ErrDrawOnly.
func (a Waitlists) JoinWaitlist(ctx context.Context, p Principal, req JoinWaitlistRequest) (w WaitlistEntry, err error) {
	e := a.e
	defer func() { e.metrics.outcome("join_waitlist", err) }()
	hold, err := e.checkReserve(p, ReserveRequest{SKU: req.SKU, Quantity: req.Quantity, HoldFor: req.HoldFor})
	if err != nil {
		return WaitlistEntry{}, err
	}
	nonce := newNonce()
	r, err := e.runWaitlist(ctx, req.SKU, func() (script.Wait, error) {
		// The keys are built again after a rebuild, which places a SKU of a drop.
		return script.RunJoinWaitlist(ctx, e.run, e.keys, script.JoinWaitlist{SKU: req.SKU, Principal: p.ID,
			Quantity: req.Quantity, HoldMs: hold.Milliseconds(), WaitlistMax: e.cfg.WaitlistMax, Nonce: nonce,
			MaxQuantity: e.cfg.MaxQuantity, MinHoldMs: e.cfg.MinHold.Milliseconds(), MaxHoldMs: e.cfg.MaxHold.Milliseconds(),
			Pass: req.AdmissionPass})
	})
	if err != nil {
		return WaitlistEntry{}, fmt.Errorf("joining the waitlist of %s: %w", req.SKU, err)
	}
	if replyCode(r.Code) != codeOK {
		if err := rejectionError(r.Rejection); err != nil {
			return WaitlistEntry{}, err
		}
		return WaitlistEntry{}, fmt.Errorf("joining the waitlist of %s: unexpected script reply %q", req.SKU, r.Code)
	}
	w = waitEntryOf(r)
	if !w.Replayed {
		e.recordWaitlist(ctx, db.KindWaitJoin, w, w.JoinedAt)
	}
	return e.withReservation(ctx, p, w), nil
}

// LeaveWaitlist takes the principal out of the SKU's waitlist; the entry is
// returned as LEFT. Leaving when not in it changes nothing (Replayed). An
// OFFERED entry's reservation stays the principal's.
func (a Waitlists) LeaveWaitlist(ctx context.Context, p Principal, sku string) (w WaitlistEntry, err error) {
	e := a.e
	defer func() { e.metrics.outcome("leave_waitlist", err) }()
	if err := checkPrincipal(p); err != nil {
		return WaitlistEntry{}, err
	}
	if !ValidSKU(sku) {
		return WaitlistEntry{}, productNotFound(sku)
	}
	r, err := e.runWaitlist(ctx, sku, func() (script.Wait, error) {
		return script.RunLeaveWaitlist(ctx, e.run, e.keys, script.LeaveWaitlist{SKU: sku, Principal: p.ID})
	})
	if err != nil {
		return WaitlistEntry{}, fmt.Errorf("leaving the waitlist of %s: %w", sku, err)
	}
	if replyCode(r.Code) != codeOK {
		return WaitlistEntry{}, fmt.Errorf("leaving the waitlist of %s: unexpected script reply %q", sku, r.Code)
	}
	w = waitEntryOf(r)
	w.SKU, w.Principal = sku, p.ID
	if !w.Replayed {
		e.recordWaitlist(ctx, db.KindWaitLeave, w, time.Now())
	}
	w.Token = ""
	return w, nil
}

// runWaitlist runs a waitlist script, rebuilding the SKU first when Redis
// does not have it (the rebuild restores its waitlist from the ledger).
func (e *Engine) runWaitlist(ctx context.Context, sku string, run func() (script.Wait, error)) (script.Wait, error) {
	for attempt := 0; ; attempt++ {
		r, err := run()
		if err != nil {
			return r, err
		}
		if replyCode(r.Code) != codeNeedsHydration {
			return r, nil
		}
		if attempt > 0 {
			return r, errors.New("SKU still missing after rebuild")
		}
		missing := r.Missing // the SKU, or another of its drop
		if missing == "" {
			missing = sku
		}
		if err := e.Rebuild(ctx, missing); err != nil {
			return r, err
		}
	}
}

// recordWaitlist writes a join or a leave Redis has just made to the ledger,
// best effort, as Cancel does for a release: myWaitlist lists from the
// ledger. The outbox event stays the guarantee.
func (e *Engine) recordWaitlist(ctx context.Context, kind string, w WaitlistEntry, at time.Time) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), syncReleaseTimeout)
	defer cancel()
	err := e.ledger.ApplyEvents(wctx, nil, []db.Event{{
		ID: kind + ":" + w.SKU + ":" + strconv.FormatInt(w.Seq, 10), Kind: kind, Token: w.Token, SKU: w.SKU,
		Principal: w.Principal, Quantity: w.Quantity, CreatedAt: w.JoinedAt, At: at, Seq: w.Seq,
		HoldMillis: w.HoldFor.Milliseconds(),
	}})
	if err != nil {
		e.log.Warn().Err(err).Str("sku", w.SKU).Str("kind", kind).Msg("could not record a waitlist change in the ledger at once; the write-behind will")
	}
}

// withReservation fills in the reservation an OFFERED entry was handed.
func (e *Engine) withReservation(ctx context.Context, p Principal, w WaitlistEntry) WaitlistEntry {
	if w.Status != WaitOffered || w.Token == "" {
		return w
	}
	r, err := e.Reservation(ctx, p, w.Token)
	if err != nil {
		e.log.Warn().Err(err).Str("token", w.Token).Msg("could not read an offered reservation")
		return w
	}
	w.Reservation = &r
	return w
}

// Waitlist returns the principal's live entry in a SKU's waitlist, with its
// position; the status is LEFT when it has none.
func (a Waitlists) Waitlist(ctx context.Context, p Principal, sku string) (WaitlistEntry, error) {
	e := a.e
	if err := checkPrincipal(p); err != nil {
		return WaitlistEntry{}, err
	}
	if !ValidSKU(sku) {
		return WaitlistEntry{}, productNotFound(sku)
	}
	for attempt := 0; ; attempt++ {
		var gen, raw *redis.StringCmd
		var rank *redis.IntCmd
		_, err := e.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			gen = pipe.HGet(ctx, e.keys.SKU(sku), "gen")
			raw = pipe.HGet(ctx, e.keys.WaitEntries(sku), p.ID)
			rank = pipe.ZRank(ctx, e.keys.WaitQueue(sku), p.ID)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return WaitlistEntry{}, unavailable("reading the waitlist", err)
		}
		if gen.Val() == "" {
			if attempt > 0 {
				return WaitlistEntry{}, fmt.Errorf("reading the waitlist of %s: SKU still missing after rebuild", sku)
			}
			if err := e.Rebuild(ctx, sku); err != nil {
				return WaitlistEntry{}, err
			}
			continue
		}
		w, ok := parseWaitEntry(raw.Val())
		if !ok {
			return WaitlistEntry{SKU: sku, Principal: p.ID, Status: WaitLeft}, nil
		}
		w.SKU, w.Principal = sku, p.ID
		if w.Status == WaitWaiting && rank.Err() == nil {
			w.Position = int(rank.Val()) + 1
		}
		return e.withReservation(ctx, p, w), nil
	}
}

// parseWaitEntry decodes an entry of the waiters hash (wait_entry in lib.lua):
// "seq|qty|hold_ms|status|token|joined_ms".
func parseWaitEntry(raw string) (WaitlistEntry, bool) {
	var f [6]string
	n := 0
	start := 0
	for i := 0; i <= len(raw) && n < 6; i++ {
		if i == len(raw) || raw[i] == '|' {
			f[n] = raw[start:i]
			n++
			start = i + 1
		}
	}
	if n != 6 {
		return WaitlistEntry{}, false
	}
	num := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
	st := map[string]WaitStatus{"W": WaitWaiting, "O": WaitOffered}[f[3]]
	if st == "" {
		return WaitlistEntry{}, false
	}
	return WaitlistEntry{Seq: num(f[0]), Quantity: int(num(f[1])), HoldFor: time.Duration(num(f[2])) * time.Millisecond,
		Status: st, Token: f[4], JoinedAt: msTime(num(f[5]))}, true
}

// MaxMyWaitlist bounds the entries MyWaitlist lists (and so what the API
// prices the list at).
const MaxMyWaitlist = 100

// MyWaitlist lists the principal's waitlist entries, one per SKU, newest
// first: the SKUs from the ledger, each entry's live state from Redis (so an
// entry left shows as LEFT). A join is in the ledger before it answers
// unless Postgres was slow; the write-behind adds it otherwise.
func (a Waitlists) MyWaitlist(ctx context.Context, p Principal) ([]WaitlistEntry, error) {
	e := a.e
	if err := checkPrincipal(p); err != nil {
		return nil, err
	}
	rows, err := e.ledger.WaitlistOf(ctx, p.ID, MaxMyWaitlist)
	if err != nil {
		return nil, ledgerError("listing the waitlist", "", err)
	}
	out := make([]WaitlistEntry, 0, len(rows))
	for _, row := range rows {
		w, err := e.Waitlists().Waitlist(ctx, p, row.SKU)
		if err != nil {
			return nil, err
		}
		if w.Status == WaitLeft {
			w.Quantity, w.HoldFor, w.Seq, w.JoinedAt = row.Quantity, time.Duration(row.HoldMillis)*time.Millisecond, row.Seq, row.JoinedAt.UTC()
		}
		out = append(out, w)
	}
	return out, nil
}
