// Package draw sells a product by draw: it takes entries until the draw
// closes, then picks the winners from a published seed (the shuffle in
// draw_shuffle.go) and carries the result to Redis, every winner a HELD
// reservation and every loser a waitlist place (see Draws in package
// inventory's doc). Like every aggregate package it reaches the engine
// only through package core, and the holds through Holds.
package draw

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/script"
)

// Input makes a new product sold by draw: between its sale start and
// ClosesAt it takes entries (EnterDraw) instead of reserves; at ClosesAt the
// draw picks the winners (RunDraw), who get HELD reservations of WinnerHold.
type Input struct {
	ClosesAt   time.Time
	WinnerHold time.Duration
}

// The statuses of a draw and of an entry.
const (
	Open  = db.DrawOpen
	Drawn = db.DrawDrawn

	Entered = db.EntryEntered
	Won     = db.EntryWon
	Lost    = db.EntryLost
)

// Draw is a product's draw as anyone may see it.
type Draw struct {
	SKU        string
	ClosesAt   time.Time
	WinnerHold time.Duration
	Status     string
	// Entries is the number of entries (live while OPEN).
	Entries int
	// SeedHash is the hex SHA-256 of the seed, published from the start.
	SeedHash string
	// Seed is revealed once the draw is DRAWN; nil before.
	Seed []byte
	// Stock and Winners are set once DRAWN: the units given out, the winning entries.
	Stock, Winners int
	DrawnAt        *time.Time
	// Applied says Redis has the result (the winners' holds, the losers'
	// places); AppliedAt is when that was recorded, nil before.
	Applied   bool
	AppliedAt *time.Time
}

// Entry is a principal's entry in a draw.
type Entry struct {
	ID        int64
	SKU       string
	Principal string
	Quantity  int
	EnteredAt time.Time
	Status    string
	// Place is the entry's position in the draw's shuffled order; 0 before it.
	Place int
	// Token names a winner's reservation; Reservation is its state when read.
	Token       string
	Reservation *core.Reservation
	// Replayed is true when EnterDraw found the principal's entry.
	Replayed bool
}

func from(d db.Draw) Draw {
	return Draw{
		SKU: d.SKU, ClosesAt: d.ClosesAt.UTC(), WinnerHold: time.Duration(d.WinnerHoldMillis) * time.Millisecond,
		Status: d.Status, Entries: d.Entries, SeedHash: d.SeedHash, Seed: d.Seed, Stock: d.Stock, Winners: d.Winners,
		DrawnAt: core.UTCPtr(d.DrawnAt), Applied: d.AppliedAt != nil, AppliedAt: core.UTCPtr(d.AppliedAt),
	}
}

func entryFrom(e db.DrawEntry) Entry {
	return Entry{ID: e.ID, SKU: e.SKU, Principal: e.Principal, Quantity: e.Quantity, EnteredAt: e.EnteredAt.UTC(),
		Status: e.Status, Place: e.Place, Token: e.Token}
}

// Check validates a new product's draw against the product's sale window
// (saleStarts, saleEnds: nil for none) and the hold bounds.
func Check(d Input, saleStarts, saleEnds *time.Time, l core.Limits) error {
	if d.ClosesAt.IsZero() {
		return &outcome.InvalidInputError{Field: "draw.closesAt", Reason: "is required"}
	}
	if saleStarts != nil && !d.ClosesAt.After(*saleStarts) {
		return &outcome.InvalidInputError{Field: "draw.closesAt", Reason: "must be after saleStartsAt"}
	}
	if saleEnds != nil && !saleEnds.After(d.ClosesAt) {
		return &outcome.InvalidInputError{Field: "draw.closesAt", Reason: "must be before saleEndsAt"}
	}
	if d.WinnerHold < l.MinHold || d.WinnerHold > l.MaxHold {
		return &outcome.InvalidInputError{Field: "draw.winnerHoldSeconds", Reason: fmt.Sprintf("must be between %d and %d",
			int(l.MinHold/time.Second), int(l.MaxHold/time.Second))}
	}
	return nil
}

