package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testenv"
)

func TestLeaseTakeoverOnlyAfterExpiryAndFencing(t *testing.T) {
	testenv.Quiet(t)
	b := setup(t)
	b.product(t, "LEASE-1", 10)
	k := newKeys(b.engine.Keys())
	cfg := func(owner string) LeaseConfig {
		return LeaseConfig{Key: k.lease(3, "test"), FenceKey: k.fence(3, "test"), Owner: owner, TTL: time.Second}
	}
	old, successor := NewLease(b.rdb, cfg("old")), NewLease(b.rdb, cfg("new"))

	began := time.Now()
	ok, err := old.Acquire(b.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	oldFence, ok := old.Fence()
	require.True(t, ok)
	ok, err = old.Renew(b.ctx)
	require.NoError(t, err)
	require.True(t, ok, "the owner renews its own lease")

	// The old owner now stops renewing (paused). Its successor polls.
	var tookOver time.Duration
	refusedBefore := 0
	eventually(t, 5*time.Second, func() bool {
		ok, err := successor.Acquire(b.ctx)
		require.NoError(t, err)
		if !ok {
			refusedBefore++
			require.Less(t, time.Since(began), 2*time.Second, "takeover must come soon after the lease expires")
			return false
		}
		tookOver = time.Since(began)
		return true
	}, "the successor takes the lease over")
	require.GreaterOrEqual(t, tookOver, time.Second, "taken over before the lease expired")
	require.Positive(t, refusedBefore, "the live lease was refused at first")
	require.False(t, old.Held(), "the old owner no longer counts itself as holder after 2/3 of TTL")
	t.Logf("lease taken over %s after acquisition (TTL 1s), %d refusals before", tookOver, refusedBefore)

	newFence, ok := successor.Fence()
	require.True(t, ok)
	require.Greater(t, newFence.Token, oldFence.Token)

	// The stale owner can neither renew nor release the successor's lease.
	ok, err = old.Renew(b.ctx)
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, old.Release(b.ctx))
	owner, err := b.rdb.Get(b.ctx, k.lease(3, "test")).Result()
	require.NoError(t, err)
	require.Equal(t, "new", owner)

	// Postgres refuses the stale owner's write once the successor has written.
	ev := func(tok string) []db.Event {
		now := time.Now()
		return []db.Event{{ID: "reserve:" + tok, Kind: "reserve", Token: tok, SKU: "LEASE-1", Principal: "p",
			Quantity: 1, ExpiresAt: now.Add(time.Minute), CreatedAt: now, At: now}}
	}
	require.NoError(t, b.engine.Ledger().ApplyEvents(b.ctx, &newFence, ev("tok-new")))
	err = b.engine.Ledger().ApplyEvents(b.ctx, &oldFence, ev("tok-old"))
	require.True(t, errors.Is(err, db.ErrFenced), "stale fence accepted: %v", err)
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM stock_movements WHERE event_id = 'reserve:tok-old'`).Scan(&n))
	require.Zero(t, n, "the fenced batch wrote nothing")
}

func TestLeaseFenceGrowsAcrossRedisDataLoss(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := newKeys(b.engine.Keys())
	l := NewLease(b.rdb, LeaseConfig{Key: k.lease(0, "test"), FenceKey: k.fence(0, "test"), TTL: time.Second})
	ok, err := l.Acquire(b.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	first, _ := l.Fence()

	// Redis forgets both keys (as after FLUSHALL): the next token still grows.
	require.NoError(t, b.rdb.Del(b.ctx, k.lease(0, "test"), k.fence(0, "test")).Err())
	ok, err = l.Acquire(b.ctx)
	require.NoError(t, err)
	require.True(t, ok)
	second, _ := l.Fence()
	require.Greater(t, second.Token, first.Token)

	// A lease key without expiry cannot belong to a live owner of this code.
	require.NoError(t, b.rdb.Set(b.ctx, k.lease(1, "test"), "someone", 0).Err())
	other := NewLease(b.rdb, LeaseConfig{Key: k.lease(1, "test"), FenceKey: k.fence(1, "test"), TTL: time.Second})
	ok, err = other.Acquire(b.ctx)
	require.NoError(t, err)
	require.True(t, ok, "a lease with no expiry is stale")
}
