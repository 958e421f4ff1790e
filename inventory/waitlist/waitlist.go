// Package waitlist puts buyers in a SKU's waitlist and reads it (see
// Waitlist in package inventory's doc). Freed units reach waiters inside
// the scripts that free them (handoff in lua/lib.lua), and a walk left
// unfinished is taken further by package core (core.FinishWalk), which a
// reserve needs too.
//
//	join --> WAITING --units freed, its turn--> OFFERED (a HELD reservation)
//	            \--leave--> LEFT (the entry is deleted)
package waitlist

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// Waitlists puts buyers in a SKU's waitlist and reads it; package
// inventory's Engine.Waitlists hands them out.
type Waitlists struct{ c *core.Core }

// New is the waitlists of the engine whose shared parts c are.
func New(c *core.Core) Waitlists { return Waitlists{c: c} }

// Status is where a waitlist entry is:
//
//	join --> WAITING --units freed, its turn--> OFFERED (a HELD reservation)
//	            \--leave--> LEFT
type Status string

// The statuses of a waitlist entry.
const (
	Waiting Status = "WAITING"
	Offered Status = "OFFERED"
	Left    Status = "LEFT"
)

// Entry is one principal's place in a SKU's waitlist.
type Entry struct {
	SKU       string
	Principal string
	Quantity  int
	HoldFor   time.Duration
	Status    Status
	// Position is 1 for the next waiter to be served; 0 unless WAITING.
	Position int
	// Seq orders the SKU's entries by joining; it only grows.
	Seq      int64
	JoinedAt time.Time
	// Token names the reservation an OFFERED entry was handed; Reservation
	// is its state when the call read it (nil when it could not be read).
	Token       string
	Reservation *core.Reservation
	// Replayed is true when the call changed nothing: a join that found the
	// principal's entry, a leave that found none.
	Replayed bool
}

// JoinRequest asks to be handed units of a SKU when they come back.
type JoinRequest struct {
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
func (a Waitlists) JoinWaitlist(ctx context.Context, p core.Principal, req JoinRequest) (w Entry, err error) {
	c := a.c
	defer func() { c.Metrics.Outcome("join_waitlist", err) }()
	hold, err := c.Holds.CheckReserve(p, req.SKU, req.Quantity, req.HoldFor, "")
	if err != nil {
		return Entry{}, err
	}
	nonce := core.NewNonce()
	r, err := runWaitlist(ctx, c, req.SKU, func() (script.Wait, error) {
		// The keys are built again after a rebuild, which places a SKU of a drop.
		return script.RunJoinWaitlist(ctx, c.Run, c.Keys, script.JoinWaitlist{SKU: req.SKU, Principal: p.ID,
			Quantity: req.Quantity, HoldMs: hold.Milliseconds(), WaitlistMax: c.Limits.WaitlistMax, Nonce: nonce,
			MaxQuantity: c.Limits.MaxQuantity, MinHoldMs: c.Limits.MinHold.Milliseconds(), MaxHoldMs: c.Limits.MaxHold.Milliseconds(),
			Pass: req.AdmissionPass})
	})
	if err != nil {
		return Entry{}, fmt.Errorf("joining the waitlist of %s: %w", req.SKU, err)
	}
	if core.ReplyCode(r.Code) != core.CodeOK {
		if err := core.RejectionError(r.Rejection); err != nil {
			return Entry{}, err
		}
		return Entry{}, fmt.Errorf("joining the waitlist of %s: unexpected script reply %q", req.SKU, r.Code)
	}
	w = entryOf(r)
	if !w.Replayed {
		record(ctx, c, db.KindWaitJoin, w, w.JoinedAt)
	}
	return withReservation(ctx, c, p, w), nil
}

// LeaveWaitlist takes the principal out of the SKU's waitlist; the entry is
// returned as LEFT. Leaving when not in it changes nothing (Replayed). An
// OFFERED entry's reservation stays the principal's.
func (a Waitlists) LeaveWaitlist(ctx context.Context, p core.Principal, sku string) (w Entry, err error) {
	c := a.c
	defer func() { c.Metrics.Outcome("leave_waitlist", err) }()
	if err := core.CheckPrincipal(p); err != nil {
		return Entry{}, err
	}
	if !core.ValidSKU(sku) {
		return Entry{}, core.ProductNotFound(sku)
	}
	r, err := runWaitlist(ctx, c, sku, func() (script.Wait, error) {
		return script.RunLeaveWaitlist(ctx, c.Run, c.Keys, script.LeaveWaitlist{SKU: sku, Principal: p.ID})
	})
	if err != nil {
		return Entry{}, fmt.Errorf("leaving the waitlist of %s: %w", sku, err)
	}
	if core.ReplyCode(r.Code) != core.CodeOK {
		return Entry{}, fmt.Errorf("leaving the waitlist of %s: unexpected script reply %q", sku, r.Code)
	}
	w = entryOf(r)
	w.SKU, w.Principal = sku, p.ID
	if !w.Replayed {
		record(ctx, c, db.KindWaitLeave, w, time.Now())
	}
	w.Token = ""
	return w, nil
}

// runWaitlist runs a waitlist script, rebuilding the SKU first when Redis
// does not have it (the rebuild restores its waitlist from the ledger).
func runWaitlist(ctx context.Context, c *core.Core, sku string, run func() (script.Wait, error)) (script.Wait, error) {
	for attempt := 0; ; attempt++ {
		r, err := run()
		if err != nil {
			return r, err
		}
		if core.ReplyCode(r.Code) != core.CodeNeedsHydration {
			return r, nil
		}
		if attempt > 0 {
			return r, errors.New("SKU still missing after rebuild")
		}
		missing := r.Missing // the SKU, or another of its drop
		if missing == "" {
			missing = sku
		}
		if err := c.Holds.Rebuild(ctx, missing); err != nil {
			return r, err
		}
	}
}

// recordWaitlist writes a join or a leave Redis has just made to the ledger,
// best effort, as Cancel does for a release: myWaitlist lists from the
// ledger. The outbox event stays the guarantee.
func record(ctx context.Context, c *core.Core, kind string, w Entry, at time.Time) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), core.SyncReleaseTimeout)
	defer cancel()
	err := c.Ledger.ApplyEvents(wctx, nil, []db.Event{{
		ID: kind + ":" + w.SKU + ":" + strconv.FormatInt(w.Seq, 10), Kind: kind, Token: w.Token, SKU: w.SKU,
		Principal: w.Principal, Quantity: w.Quantity, CreatedAt: w.JoinedAt, At: at, Seq: w.Seq,
		HoldMillis: w.HoldFor.Milliseconds(),
	}})
	if err != nil {
		c.Log.Warn().Err(err).Str("sku", w.SKU).Str("kind", kind).Msg("could not record a waitlist change in the ledger at once; the write-behind will")
	}
}