// Seeded is a new product's draw as the ledger records it, its seed fixed:
// 32 bytes from crypto/rand.
func Seeded(d Input) *db.NewDraw {
	seed := make([]byte, 32)
	if _, err := rand.Read(seed); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return &db.NewDraw{ClosesAt: d.ClosesAt, WinnerHold: d.WinnerHold, Seed: seed}
}

// DrawOf returns a product's draw, or nil when the product is not sold by draw.
func (a Draws) DrawOf(ctx context.Context, sku string) (*Draw, error) {
	if !core.ValidSKU(sku) {
		return nil, core.ProductNotFound(sku)
	}
	list, err := a.DrawsOf(ctx, []string{sku})
	if err != nil {
		return nil, err
	}
	return list[0], nil
}

// DrawsOf returns the draws of several products in one Postgres query; a
// nil entry is a product not sold by draw (or an unknown SKU). It exists
// for per-request batching.
func (a Draws) DrawsOf(ctx context.Context, skus []string) ([]*Draw, error) {
	e := a.e
	valid := make([]string, 0, len(skus))
	for _, s := range skus {
		if core.ValidSKU(s) {
			valid = append(valid, s)
		}
	}
	rows, err := e.ledger.Draws().DrawsBySKU(ctx, valid)
	if err != nil {
		return nil, core.LedgerError("reading draws", "", err)
	}
	bySKU := make(map[string]Draw, len(rows))
	for _, r := range rows {
		bySKU[r.SKU] = from(r)
	}
	out := make([]*Draw, len(skus))
	for i, s := range skus {
		if d, ok := bySKU[s]; ok {
			out[i] = &d
		}
	}
	return out, nil
}

// DrawEntries returns every entry of a SKU's draw by id, as the shuffle
// takes them, for verifiers and audits.
func (a Draws) DrawEntries(ctx context.Context, sku string) ([]Entry, error) {
	e := a.e
	rows, err := e.ledger.Draws().DrawEntries(ctx, sku)
	if err != nil {
		return nil, core.LedgerError("reading the draw's entries", sku, err)
	}
	out := make([]Entry, len(rows))
	for i, r := range rows {
		out[i] = entryFrom(r)
	}
	return out, nil
}

// EnterDraw enters the principal in a SKU's draw for quantity units. One
// entry per principal: entering again returns the entry (Replayed). The
// entry is a Postgres row before the answer: concurrent entries are recorded
// together, in one transaction (entryBatcher), each answered once it
// committed. Refusals: *InvalidInputError
// (a bad quantity, or a product not sold by draw), *NotFoundError,
// *SaleNotActiveError (outside saleStartsAt..closesAt, or drawn: EndsAt is
// closesAt), *QuotaExceededError (above the per-principal limit).
func (a Draws) EnterDraw(ctx context.Context, p core.Principal, sku string, quantity int) (w Entry, err error) {
	e := a.e
	defer func() { e.core.Metrics.Outcome("enter_draw", err) }()
	if err := core.CheckPrincipal(p); err != nil {
		return Entry{}, err
	}
	if !core.ValidSKU(sku) {
		return Entry{}, core.ProductNotFound(sku)
	}
	if most := e.core.Limits.MaxQuantity; quantity < 1 || quantity > most {
		return Entry{}, &outcome.InvalidInputError{Field: "quantity", Reason: fmt.Sprintf("must be between 1 and %d", most)}
	}
	ans, err := e.enterInBatch(ctx, db.DrawEntryRequest{SKU: sku, Principal: p.ID, Quantity: quantity})
	if err == nil {
		err = ans.Err
	}
	row, replayed := ans.Entry, ans.Replayed
	var closed *db.DrawClosedError
	var quota *db.DrawQuotaError
	switch {
	case errors.As(err, &closed):
		ends := closed.ClosesAt.UTC()
		return Entry{}, &outcome.SaleNotActiveError{StartsAt: core.UTCPtr(closed.StartsAt), EndsAt: &ends}
	case errors.As(err, &quota):
		return Entry{}, &outcome.QuotaExceededError{Limit: quota.Limit}
	case errors.Is(err, db.ErrNotFound):
		if _, perr := e.ledger.Product(ctx, sku); perr == nil {
			return Entry{}, &outcome.InvalidInputError{Field: "sku", Reason: "this product is not sold by draw"}
		}
		return Entry{}, core.ProductNotFound(sku)
	case err != nil:
		return Entry{}, core.LedgerError("entering the draw", sku, err)
	}
	w = entryFrom(row)
	w.Replayed = replayed
	return e.withReservation(ctx, p, w), nil
}

