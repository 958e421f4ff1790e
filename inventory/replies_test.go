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

	"github.com/dropline/dropline/inventory/outcome"
	"github.com/dropline/dropline/inventory/policy"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

// TestRepliesAreDecodedInOnePlace checks that no code of the engine reads a
// script's reply by position: package script decodes every reply.
func TestRepliesAreDecodedInOnePlace(t *testing.T) {
	positional := regexp.MustCompile(`\.(str|int|Str|Int|Bool)\(\d+\)`)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		if m := positional.Find(src); m != nil {
			t.Errorf("%s reads a script reply by position (%s): add a typed reply to package script", f, m)
		}
	}
}

// A hold decodes to the same Reservation whether it comes as a script's
// hold_reply or as its hash.
func TestHoldReplyAndHashDecodeAlike(t *testing.T) {
	const tok = "r03.abc"
	r := script.Reply{"OK", tok, "SKU-1", "alice", int64(2), "COMMITTING", int64(1_700_000_060_000),
		int64(1_700_000_000_000), int64(0), int64(0), int64(1), int64(2)}
	h := map[string]string{"sku": "SKU-1", "who": "alice", "qty": "2", "st": "COMMITTING",
		"exp": "1700000060000", "ctd": "1700000000000", "cst": "a1", "ext": "2"}
	fromReply := holdOf(script.HoldOf(r))
	require.True(t, fromReply.replayed)
	want := Reservation{Token: tok, SKU: "SKU-1", Principal: "alice", Quantity: 2, Status: StatusHeld,
		ExpiresAt: time.UnixMilli(1_700_000_060_000).UTC(), CreatedAt: time.UnixMilli(1_700_000_000_000).UTC(), Extensions: 2}
	require.Equal(t, want, fromReply.hold.reservation())
	require.Equal(t, want, holdFromHash(tok, h).reservation())
	want.Replayed = true
	require.Equal(t, want, fromReply.reservation())
	require.Equal(t, "a1", holdFromHash(tok, h).attempt)

	ended := append(script.Reply{}, r...)
	ended[5], ended[8], ended[9] = "COMMITTED", int64(1_700_000_030_000), int64(0)
	c := holdOf(script.HoldOf(ended)).reservation()
	require.Equal(t, StatusCommitted, c.Status)
	require.Equal(t, time.UnixMilli(1_700_000_030_000).UTC(), *c.CommittedAt)
	require.Nil(t, c.EndedAt)
}

// Each rejection of reserve.lua decodes to its error; any other code to none.
func TestRejectionsDecodeToTheirErrors(t *testing.T) {
	var oos *OutOfStockError
	require.True(t, errors.As(rejectionError(script.ReserveReplyOf(script.Reply{"OUT_OF_STOCK", "3", "0", int64(0)}).Rejection), &oos))
	require.Equal(t, 3, oos.Available)
	var quota *QuotaExceededError
	require.True(t, errors.As(rejectionError(script.ReserveReplyOf(script.Reply{"QUOTA_EXCEEDED", "2", "1", int64(1)}).Rejection), &quota))
	require.Equal(t, QuotaExceededError{Limit: 2, Held: 1}, *quota)
	var window *SaleNotActiveError
	require.True(t, errors.As(rejectionError(script.ReserveReplyOf(script.Reply{"SALE_NOT_ACTIVE", "1700000000000", "0", int64(0)}).Rejection), &window))
	require.Equal(t, time.UnixMilli(1_700_000_000_000).UTC(), *window.StartsAt)
	require.Nil(t, window.EndsAt)
	require.ErrorIs(t, rejectionError(script.ReserveReplyOf(script.Reply{"IDEMPOTENCY_KEY_REUSED", "", "", int64(1)}).Rejection), ErrIdempotencyKeyReused)
	var invalid *InvalidInputError
	require.True(t, errors.As(rejectionError(script.ReserveReplyOf(script.Reply{"INVALID_INPUT", "quantity", "too many", int64(0)}).Rejection), &invalid))
	require.Equal(t, InvalidInputError{Field: "quantity", Reason: "too many"}, *invalid)
	for _, c := range []replyCode{codeOK, codeNeedsHydration, replyOf(ErrNotFound)} {
		require.NoError(t, rejectionError(script.ReserveReplyOf(script.Reply{string(c)}).Rejection))
	}
	require.Equal(t, []string{"t1", "t2"}, script.DueHoldsReplyOf(script.Reply{int64(5), "t1", "t2"}).Tokens)
	require.Empty(t, script.DueHoldsReplyOf(script.Reply{int64(5)}).Tokens)
}

// TestEveryScriptCodeMapsToOne reads every reply code the scripts of lua/
// can answer (the first element of a reply table, the code given to
// hold_reply or wait_reply, a refusal of the sale policy) and checks that
// each is exactly one thing: a business outcome of package outcome, which
// the engine returns and the API reports, or a protocol code of replies.go,
// which never leaves the engine.
func TestEveryScriptCodeMapsToOne(t *testing.T) {
	t.Parallel()
	protocol := map[string]bool{}
	for _, c := range protocolCodes {
		_, isOutcome := outcome.Parse(string(c))
		require.False(t, isOutcome, "%s is both a protocol code and a business outcome", c)
		require.False(t, protocol[string(c)], "%s listed twice", c)
		protocol[string(c)] = true
	}
	// The engine's scripts; the admission queue's (lua.Queue) answer the
	// protocol codes of package queue.
	var files []string
	for _, name := range lua.Engine {
		files = append(files, "../lua/"+name+".lua")
	}
	files = append(files, "../lua/lib.lua")
	// {'CODE', ...}, {cond and 'CODE' or 'CODE', ...}, hold_reply('CODE', ...)
	code := regexp.MustCompile(`(?:\{\s*(?:\w+ and '([A-Z][A-Z_]+)' or\s*)?|_reply\(\s*)'([A-Z][A-Z_]+)'`)
	comment := regexp.MustCompile(`--.*`)
	seen := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range code.FindAllStringSubmatch(comment.ReplaceAllString(string(src), ""), -1) {
			for _, c := range m[1:] {
				if c == "" {
					continue
				}
				seen[c] = true
				_, isOutcome := outcome.Parse(c)
				require.True(t, isOutcome != protocol[c], "%s answers %s, which is neither a business outcome nor a protocol code of replies.go", filepath.Base(f), c)
			}
		}
	}
	for _, m := range policy.Modes {
		c := string(policy.Refuse(m).Code)
		_, isOutcome := outcome.Parse(c)
		require.True(t, isOutcome, "the policy refuses %s with %s, not a business outcome", m, c)
	}
	// reserve.lua answers a hold its run made with the hold's expiry alone, a
	// number, which script.ReserveRepliesOf reads as HELD.
	seen[string(codeHeld)] = true
	for _, c := range protocolCodes {
		require.True(t, seen[string(c)], "no script answers the protocol code %s", c)
	}
	require.True(t, seen[string(ErrOutOfStock.Code())] && seen[string(ErrForbidden.Code())], "the scan found the scripts' outcomes")
}