// withReservation fills in the reservation an OFFERED entry was handed.
func withReservation(ctx context.Context, c *core.Core, p core.Principal, w Entry) Entry {
	if w.Status != Offered || w.Token == "" {
		return w
	}
	r, err := c.Holds.Reservation(ctx, p, w.Token)
	if err != nil {
		c.Log.Warn().Err(err).Str("token", w.Token).Msg("could not read an offered reservation")
		return w
	}
	w.Reservation = &r
	return w
}

// Waitlist returns the principal's live entry in a SKU's waitlist, with its
// position; the status is LEFT when it has none.
func (a Waitlists) Waitlist(ctx context.Context, p core.Principal, sku string) (Entry, error) {
	c := a.c
	if err := core.CheckPrincipal(p); err != nil {
		return Entry{}, err
	}
	if !core.ValidSKU(sku) {
		return Entry{}, core.ProductNotFound(sku)
	}
	for attempt := 0; ; attempt++ {
		var gen, raw *redis.StringCmd
		var rank *redis.IntCmd
		_, err := c.Redis.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			gen = pipe.HGet(ctx, c.Keys.SKU(sku), "gen")
			raw = pipe.HGet(ctx, c.Keys.WaitEntries(sku), p.ID)
			rank = pipe.ZRank(ctx, c.Keys.WaitQueue(sku), p.ID)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return Entry{}, core.Unavailable("reading the waitlist", err)
		}
		if gen.Val() == "" {
			if attempt > 0 {
				return Entry{}, fmt.Errorf("reading the waitlist of %s: SKU still missing after rebuild", sku)
			}
			if err := c.Holds.Rebuild(ctx, sku); err != nil {
				return Entry{}, err
			}
			continue
		}
		w, ok := parseEntry(raw.Val())
		if !ok {
			return Entry{SKU: sku, Principal: p.ID, Status: Left}, nil
		}
		w.SKU, w.Principal = sku, p.ID
		if w.Status == Waiting && rank.Err() == nil {
			w.Position = int(rank.Val()) + 1
		}
		return withReservation(ctx, c, p, w), nil
	}
}

// parseEntry decodes an entry of the waiters hash (wait_entry in lib.lua):
// "seq|qty|hold_ms|status|token|joined_ms".
func parseEntry(raw string) (Entry, bool) {
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
		return Entry{}, false
	}
	num := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
	st := map[string]Status{"W": Waiting, "O": Offered}[f[3]]
	if st == "" {
		return Entry{}, false
	}
	return Entry{Seq: num(f[0]), Quantity: int(num(f[1])), HoldFor: time.Duration(num(f[2])) * time.Millisecond,
		Status: st, Token: f[4], JoinedAt: core.MsTime(num(f[5]))}, true
}

// MaxMine bounds the entries MyWaitlist lists (and so what the API
// prices the list at).
const MaxMine = 100

// MyWaitlist lists the principal's waitlist entries, one per SKU, newest
// first: the SKUs from the ledger, each entry's live state from Redis (so an
// entry left shows as LEFT). A join is in the ledger before it answers
// unless Postgres was slow; the write-behind adds it otherwise.
func (a Waitlists) MyWaitlist(ctx context.Context, p core.Principal) ([]Entry, error) {
	c := a.c
	if err := core.CheckPrincipal(p); err != nil {
		return nil, err
	}
	rows, err := c.Ledger.Waitlists().WaitlistOf(ctx, p.ID, MaxMine)
	if err != nil {
		return nil, core.LedgerError("listing the waitlist", "", err)
	}
	out := make([]Entry, 0, len(rows))
	for _, row := range rows {
		w, err := a.Waitlist(ctx, p, row.SKU)
		if err != nil {
			return nil, err
		}
		if w.Status == Left {
			w.Quantity, w.HoldFor, w.Seq, w.JoinedAt = row.Quantity, time.Duration(row.HoldMillis)*time.Millisecond, row.Seq, row.JoinedAt.UTC()
		}
		out = append(out, w)
	}
	return out, nil
}

// entryOf is a decoded wait_reply as callers see it.
func entryOf(w script.Wait) Entry {
	st := map[string]Status{"W": Waiting, "O": Offered, "L": Left}[w.Status]
	return Entry{
		SKU: w.SKU, Principal: w.Who, Seq: w.Seq, Quantity: w.Qty,
		HoldFor: time.Duration(w.HoldMs) * time.Millisecond, Status: st, Token: w.Token,
		Position: w.Position, JoinedAt: core.MsTime(w.JoinedMs), Replayed: w.Replayed,
	}
}
