package inventory_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// TestOutboxReadDeadLetterAckTrim walks one partition's outbox through what
// the write-behind does with it: entries are read decoded (bad ones carry
// why), set aside with their fields, acknowledged, measured and trimmed, and
// what one consumer left pending is claimed by another.
func TestOutboxReadDeadLetterAckTrim(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		b.product(t, "OUTBOX-1", 10, 0)
		p := inventory.PartitionOf("OUTBOX-1")
		keys := b.engine.Keys()
		for i := range 3 {
			_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: "OUTBOX-1", Quantity: 1})
			require.NoError(t, err)
		}
		stream := keys.Outbox(p)
		require.NoError(t, b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{
			"id": "refund:x", "type": "refund", "tok": "x", "sku": "OUTBOX-1", "qty": "1"}}).Err())
		require.NoError(t, b.rdb.XAdd(b.ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"junk": "1"}}).Err())

		out := b.engine.Maintenance().Outbox("dropline", "a")
		entries, err := out.Read(b.ctx, p, 100)
		require.NoError(t, err)
		require.Len(t, entries, 5)
		var good []string
		var dead []inventory.DeadLetter
		for _, e := range entries {
			if e.Err == nil {
				require.Equal(t, "reserve", e.Event.Kind)
				require.Equal(t, "OUTBOX-1", e.Event.SKU)
				good = append(good, e.ID)
				continue
			}
			reason := "malformed"
			if errors.Is(e.Err, db.ErrUnknownKind) {
				reason = "unknown_kind"
			}
			dead = append(dead, inventory.DeadLetter{Entry: e, Reason: reason, Err: e.Err})
		}
		require.Len(t, good, 3)
		require.Len(t, dead, 2)

		st, err := out.State(b.ctx, p)
		require.NoError(t, err)
		require.EqualValues(t, 5, st.Backlog, "all five are pending")
		require.False(t, st.Oldest.IsZero())
		now, err := out.Clock(b.ctx)
		require.NoError(t, err)
		require.Less(t, st.Lag(now), time.Minute)

		require.NoError(t, out.DeadLetter(b.ctx, p, dead))
		letters, err := b.rdb.XRange(b.ctx, keys.DeadLetters(p), "-", "+").Result()
		require.NoError(t, err)
		require.Len(t, letters, 2)
		require.Equal(t, "refund", letters[0].Values["type"], "the fields stay as they were")
		require.Equal(t, "unknown_kind", letters[0].Values["dead_reason"])
		require.Equal(t, dead[0].Entry.ID, letters[0].Values["dead_entry"])
		require.Equal(t, "malformed", letters[1].Values["dead_reason"])

		// Another consumer claims what "a" left pending.
		claimed, next, err := b.engine.Maintenance().Outbox("dropline", "b").Claim(b.ctx, p, 0, "0-0", 100)
		require.NoError(t, err)
		require.Len(t, claimed, 3, "the dead letters were acknowledged, the rest is still pending")
		require.Contains(t, []string{"0-0", ""}, next)
		require.NoError(t, out.Ack(b.ctx, p, good...))

		st, err = out.State(b.ctx, p)
		require.NoError(t, err)
		require.EqualValues(t, 0, st.Backlog)
		require.True(t, st.Oldest.IsZero())
		require.EqualValues(t, 2, st.DeadLetters)
		require.NotEmpty(t, st.TrimBelow)
		require.NoError(t, out.Trim(b.ctx, p, st.TrimBelow))
		n, err := b.rdb.XLen(b.ctx, stream).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, n, int64(1), "everything below the last delivered entry is trimmed")
		pending, err := out.ReadPending(b.ctx, p, 100)
		require.NoError(t, err)
		require.Empty(t, pending)
	})
}

