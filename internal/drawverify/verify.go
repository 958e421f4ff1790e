// Package drawverify recomputes a drawn SKU's result from its revealed seed
// and its entries and compares it with the result the ledger records. The
// shuffle is written here again from its description in docs/design.md
// (G14), apart from the engine's (inventory/draw_shuffle.go), so that a
// mistake in either shows up as a mismatch. `dropline verify-draw` and the
// flashsale draw rehearsal both use it.
package drawverify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/dropline/dropline/db"
)

// Check is the verification itself: the seed against its published hash,
// then every entry's place and outcome against a recomputation. It prints
// up to 10 mismatches and a summary line to out, and fails when anything
// disagrees.
func Check(out io.Writer, d db.Draw, entries []db.DrawEntry) error {
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
	// 4. Fill the stock in shuffled order, skipping entries that do not fit.
	left, winners, mismatches := d.Stock, 0, 0
	for place, idx := range order {
		en := entries[idx]
		want := db.EntryLost
		if left > 0 && en.Quantity <= left {
			want = db.EntryWon
			left -= en.Quantity
			winners++
		}
		if en.Place != place+1 || en.Status != want {
			if mismatches < 10 {
				fmt.Fprintf(out, "entry %d: recorded place %d %s, recomputed place %d %s\n", en.ID, en.Place, en.Status, place+1, want)
			}
			mismatches++
		}
	}
	if winners != d.Winners {
		mismatches++
		fmt.Fprintf(out, "winners: recorded %d, recomputed %d\n", d.Winners, winners)
	}
	if mismatches > 0 {
		return fmt.Errorf("draw of %s does NOT verify: %d mismatches", d.SKU, mismatches)
	}
	fmt.Fprintf(out, "draw of %s verified: %d entries, %d units, %d winners; seed %s hashes to the published %s\n",
		d.SKU, n, d.Stock, winners, hex.EncodeToString(d.Seed), d.SeedHash)
	return nil
}