// MaxMine bounds the entries MyDrawEntries lists (and so what the API
// prices the list at).
const MaxMine = 100

// MyDrawEntries lists the principal's draw entries, newest first, with a
// winner's reservation.
func (a Draws) MyDrawEntries(ctx context.Context, p core.Principal) ([]Entry, error) {
	e := a.e
	if err := core.CheckPrincipal(p); err != nil {
		return nil, err
	}
	rows, err := e.ledger.Draws().DrawEntriesOf(ctx, p.ID, MaxMine)
	if err != nil {
		return nil, core.LedgerError("listing draw entries", "", err)
	}
	out := make([]Entry, len(rows))
	for i, r := range rows {
		out[i] = e.withReservation(ctx, p, entryFrom(r))
	}
	return out, nil
}

// MyDrawEntry returns the principal's entry in a SKU's draw, with a
// winner's reservation; *NotFoundError when it has none.
func (a Draws) MyDrawEntry(ctx context.Context, p core.Principal, sku string) (Entry, error) {
	e := a.e
	if err := core.CheckPrincipal(p); err != nil {
		return Entry{}, err
	}
	if !core.ValidSKU(sku) {
		return Entry{}, &outcome.NotFoundError{Kind: "draw entry", Key: sku}
	}
	row, err := e.ledger.Draws().DrawEntryOf(ctx, sku, p.ID)
	if errors.Is(err, db.ErrNotFound) {
		return Entry{}, &outcome.NotFoundError{Kind: "draw entry", Key: sku}
	}
	if err != nil {
		return Entry{}, core.LedgerError("reading a draw entry", sku, err)
	}
	return e.withReservation(ctx, p, entryFrom(row)), nil
}

// WithReservation adds a winner's reservation to an entry read elsewhere
// (the live result of a draw), as the principal may read it.
func (a Draws) WithReservation(ctx context.Context, p core.Principal, w Entry) Entry {
	return a.e.withReservation(ctx, p, w)
}

// AppliedResult returns a SKU's draw result, every entry in draw order,
// once the result has been carried to Redis in full (the winners hold,
// the losers are queued); applied is false, and entries nil, before. It is
// what live updates read once per process to tell every entrant.
func (a Draws) AppliedResult(ctx context.Context, sku string) (applied bool, entries []Entry, err error) {
	e := a.e
	d, err := e.ledger.Draws().Draw(ctx, sku)
	if errors.Is(err, db.ErrNotFound) {
		return false, nil, &outcome.NotFoundError{Kind: "draw", Key: sku}
	}
	if err != nil {
		return false, nil, core.LedgerError("reading the draw", sku, err)
	}
	if d.AppliedAt == nil {
		return false, nil, nil
	}
	rows, err := e.ledger.Draws().DrawResult(ctx, sku)
	if err != nil {
		return false, nil, core.LedgerError("reading the draw's result", sku, err)
	}
	entries = make([]Entry, len(rows))
	for i, r := range rows {
		entries[i] = entryFrom(r)
	}
	return true, entries, nil
}

func (e *engine) withReservation(ctx context.Context, p core.Principal, w Entry) Entry {
	if w.Token == "" {
		return w
	}
	r, err := e.holds.Reservation(ctx, p, w.Token)
	if err != nil {
		// Not applied to Redis yet, or the hold is gone: the entry still says WON.
		return w
	}
	w.Reservation = &r
	return w
}

