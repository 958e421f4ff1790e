package inventory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory/script"
)

// The Redis client retries a command whose reply was lost, so every script
// must give the same answer, and change nothing more, when run twice with the
// same arguments.
func TestScriptsAreSafeToRunTwice(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "TWICE", Name: "t", Price: Money{1, "EUR"}, Stock: 5})
	ctx := context.Background()

	// A batch of two reserves, run twice: each replays its own hold.
	p := PartitionOf("TWICE")
	token, other := newToken(p), newToken(p)
	noBudget := [3]any{"", "", ""}
	calls := []*reserveCall{
		{req: script.ReserveRequest{SKU: "TWICE", Principal: "alice", Quantity: 2, HoldMs: 60_000, Token: token, Budget: noBudget}},
		{req: script.ReserveRequest{SKU: "TWICE", Principal: "bob", Quantity: 1, HoldMs: 60_000, Token: other, Budget: noBudget}},
	}
	call := e.reserveScript(p, calls)
	raw, err := e.run(ctx, call)
	require.NoError(t, err)
	first, err := script.ReserveRepliesOf(raw, len(calls))
	require.NoError(t, err)
	raw, err = e.run(ctx, call)
	require.NoError(t, err)
	second, err := script.ReserveRepliesOf(raw, len(calls))
	require.NoError(t, err)
	for i, c := range calls {
		f, s := first[i], second[i]
		require.Equal(t, codeHeld, replyCode(f.Code))
		require.Equal(t, codeOK, replyCode(s.Code))
		made, replayed := newHold(f, c.token(), "TWICE", c.req.Principal, c.req.Quantity).reservation(), holdOf(s.Hold).reservation()
		require.False(t, made.Replayed)
		require.True(t, replayed.Replayed)
		replayed.Replayed = false
		require.Equal(t, made, replayed, "the replay answers the hold the first run made")
	}
	s, err := e.Catalog().Stock(ctx, "TWICE")
	require.NoError(t, err)
	require.Equal(t, 3, s.Held, "the retried batch took nothing more")
	n, err := r.Client.XLen(ctx, e.keys.Outbox(p)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "one reserve event per hold")
	_, err = e.release(ctx, p, other, Principal{ID: "bob"}, "CANCELLED")
	require.NoError(t, err)

	alice := Principal{ID: "alice"}
	for i := 0; i < 2; i++ {
		b, err := script.RunBeginCommit(ctx, e.run, e.keys, script.BeginCommit{Partition: p, Token: token, Principal: "alice",
			Retention: 86400, Attempt: "attempt-1"})
		require.NoError(t, err)
		require.Equal(t, codeOK, replyCode(b.Code))
	}
	h, err := e.Reservation(ctx, alice, token)
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err := e.finishCommit(ctx, token, h, "COMMITTED", time.Now(), "")
		require.NoError(t, err)
	}
	s, err = e.Catalog().Stock(ctx, "TWICE")
	require.NoError(t, err)
	require.Equal(t, 2, s.Sold, "finishing twice sells once")
	require.Equal(t, 0, s.Held)
	require.Equal(t, 3, s.Available)

	for i := 0; i < 2; i++ {
		res, err := e.release(ctx, p, token, alice, "CANCELLED")
		require.NoError(t, err)
		require.Equal(t, replyOf(ErrAlreadyCommitted), replyCode(res.Code))
	}
	n, err = r.Client.XLen(ctx, e.keys.Outbox(p)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "two reserves, a cancel and a commit event")

	// An extension sent twice (same call id) extends once.
	held, err := e.Reserve(ctx, alice, ReserveRequest{SKU: "TWICE", Quantity: 1})
	require.NoError(t, err)
	hp, err := parseToken(held.Token)
	require.NoError(t, err)
	extArgs := script.ExtendHold{Partition: hp, Token: held.Token, Principal: "alice", HoldMs: 120_000, MaxExtensions: 2,
		MaxHoldMs: 3_600_000, CallID: "call-1", Retention: 86400}
	x1, err := script.RunExtendHold(ctx, e.run, e.keys, extArgs)
	require.NoError(t, err)
	x2, err := script.RunExtendHold(ctx, e.run, e.keys, extArgs)
	require.NoError(t, err)
	require.Equal(t, codeOK, replyCode(x2.Code))
	require.True(t, x2.Replayed)
	require.Equal(t, holdOf(x1).reservation().ExpiresAt, holdOf(x2).reservation().ExpiresAt)
	require.Equal(t, 1, x2.Extensions, "the retried extension counted once")
	n, err = r.Client.XLen(ctx, e.keys.Outbox(hp)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 6, n, "three reserves, a cancel, a commit and one extension")

	// A drop written twice under one version is written once.
	admin := Principal{ID: "admin", Admin: true}
	_, err = e.Drops().CreateDrop(ctx, admin, DropInput{ID: "TWICE-DROP", Name: "t", MaxPerUser: 1})
	require.NoError(t, err)
	dropArgs := script.ApplyDrop{Drop: "TWICE-DROP", Version: 7, MaxPerUser: 2, SKUs: []string{"A", "B"}}
	d1, err := script.RunApplyDrop(ctx, e.run, e.keys, dropArgs)
	require.NoError(t, err)
	require.Equal(t, codeOK, replyCode(d1.Code))
	d2, err := script.RunApplyDrop(ctx, e.run, e.keys, dropArgs)
	require.NoError(t, err)
	require.Equal(t, codeStale, replyCode(d2.Code))
	d, err := r.Client.HGetAll(ctx, e.keys.Drop("TWICE-DROP")).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"ver": "7", "max": "2", "start": "0", "end": "0", "skus": "A B"}, d)
}

// A begin_commit whose reply was lost and which the Redis client sent again
// is the same attempt, not a second one that joined: a later nothing-sent
// Postgres failure must still put the hold back to HELD at once.
func TestRetriedBeginCommitIsTheSameAttempt(t *testing.T) {
	t.Parallel()
	e, r := engineWithProduct(t, ProductInput{SKU: "RETRY", Name: "t", Price: Money{1, "EUR"}, Stock: 1})
	ctx := context.Background()
	alice := Principal{ID: "alice"}
	h, err := e.Reserve(ctx, alice, ReserveRequest{SKU: "RETRY", Quantity: 1})
	require.NoError(t, err)
	p := PartitionOf("RETRY")
	args := script.BeginCommit{Partition: p, Token: h.Token, Principal: "alice", Retention: 86400, Attempt: "attempt-1"}
	first, err := script.RunBeginCommit(ctx, e.run, e.keys, args)
	require.NoError(t, err)
	retried, err := script.RunBeginCommit(ctx, e.run, e.keys, args)
	require.NoError(t, err)
	require.Equal(t, first.AttemptID, retried.AttemptID, "the same attempt id")
	require.True(t, retried.Moved, "the retry is the attempt that moved the hold")
	_, err = e.finishCommit(ctx, h.Token, h, outcomeRestore, time.Time{}, first.AttemptID)
	require.NoError(t, err)
	st, err := r.Client.HGet(ctx, e.keys.Hold(p, h.Token), "st").Result()
	require.NoError(t, err)
	require.Equal(t, "HELD", st, "restored at once")
}
