package inventory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/lua"
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
	calls := []*reserveCall{
		{keys: e.keys.reserveRequestKeys(p, "TWICE", token, "", ""), args: [11]any{"TWICE", "alice", 2, int64(60_000), token, "", "", "", "", "", ""}},
		{keys: e.keys.reserveRequestKeys(p, "TWICE", other, "", ""), args: [11]any{"TWICE", "bob", 1, int64(60_000), other, "", "", "", "", "", ""}},
	}
	keys, args := e.reserveScriptArgs(p, calls)
	first, err := e.run(ctx, lua.Reserve, keys, args...)
	require.NoError(t, err)
	second, err := e.run(ctx, lua.Reserve, keys, args...)
	require.NoError(t, err)
	require.Len(t, second, 2)
	for i, c := range calls {
		f, s := reply(first[i].([]any)), reply(second[i].([]any))
		require.Equal(t, codeHeld, f.code())
		require.Equal(t, codeOK, s.code())
		made, replayed := f.newHold(c.token(), "TWICE", c.args[1].(string), c.args[2].(int)).reservation(), s.hold().reservation()
		require.False(t, made.Replayed)
		require.True(t, replayed.Replayed)
		replayed.Replayed = false
		require.Equal(t, made, replayed, "the replay answers the hold the first run made")
	}
	s, err := e.Stock(ctx, "TWICE")
	require.NoError(t, err)
	require.Equal(t, 3, s.Held, "the retried batch took nothing more")
	n, err := r.Client.XLen(ctx, e.keys.Outbox(p)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "one reserve event per hold")
	_, err = e.release(ctx, p, other, Principal{ID: "bob"}, "CANCELLED")
	require.NoError(t, err)

	alice := Principal{ID: "alice"}
	base := e.keys.Base(p)
	for i := 0; i < 2; i++ {
		b, err := e.run(ctx, lua.BeginCommit, e.keys.tokenHoldKeys(p, token), base, token, "alice", 86400, "attempt-1")
		require.NoError(t, err)
		require.Equal(t, codeOK, b.code())
	}
	h, err := e.Reservation(ctx, alice, token)
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		_, err := e.finishCommit(ctx, token, h, "COMMITTED", time.Now(), "")
		require.NoError(t, err)
	}
	s, err = e.Stock(ctx, "TWICE")
	require.NoError(t, err)
	require.Equal(t, 2, s.Sold, "finishing twice sells once")
	require.Equal(t, 0, s.Held)
	require.Equal(t, 3, s.Available)

	for i := 0; i < 2; i++ {
		res, err := e.release(ctx, p, token, alice, "CANCELLED")
		require.NoError(t, err)
		require.Equal(t, replyOf(ErrAlreadyCommitted), res.code())
	}
	n, err = r.Client.XLen(ctx, e.keys.Outbox(p)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "two reserves, a cancel and a commit event")

	// An extension sent twice (same call id) extends once.
	held, err := e.Reserve(ctx, alice, ReserveRequest{SKU: "TWICE", Quantity: 1})
	require.NoError(t, err)
	hp, err := parseToken(held.Token)
	require.NoError(t, err)
	extArgs := []any{e.keys.Base(hp), held.Token, "alice", int64(120_000), 2, int64(3_600_000), "call-1", 86400, "", ""}
	x1, err := e.run(ctx, lua.ExtendHold, e.keys.extendHoldKeys(hp, held.Token), extArgs...)
	require.NoError(t, err)
	x2, err := e.run(ctx, lua.ExtendHold, e.keys.extendHoldKeys(hp, held.Token), extArgs...)
	require.NoError(t, err)
	require.Equal(t, codeOK, x2.code())
	require.True(t, x2.hold().replayed)
	require.Equal(t, x1.hold().reservation().ExpiresAt, x2.hold().reservation().ExpiresAt)
	require.Equal(t, 1, x2.hold().reservation().Extensions, "the retried extension counted once")
	n, err = r.Client.XLen(ctx, e.keys.Outbox(hp)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 6, n, "three reserves, a cancel, a commit and one extension")

	// A drop written twice under one version is written once.
	admin := Principal{ID: "admin", Admin: true}
	_, err = e.CreateDrop(ctx, admin, DropInput{ID: "TWICE-DROP", Name: "t", MaxPerUser: 1})
	require.NoError(t, err)
	dropArgs := []any{int64(7), 2, 0, 0, "A B"}
	d1, err := e.run(ctx, lua.ApplyDrop, []string{e.keys.Drop("TWICE-DROP")}, dropArgs...)
	require.NoError(t, err)
	require.Equal(t, codeOK, d1.code())
	d2, err := e.run(ctx, lua.ApplyDrop, []string{e.keys.Drop("TWICE-DROP")}, dropArgs...)
	require.NoError(t, err)
	require.Equal(t, codeStale, d2.code())
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
	base := e.keys.Base(p)
	args := []any{base, h.Token, "alice", 86400, "attempt-1"}
	first, err := e.run(ctx, lua.BeginCommit, e.keys.tokenHoldKeys(p, h.Token), args...)
	require.NoError(t, err)
	retried, err := e.run(ctx, lua.BeginCommit, e.keys.tokenHoldKeys(p, h.Token), args...)
	require.NoError(t, err)
	require.Equal(t, first.attempt().id, retried.attempt().id, "the same attempt id")
	require.True(t, retried.attempt().moved, "the retry is the attempt that moved the hold")
	_, err = e.finishCommit(ctx, h.Token, h, outcomeRestore, time.Time{}, first.attempt().id)
	require.NoError(t, err)
	st, err := r.Client.HGet(ctx, e.keys.Hold(p, h.Token), "st").Result()
	require.NoError(t, err)
	require.Equal(t, "HELD", st, "restored at once")
}