// Decision computes a draw's outcome for entries in id order: each
// entry's place and whether it won (see draw_shuffle.go). It is what the
// draw records and what a verifier recomputes.
func Decision(seed []byte, stock int, quantities []int) (places []int, won []bool) {
	order, won := Winners(seed, stock, quantities)
	places = make([]int, len(quantities))
	for p, i := range order {
		places[i] = p + 1
	}
	return places, won
}

// Stage names a point of RunDrawSteps.
type Stage string

// The stages RunDrawSteps reports.
const (
	// Decided: the result is computed, not yet committed.
	Decided Stage = "decided"
	// Applying: a batch of the result was written to Redis (applied says
	// how many entries are written so far).
	Applying Stage = "applying"
)

// Report is what one RunDraw did.
type Report struct {
	Draw Draw
	// Drew is true when this call drew (false: it was drawn before).
	Drew bool
	// Holds and Queued are the winners' holds and waitlist places this call
	// wrote to Redis; Unheld the winners whose hold could not be made, which
	// it recorded in the ledger (they wait first in the waitlist).
	Holds, Queued, Unheld int
	// Decide is the time the Postgres transaction took (draw and record),
	// Apply the time carrying the result to Redis took.
	Decide, Apply time.Duration
}

// applyBatch is how many entries one apply_draw.lua call writes: a
// few milliseconds of Redis's time, which runs nothing else meanwhile (a
// loser costs four writes and an outbox entry).
const applyBatch = 250

// RunDraw draws a SKU whose entries have closed and carries the result to
// Redis. The draw is one Postgres transaction under the product's row lock
// (db.Draws.RunDraw), so it happens once however many processes call this;
// a crash before its commit leaves nothing, and the next call decides the
// same result from the same seed and entries. Carrying it to Redis is
// batches of apply_draw.lua in draw order, each applied once (the batch
// checks the progress it moves), so a call after a crash goes on where the
// last one stopped. Calling it for a draw not yet due is *InvalidInputError.
func (a Draws) RunDraw(ctx context.Context, sku string) (Report, error) {
	return a.RunDrawSteps(ctx, sku, a.e.pause())
}

// Pause is a test-only pause of RunDraw at one step (see package
// inventory's Config.DrawPause).
type Pause struct {
	// At is where: PauseDecided (the result computed inside the draw's
	// Postgres transaction, not committed) or PauseApplied (the first
	// batch of the result written to Redis, the rest not yet); "" never
	// pauses.
	At string
	// For is how long.
	For time.Duration
}

// The steps a Pause may stop at.
const (
	PauseDecided = "decided"
	PauseApplied = "applied"
)

// Validate refuses a step that is none of the two, or a negative time.
func (c Pause) Validate() error {
	if (c.At != "" && c.At != PauseDecided && c.At != PauseApplied) || c.For < 0 {
		return fmt.Errorf("draw pause %q for %s: the step must be %q or %q, the time not negative", c.At, c.For, PauseDecided, PauseApplied)
	}
	return nil
}

// pause is the step function of Settings.Pause, nil when none is set;
// only the fault tests set one, to kill a server in the middle of a draw.
// It waits once per draw, at the first point of its kind.
func (e *engine) pause() func(Stage, int) error {
	p := e.cfg.Pause
	if p.At == "" || p.For <= 0 {
		return nil
	}
	paused := false
	return func(stage Stage, applied int) error {
		var step string
		switch {
		case paused:
			return nil
		case p.At == PauseDecided && stage == Decided:
			step = "draw decided, not committed"
		case p.At == PauseApplied && stage == Applying:
			step = "first batch of the draw applied"
		default:
			return nil
		}
		paused = true
		e.log.Warn().Str("step", step).Int("applied", applied).Dur("pause", p.For).Msg("test-only pause between the steps of a draw")
		time.Sleep(p.For)
		return nil
	}
}

