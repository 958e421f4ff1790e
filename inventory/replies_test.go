package inventory

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRepliesAreDecodedInOnePlace checks that no code outside replies.go
// reads a script's reply by position.
func TestRepliesAreDecodedInOnePlace(t *testing.T) {
	positional := regexp.MustCompile(`\.(str|int)\(\d+\)`)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if f == "replies.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		if m := positional.Find(src); m != nil {
			t.Errorf("%s reads a script reply by position (%s): add a decoder to replies.go", f, m)
		}
	}
}

// A hold decodes to the same Reservation whether it comes as a script's
// hold_reply or as its hash.
func TestHoldReplyAndHashDecodeAlike(t *testing.T) {
	const tok = "r03.abc"
	r := reply{"OK", tok, "SKU-1", "alice", int64(2), "COMMITTING", int64(1_700_000_060_000),
		int64(1_700_000_000_000), int64(0), int64(0), int64(1), int64(2)}
	h := map[string]string{"sku": "SKU-1", "who": "alice", "qty": "2", "st": "COMMITTING",
		"exp": "1700000060000", "ctd": "1700000000000", "cst": "a1", "ext": "2"}
	fromReply := r.hold()
	require.True(t, fromReply.replayed)
	want := Reservation{Token: tok, SKU: "SKU-1", Principal: "alice", Quantity: 2, Status: StatusHeld,
		ExpiresAt: time.UnixMilli(1_700_000_060_000).UTC(), CreatedAt: time.UnixMilli(1_700_000_000_000).UTC(), Extensions: 2}
	require.Equal(t, want, fromReply.hold.reservation())
	require.Equal(t, want, holdFromHash(tok, h).reservation())
	want.Replayed = true
	require.Equal(t, want, fromReply.reservation())
	require.Equal(t, "a1", holdFromHash(tok, h).attempt)

	ended := append(reply{}, r...)
	ended[5], ended[8], ended[9] = "COMMITTED", int64(1_700_000_030_000), int64(0)
	c := ended.hold().reservation()
	require.Equal(t, StatusCommitted, c.Status)
	require.Equal(t, time.UnixMilli(1_700_000_030_000).UTC(), *c.CommittedAt)
	require.Nil(t, c.EndedAt)
}

// Each rejection of reserve.lua decodes to its error; any other code to none.
func TestRejectionsDecodeToTheirErrors(t *testing.T) {
	var oos *OutOfStockError
	require.True(t, errors.As(reply{"OUT_OF_STOCK", "3", "0", int64(0)}.rejection(), &oos))
	require.Equal(t, 3, oos.Available)
	var quota *QuotaExceededError
	require.True(t, errors.As(reply{"QUOTA_EXCEEDED", "2", "1", int64(1)}.rejection(), &quota))
	require.Equal(t, QuotaExceededError{Limit: 2, Held: 1}, *quota)
	var window *SaleNotActiveError
	require.True(t, errors.As(reply{"SALE_NOT_ACTIVE", "1700000000000", "0", int64(0)}.rejection(), &window))
	require.Equal(t, time.UnixMilli(1_700_000_000_000).UTC(), *window.StartsAt)
	require.Nil(t, window.EndsAt)
	require.ErrorIs(t, reply{"IDEMPOTENCY_KEY_REUSED", "", "", int64(1)}.rejection(), ErrIdempotencyKeyReused)
	var invalid *InvalidInputError
	require.True(t, errors.As(reply{"INVALID_INPUT", "quantity", "too many", int64(0)}.rejection(), &invalid))
	require.Equal(t, InvalidInputError{Field: "quantity", Reason: "too many"}, *invalid)
	for _, c := range []replyCode{codeOK, codeNeedsHydration, codeNotFound} {
		require.NoError(t, reply{string(c)}.rejection())
	}
	require.Equal(t, []string{"t1", "t2"}, reply{int64(5), "t1", "t2"}.dueTokens())
	require.Empty(t, reply{int64(5)}.dueTokens())
}
