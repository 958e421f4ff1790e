// Package drawverify recomputes a drawn SKU's result from its revealed seed
// and its entries and compares it with the result the ledger records, then
// checks what the draw handed out: that its stock was free when it ran, and
// that every winner holds a reservation of its quantity under the token the
// result gave it. The shuffle is written here again from its description in
// docs/design.md (G14), apart from the engine's (inventory/draw/draw_shuffle.go),
// so that a mistake in either shows up as a mismatch. `dropline verify-draw`
// and the flashsale draw rehearsal both use it.
package drawverify

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/dropline/dropline/db"
)

// Verify reads a SKU's draw, its entries and what it handed out from the
// ledger and checks them (Check). The draw must be drawn and carried to its
// winners (Product.draw.applied): only then does the ledger have their
// reservations.
func Verify(ctx context.Context, out io.Writer, l *db.Ledger, sku string) error {
	d, err := l.Draws().Draw(ctx, sku)
	if err != nil {
		return fmt.Errorf("reading the draw of %s: %w", sku, err)
	}
	if d.Status != db.DrawDrawn {
		return fmt.Errorf("the draw of %s is %s: its seed is revealed only once it is drawn", sku, d.Status)
	}
	if d.AppliedAt == nil {
		return fmt.Errorf("the draw of %s is drawn but not yet carried to its winners: verify it once it is applied", sku)
	}
	entries, err := l.Draws().DrawEntries(ctx, sku)
	if err != nil {
		return fmt.Errorf("reading the entries of %s: %w", sku, err)
	}
	h, err := l.Draws().DrawHandout(ctx, sku)
	if err != nil {
		return err
	}
	return Check(out, d, entries, h)
}

// heldStatuses are the statuses a reservation the draw made can have: it
// was HELD, and may since have been committed, cancelled or expired.
var heldStatuses = map[string]bool{"HELD": true, "COMMITTED": true, "CANCELLED": true, "EXPIRED": true}

// Check is the verification itself: the seed against its published hash,
// then every entry's place and outcome against a recomputation, then what
// the draw handed out (h): its stock within what was free when it ran (the
// total then, less what other reservations held or had sold), and for every
// winner a reservation under its token, of its principal and quantity, in a
// status a hold can reach, the units of all of them within the stock. It
// prints up to 10 mismatches and a summary line to out, and fails when
// anything disagrees.
func Check(out io.Writer, d db.Draw, entries []db.DrawEntry, h db.DrawHandout) error {
	sum := sha256.Sum256(d.Seed)
	if hex.EncodeToString(sum[:]) != d.SeedHash {
		return fmt.Errorf("draw of %s: the seed does not hash to the published seedHash %s", d.SKU, d.SeedHash)
	}
	// 1. Entries by id (the ledger returns them so; checked, not assumed).
	for i := 1; i < len(entries); i++ {
		if entries[i].ID <= entries[i-1].ID {
			return fmt.Errorf("draw of %s: entries are not sorted by id", d.SKU)
		}
	}
	// 2. and 3. Fisher–Yates over indices, numbers from HMAC-SHA256(seed, k).
	n := len(entries)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	mac := hmac.New(sha256.New, d.Seed)
	var k uint64
	next := func() uint64 {
		var msg [8]byte
		binary.BigEndian.PutUint64(msg[:], k)
		k++
		mac.Reset()
		mac.Write(msg[:])
		return binary.BigEndian.Uint64(mac.Sum(nil)[:8])
	}
	for i := n - 1; i >= 1; i-- {
		bound := uint64(i + 1)
		rem := (-bound) % bound // 2^64 mod bound
		r := next()
		for rem != 0 && r > ^uint64(0)-rem {
			r = next()
		}
		j := int(r % bound)
		order[i], order[j] = order[j], order[i]
	}
	mismatches := 0
	mismatch := func(format string, args ...any) {
		if mismatches < 10 {
			fmt.Fprintf(out, format+"\n", args...)
		}
		mismatches++
	}
	// 4. Fill the stock in shuffled order, skipping entries that do not fit.
	left, winners := d.Stock, 0
	for place, idx := range order {
		en := entries[idx]
		want := db.EntryLost
		if left > 0 && en.Quantity <= left {
			want = db.EntryWon
			left -= en.Quantity
			winners++
		}
		if en.Place != place+1 || en.Status != want {
			mismatch("entry %d: recorded place %d %s, recomputed place %d %s", en.ID, en.Place, en.Status, place+1, want)
		}
	}
	if winners != d.Winners {
		mismatch("winners: recorded %d, recomputed %d", d.Winners, winners)
	}
	// What it handed out: stock that was free, and each winner's hold.
	if free := h.Total - h.Others; d.Stock > free {
		mismatch("stock: the draw gave out %d units, but %d were free when it ran (total %d, held or sold by other reservations %d)",
			d.Stock, free, h.Total, h.Others)
	}
	units := 0
	for _, w := range h.Winners {
		en, v := w.Entry, w.Held
		switch {
		case v == nil && w.Unheld != "":
			mismatch("winner at place %d (%s): no reservation; its hold could not be made (%s), so it waits in the waitlist", en.Place, en.Principal, w.Unheld)
		case v == nil:
			mismatch("winner at place %d (%s): no reservation under its token %s", en.Place, en.Principal, en.Token)
		case v.Principal != en.Principal || v.Quantity != en.Quantity || !heldStatuses[v.Status]:
			mismatch("winner at place %d (%s, %d units): its reservation is %s's, %d units, %s", en.Place, en.Principal, en.Quantity,
				v.Principal, v.Quantity, v.Status)
		default:
			units += v.Quantity
		}
	}
	if len(h.Winners) != d.Winners {
		mismatch("winners: %d recorded with a result, %d counted by the draw", len(h.Winners), d.Winners)
	}
	if units > d.Stock {
		mismatch("handed out: %d units held by winners, more than the draw's %d", units, d.Stock)
	}
	if mismatches > 0 {
		return fmt.Errorf("draw of %s does NOT verify: %d mismatches", d.SKU, mismatches)
	}
	fmt.Fprintf(out, "draw of %s verified: %d entries, %d units, %d winners holding %d units; seed %s hashes to the published %s\n",
		d.SKU, n, d.Stock, winners, units, hex.EncodeToString(d.Seed), d.SeedHash)
	return nil
}