// RunDrawSteps is RunDraw, calling step (when not nil) at each stage; an
// error from step stops the draw there as a crash would, which is what the
// fault tests use.
func (a Draws) RunDrawSteps(ctx context.Context, sku string, step func(stage Stage, applied int) error) (rep Report, err error) {
	e := a.e
	if step == nil {
		step = func(Stage, int) error { return nil }
	}
	partition := e.keys.PartitionOf(sku)
	began := time.Now()
	d, drew, err := e.ledger.Draws().RunDraw(ctx, sku, func(seed []byte, stock int, entries []db.DrawEntry) ([]db.DrawOutcome, error) {
		qty := make([]int, len(entries))
		for i, en := range entries {
			qty[i] = en.Quantity
		}
		places, won := Decision(seed, stock, qty)
		out := make([]db.DrawOutcome, len(entries))
		for i, en := range entries {
			out[i] = db.DrawOutcome{ID: en.ID, Place: places[i], Won: won[i]}
			if won[i] {
				out[i].Token = core.NewToken(partition)
			}
		}
		return out, step(Decided, 0)
	})
	if errors.Is(err, db.ErrInvalid) {
		return Report{}, &outcome.InvalidInputError{Field: "sku", Reason: "the draw has not closed yet"}
	}
	if err != nil {
		return Report{}, core.LedgerError("drawing", sku, err)
	}
	rep = Report{Draw: from(d), Drew: drew, Decide: time.Since(began)}
	if rep.Draw.Applied {
		return rep, nil
	}
	began = time.Now()
	defer func() { rep.Apply = time.Since(began) }()
	result, err := e.ledger.Draws().DrawResult(ctx, sku)
	if err != nil {
		return rep, core.LedgerError("reading the draw's result", sku, err)
	}
	result = applyOrder(result, e.core.Limits.WaitlistMax)
	done := 0
	for done < len(result) {
		end := min(done+applyBatch, len(result))
		entries := make([]script.DrawEntry, 0, end-done)
		for _, en := range result[done:end] {
			entries = append(entries, script.DrawEntry{Won: en.Status == db.EntryWon, Principal: en.Principal,
				Quantity: en.Quantity, Token: en.Token})
		}
		r, err := script.RunApplyDraw(ctx, e.core.Run, e.keys, script.ApplyDraw{SKU: sku, Done: done,
			HoldMs: d.WinnerHoldMillis, WaitlistMax: e.core.Limits.WaitlistMax, Nonce: core.NewNonce(), Entries: entries})
		if err != nil {
			return rep, fmt.Errorf("applying the draw of %s: %w", sku, err)
		}
		switch core.ReplyCode(r.Code) {
		case core.CodeOK:
			rep.Holds += r.Holds
			rep.Queued += r.Queued
			done = end
		case core.CodeSkip:
			done = r.Done // applied before: go on from where it stands
		case core.CodeNeedsHydration:
			if err := e.holds.Rebuild(ctx, sku); err != nil {
				return rep, err
			}
			continue
		default:
			return rep, fmt.Errorf("applying the draw of %s: unexpected script reply %q", sku, r.Code)
		}
		if err := step(Applying, done); err != nil {
			return rep, err
		}
	}
	if rep.Unheld, err = e.recordHolds(ctx, sku, result); err != nil {
		return rep, err
	}
	if err := e.ledger.Draws().MarkDrawApplied(ctx, sku); err != nil {
		return rep, core.LedgerError("marking the draw applied", sku, err)
	}
	rep.Draw.Applied = true
	// One message for the whole draw: each process's live updates read the
	// result once and tell every entrant watching there. Lost, it is made
	// up for by their periodic re-read.
	if err := e.rdb.SPublish(ctx, e.keys.DrawChannel(sku), sku).Err(); err != nil {
		e.log.Warn().Err(err).Str("sku", sku).Msg("announcing an applied draw (watchers re-read it later)")
	}
	return rep, nil
}

