package inventory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dropline/dropline/inventory"
)

// checkBalanced fails when the SKU's counters break available + held +
// sold == total or the total moved.
func checkBalanced(t *testing.T, b *bundle, sku string, total int) {
	t.Helper()
	s, err := b.engine.Catalog().Stock(b.ctx, sku)
	if err != nil {
		t.Fatalf("stock of %s: %v", sku, err)
	}
	if s.Total != total || s.Available+s.Held+s.Sold != s.Total || s.Available < 0 || s.Held < 0 {
		t.Fatalf("stock of %s out of balance: %+v", sku, s)
	}
}

// FuzzReserveInput sends arbitrary reserve requests through the engine to
// real Redis: every answer is a hold or a typed business error (never an
// untyped one, never a panic), invalid SKUs, quantities, hold durations
// and idempotency keys are INVALID_INPUT, and the stock stays balanced.
// Every hold made is cancelled again, so the stock is back to full.
func FuzzReserveInput(f *testing.F) {
	b := setup(f, "single", inventory.Config{})
	const sku, total = "FUZZ-1", 50
	b.product(f, sku, total, 0)
	for _, seed := range []struct {
		sku    string
		qty    int
		key    string
		holdMs int64
	}{
		{sku, 1, "", 0}, {sku, 0, "", 0}, {sku, -1, "k", 1000}, {sku, 101, "", 0}, {sku, 1 << 40, "", 0},
		{sku, 2, "cart-1", 60_000}, {sku, 2, "cart-1", 61_000}, {sku, 1, "", 999}, {sku, 1, "", 3_600_001},
		{"", 1, "", 0}, {"FUZZ-1\x00", 1, "", 0}, {"x{p00}y", 1, "", 0}, {"NO-SUCH", 1, "", 0},
		{sku, 1, "\xff\xfe", 0}, {sku, 1, string(make([]byte, 129)), 0}, {"é", 1, "", 0},
	} {
		f.Add(seed.sku, seed.qty, seed.key, seed.holdMs)
	}
	admin := inventory.Principal{ID: "admin", Admin: true}
	f.Fuzz(func(t *testing.T, sku string, qty int, key string, holdMs int64) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := inventory.ReserveRequest{SKU: sku, Quantity: qty, IdempotencyKey: key, HoldFor: time.Duration(holdMs) * time.Millisecond}
		res, err := b.engine.Reserve(ctx, inventory.Principal{ID: "fuzzer"}, req)
		switch {
		case err == nil:
			if res.SKU != sku || res.Quantity != qty || qty < 1 || !inventory.ValidSKU(sku) {
				t.Fatalf("hold %+v for request %+v", res, req)
			}
			if _, err := b.engine.Cancel(ctx, admin, res.Token); err != nil {
				t.Fatalf("cancelling %s: %v", res.Token, err)
			}
		case inventory.ErrorCode(err) == "" || errors.Is(err, inventory.ErrUnavailable):
			t.Fatalf("untyped error for %+v: %v", req, err)
		case !inventory.ValidSKU(sku) || qty < 1 || qty > 100:
			if !errors.Is(err, inventory.ErrInvalidInput) {
				t.Fatalf("invalid request %+v answered %v", req, err)
			}
		}
		checkBalanced(t, b, "FUZZ-1", total)
	})
}

// FuzzReservationToken commits and cancels arbitrary token strings: each
// is INVALID_INPUT (malformed) or NOT_FOUND (well formed, never issued),
// and nothing changes.
func FuzzReservationToken(f *testing.F) {
	b := setup(f, "single", inventory.Config{})
	const sku, total = "FUZZ-2", 5
	b.product(f, sku, total, 0)
	held, err := b.engine.Reserve(b.ctx, inventory.Principal{ID: "holder"}, inventory.ReserveRequest{SKU: sku, Quantity: 2})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"", "r", "r07.", "r00.aaaaaaaaaaaaaaaaaaaaaaaaaa", "r15.77777777777777777777777777",
		"r16.aaaaaaaaaaaaaaaaaaaaaaaaaa", "r-1.aaaaaaaaaaaaaaaaaaaaaaaaaa", "r07.AAAAAAAAAAAAAAAAAAAAAAAAAA",
		"r07.aaaaaaaaaaaaaaaaaaaaaaaaa8", "r07.aaaaaaaaaaaaaaaaaaaaaaaaa\x00", "r 7.aaaaaaaaaaaaaaaaaaaaaaaaaa",
		"r+7.aaaaaaaaaaaaaaaaaaaaaaaaaa", held.Token[:len(held.Token)-1] + "a", "r07.aaaaaaaaaaaaaaaaaaaaaaaaaa*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		if token == held.Token {
			return // the one real hold belongs to someone else anyway
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, op := range []struct {
			name string
			fn   func(context.Context, inventory.Principal, string) (inventory.Reservation, error)
		}{{"commit", b.engine.Commit}, {"cancel", b.engine.Cancel}} {
			_, err := op.fn(ctx, inventory.Principal{ID: "fuzzer"}, token)
			if !errors.Is(err, inventory.ErrInvalidInput) && !errors.Is(err, inventory.ErrNotFound) {
				t.Fatalf("%s %q: want INVALID_INPUT or NOT_FOUND, got %v", op.name, token, err)
			}
		}
		s, err := b.engine.Catalog().Stock(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		if s.Total != total || s.Held != 2 || s.Sold != 0 || s.Available != total-2 {
			t.Fatalf("stock changed: %+v", s)
		}
	})
}