// TestOutboxEntryVersions: every entry the scripts write is of
// EventVersion, which version 1 says by carrying no "v" at all (a bump of
// EventVersion that the scripts do not write fails here); a reader takes an
// entry without a version as version 1 and ignores fields it does not know,
// and refuses an entry of a newer version with ErrNewerEvent, or one whose
// version is not a number.
func TestOutboxEntryVersions(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	b.product(t, "VERSIONED-1", 1, 0)
	// A hold, a waiter, and the hold cancelled: reserve and cancel entries
	// (emit_event), the waiter's join and offer (emit_wait).
	h, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "VERSIONED-1", Quantity: 1})
	require.NoError(t, err)
	_, err = b.engine.Waitlists().JoinWaitlist(b.ctx, waiter(1),
		inventory.JoinWaitlistRequest{SKU: "VERSIONED-1", Quantity: 1, HoldFor: time.Minute})
	require.NoError(t, err)
	_, err = b.engine.Cancel(b.ctx, buyer(1), h.Token)
	require.NoError(t, err)
	msgs, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(inventory.PartitionOf("VERSIONED-1")), "-", "+").Result()
	require.NoError(t, err)
	kinds := map[string]bool{}
	for _, m := range msgs {
		kinds[m.Values["type"].(string)] = true
	}
	for _, kind := range []string{"reserve", "cancel", "wjoin", "woffer"} {
		require.True(t, kinds[kind], "a %s entry among %v", kind, kinds)
	}
	for _, m := range msgs {
		v, ok := m.Values["v"]
		if inventory.EventVersion == 1 {
			require.False(t, ok, "entry %s %v: version 1 carries no v", m.ID, m.Values)
			continue
		}
		require.Equal(t, strconv.Itoa(inventory.EventVersion), v, "entry %s %v", m.ID, m.Values)
	}

	base := func(extra map[string]any) redis.XMessage {
		v := map[string]any{"id": "reserve:r01.x", "type": "reserve", "tok": "r01.x", "sku": "S", "who": "u", "qty": "2",
			"exp": "2000", "ctd": "1000", "at": "1000", "idem": "", "fp": "", "gen": "g", "ext": "0"}
		for k, x := range extra {
			v[k] = x
		}
		return redis.XMessage{ID: "1-1", Values: v}
	}
	for _, extra := range []map[string]any{nil, {"v": "1"}, {"v": "1", "later": "a field of a later release"}} {
		ev, err := inventory.ParseEvent(base(extra))
		require.NoError(t, err, "%v", extra)
		require.Equal(t, "reserve", ev.Kind)
		require.Equal(t, 2, ev.Quantity)
	}
	_, err = inventory.ParseEvent(base(map[string]any{"v": strconv.Itoa(inventory.EventVersion + 1)}))
	require.ErrorIs(t, err, inventory.ErrNewerEvent)
	require.ErrorContains(t, err, "this release reads up to")
	for _, bad := range []string{"", "x", "0", "-1"} {
		_, err = inventory.ParseEvent(base(map[string]any{"v": bad}))
		require.Error(t, err, "%q", bad)
		require.NotErrorIs(t, err, inventory.ErrNewerEvent)
	}
}

// TestOutboxEntryLeavesOutEmptyFields: a hold made without an idempotency
// key writes its event without idem, fp and ext (lib.lua's emit_event), and
// its hash without idem and fp; the reader takes the missing fields as
// empty and 0, so the ledger gets the same event as from the full entry.
func TestOutboxEntryLeavesOutEmptyFields(t *testing.T) {
	t.Parallel()
	b := setup(t, "single", inventory.Config{})
	b.product(t, "SHORT-1", 10, 0)
	res, err := b.engine.Reserve(b.ctx, buyer(1), inventory.ReserveRequest{SKU: "SHORT-1", Quantity: 2})
	require.NoError(t, err)
	msgs, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(inventory.PartitionOf("SHORT-1")), "-", "+").Result()
	require.NoError(t, err)
	var found bool
	for _, m := range msgs {
		if m.Values["tok"] != res.Token {
			continue
		}
		found = true
		for _, f := range []string{"idem", "fp", "ext"} {
			require.NotContains(t, m.Values, f, "entry %s %v", m.ID, m.Values)
		}
		ev, err := inventory.ParseEvent(m)
		require.NoError(t, err)
		require.NoError(t, ev.Validate())
		require.Equal(t, "reserve:"+res.Token, ev.ID)
		require.Equal(t, 2, ev.Quantity)
		require.Empty(t, ev.IdempotencyHash)
		require.Empty(t, ev.RequestHash)
		require.Zero(t, ev.Extensions)
	}
	require.True(t, found, "no entry for hold %s in %v", res.Token, msgs)
	h, err := b.rdb.HGetAll(b.ctx, b.engine.Keys().Hold(inventory.PartitionOf("SHORT-1"), res.Token)).Result()
	require.NoError(t, err)
	require.Equal(t, "HELD", h["st"])
	require.Equal(t, "2", h["qty"])
	require.NotContains(t, h, "idem")
	require.NotContains(t, h, "fp")
}

// ReadMany reads several partitions' new entries at once: each partition's
// own, a partition whose group does not exist yet reads as empty (the group
// is created), and what was read is not read again.
func TestOutboxReadMany(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, backend string) {
		b := setup(t, backend, inventory.Config{})
		skus := map[int]string{}
		for i := 0; len(skus) < 2; i++ {
			sku := "MANY-" + strconv.Itoa(i)
			if _, ok := skus[inventory.PartitionOf(sku)]; !ok {
				skus[inventory.PartitionOf(sku)] = sku
			}
		}
		var ps []int
		for p, sku := range skus {
			b.product(t, sku, 10, 0)
			for i := range 2 + len(ps) {
				_, err := b.engine.Reserve(b.ctx, buyer(i), inventory.ReserveRequest{SKU: sku, Quantity: 1})
				require.NoError(t, err)
			}
			ps = append(ps, p)
		}
		empty := 0
		for ; empty == ps[0] || empty == ps[1]; empty++ {
		}
		require.NoError(t, b.rdb.Del(b.ctx, b.engine.Keys().Outbox(empty)).Err())

		out := b.engine.Maintenance().Outbox("dropline", "a")
		got, errs := out.ReadMany(b.ctx, []int{ps[0], empty, ps[1]}, 100)
		require.Empty(t, errs)
		require.Empty(t, got[empty])
		for i, p := range ps {
			require.Len(t, got[p], 2+i, "partition %d", p)
			for _, e := range got[p] {
				require.NoError(t, e.Err)
				require.Equal(t, skus[p], e.Event.SKU)
			}
		}
		again, errs := out.ReadMany(b.ctx, []int{ps[0], empty, ps[1]}, 100)
		require.Empty(t, errs)
		require.Empty(t, again)
	})
}