// applyOrder is the order in which a result (by place) goes to Redis:
// every winner in draw order, then the losers in draw order, as many as the
// waitlist keeps (a draw's waitlist starts empty: joins are refused; losers
// after those would find it full, so they are not sent). The winners come
// first so that the units of a winner not yet applied can never go to a
// waiter, and a winner whose hold cannot be made waits ahead of every loser
// (apply_draw.lua).
func applyOrder(result []db.DrawEntry, waitlistMax int) []db.DrawEntry {
	out := make([]db.DrawEntry, 0, len(result))
	losers := make([]db.DrawEntry, 0, min(len(result), waitlistMax))
	for _, en := range result {
		switch {
		case en.Status == db.EntryWon:
			out = append(out, en)
		case len(losers) < waitlistMax:
			losers = append(losers, en)
		}
	}
	return append(out, losers...)
}

// recordHolds ends carrying a draw to Redis by bringing the ledger up to
// what Redis has, before the draw is marked applied: a winner whose hold
// could not be made (apply_draw.lua recorded the policy's refusal in the
// draw's progress and put it first in the waitlist) is recorded in the
// ledger's result, logged and counted, never dropped silently; and every
// winner's hold is written to the ledger at once (the write-behind would
// also bring it, later), so that once a draw is applied the ledger holds
// what it handed out and `dropline verify-draw` can check it. It returns how
// many winners were recorded as not held by this call.
func (e *engine) recordHolds(ctx context.Context, sku string, result []db.DrawEntry) (int, error) {
	progress, err := e.rdb.HGetAll(ctx, e.keys.DrawProgress(sku)).Result()
	if err != nil {
		return 0, core.Unavailable("reading the draw's progress", err)
	}
	unheld := map[string]string{}
	for f, code := range progress {
		if tok, ok := strings.CutPrefix(f, "short:"); ok {
			unheld[tok] = code
		}
	}
	recorded, err := e.ledger.Draws().RecordDrawUnheld(ctx, sku, unheld)
	if err != nil {
		return 0, core.LedgerError("recording the draw's winners not held", sku, err)
	}
	who := map[string]string{}
	var tokens []string
	for _, en := range result {
		if en.Status == db.EntryWon {
			who[en.Token] = en.Principal
			tokens = append(tokens, en.Token)
		}
	}
	for _, tok := range recorded {
		e.metrics.unheld.Inc()
		e.log.Error().Str("sku", sku).Str("principal", who[tok]).Str("token", tok).Str("refusal", unheld[tok]).
			Msg("a draw's winner could not be held: the units the draw counted were not there; it waits first in the waitlist")
	}
	p := e.keys.PartitionOf(sku)
	for len(tokens) > 0 {
		chunk := tokens[:min(applyBatch, len(tokens))]
		tokens = tokens[len(chunk):]
		cmds := make([]*redis.MapStringStringCmd, len(chunk))
		_, err := e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, tok := range chunk {
				cmds[i] = pipe.HGetAll(ctx, e.keys.Hold(p, tok))
			}
			return nil
		})
		if err != nil {
			return 0, core.Unavailable("reading the draw's holds", err)
		}
		events := make([]db.Event, 0, len(chunk))
		for i, c := range cmds {
			h := e.holds.HoldFromHash(chunk[i], c.Val())
			if h.SKU != sku {
				continue // not held (recorded above)
			}
			events = append(events, db.Event{
				ID: "reserve:" + h.Token, Kind: "reserve", Token: h.Token, SKU: sku, Principal: h.Principal, Quantity: h.Quantity,
				ExpiresAt: h.ExpiresAt, CreatedAt: h.CreatedAt, At: h.CreatedAt, Extensions: h.Extensions,
			})
		}
		if err := e.ledger.ApplyEvents(ctx, nil, events); err != nil {
			return 0, core.LedgerError("recording the draw's holds", sku, err)
		}
	}
	return len(recorded), nil
}

// DueDraws lists up to limit SKUs whose draw should run now (closed and not
// drawn, or drawn and not yet applied to Redis).
func (a Draws) DueDraws(ctx context.Context, limit int) ([]string, error) {
	e := a.e
	skus, err := e.ledger.Draws().DueDraws(ctx, limit)
	if err != nil {
		return nil, core.Unavailable("listing due draws", err)
	}
	return skus, nil
}
