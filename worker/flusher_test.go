package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

var errKilled = errors.New("killed between commit and acknowledgement")

// A flusher dies after Postgres committed a batch and before it acknowledged
// it; another process's flusher claims the batch and applies it again. The
// ledger has every event exactly once.
func TestFlusherKilledMidBatchAppliesEveryEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.product(t, "KILL-1", 1000)
	p := inventory.PartitionOf("KILL-1")

	// Traffic first, with no flusher running: 300 holds, 100 cancelled, 50 sold.
	tokens := b.reserveMany(t, "KILL-1", 300, time.Hour)
	for i, tok := range tokens[:150] {
		who := inventory.Principal{ID: principalOf(tokens, tok)}
		if i < 100 {
			_, err := b.engine.Cancel(b.ctx, who, tok)
			require.NoError(t, err)
		} else {
			_, err := b.engine.Commit(b.ctx, who, tok)
			require.NoError(t, err)
		}
	}
	entries, err := b.rdb.XRange(b.ctx, b.engine.Keys().Outbox(p), "-", "+").Result()
	require.NoError(t, err)
	generated := map[string]bool{}
	for _, e := range entries {
		generated[e.Values["id"].(string)] = true
	}
	require.Len(t, generated, 450, "300 reserves, 100 cancels, 50 commits")

	opts := fastConfig("doomed").Options
	opts.MinRestartBackoff, opts.MaxRestartBackoff = time.Hour, time.Hour // a dead process does not come back
	doomed := NewFlusher(FlusherConfig{Options: opts, BatchSize: 100, ClaimIdle: time.Second},
		b.engine.Maintenance(), b.rdb, b.log.With().Str("flusher", "doomed").Logger(), prometheus.NewRegistry())
	var batches atomic.Int32
	killed := make(chan struct{})
	doomed.hooks.beforeAck = func(int, []db.Event) error {
		if batches.Add(1) == 2 {
			close(killed)
			return errKilled
		}
		return nil
	}
	dctx, crash := context.WithCancelCause(b.ctx)
	require.NoError(t, doomed.Start(dctx))
	<-killed
	// The process is gone: its loop stops, its leases are not released and
	// its second batch is in Postgres but pending in Redis.
	crash(errCrashed)
	stop(t, doomed)
	pending, err := b.rdb.XPending(b.ctx, b.engine.Keys().Outbox(p), "dropline").Result()
	require.NoError(t, err)
	require.Equal(t, int64(100), pending.Consumers["doomed"], "the killed batch is pending on the dead consumer")
	var applied int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM stock_movements WHERE kind <> 'create'`).Scan(&applied))
	require.GreaterOrEqual(t, applied, 200, "both batches reached Postgres before the kill")

	// Another process takes the partition once the dead one's lease expires,
	// claims the pending batch and finishes the stream.
	heir := NewFlusher(FlusherConfig{Options: fastConfig("heir").Options, BatchSize: 100,
		ClaimIdle: time.Second, ClaimInterval: 100 * time.Millisecond},
		b.engine.Maintenance(), b.rdb, b.log.With().Str("flusher", "heir").Logger(), prometheus.NewRegistry())
	heir.initSignals()
	require.NoError(t, heir.Start(b.ctx))
	t.Cleanup(func() { stop(t, heir) })
	b.waitDrained(t, 20*time.Second, "the heir drains the outbox", heir)

	total, distinct, byKind := b.movements(t)
	require.Equal(t, total, distinct)
	require.Equal(t, map[string]int{"create": 1, "reserve": 300, "cancel": 100, "commit": 50}, byKind)
	rows, err := b.pool.Query(b.ctx, `SELECT event_id FROM stock_movements WHERE kind <> 'create'`)
	require.NoError(t, err)
	inLedger := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		inLedger[id] = true
	}
	require.NoError(t, rows.Err())
	require.Equal(t, generated, inLedger, "every generated event, and nothing else")
	b.requireLedgerMatchesRedis(t, "KILL-1", tokens)
	stop(t, doomed) // idempotent; releases nothing it no longer holds
}

// A flusher stopped gracefully applies and acknowledges what it has read,
// and drains the rest before Stop returns.
func TestFlusherStopDrains(t *testing.T) {
	b := setup(t)
	b.product(t, "DRAIN-1", 2000)
	opts := fastConfig("drainer").Options
	opts.LeaseTTL = 10 * time.Second // the drain is tested, not the renewal: no lease may look lapsed on a slow machine
	f := NewFlusher(FlusherConfig{Options: opts, BatchSize: 50},
		b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	f.initSignals()
	require.NoError(t, f.Start(ctx))
	waitHeld(t, f.leases, inventory.Partitions, "the flusher owns every partition")
	tokens := b.reserveMany(t, "DRAIN-1", 1500, time.Hour)
	stop(t, f)
	require.True(t, b.drained(t), "Stop returned with events still pending or unread")
	_, _, byKind := b.movements(t)
	require.Equal(t, len(tokens), byKind["reserve"])
}

// The batch in flight at a stop is slow (Postgres under load) and outlasts
// the leases' local validity, two thirds of a TTL after their last renewal.
// The leases stay renewed until the final drain is done, and the drain
// flushes the whole backlog before Stop returns.
func TestFlusherStopDrainsPastTheLeaseWindow(t *testing.T) {
	b := setup(t)
	b.product(t, "DRAIN-2", 2000)
	tokens := b.reserveMany(t, "DRAIN-2", 1500, time.Hour)
	opts := fastConfig("slow").Options
	// A generous DrainTimeout: what is tested is the leases, not the bound.
	f := NewFlusher(FlusherConfig{Options: opts, BatchSize: 50, DrainTimeout: 30 * time.Second},
		b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	inBatch := make(chan struct{})
	var first atomic.Bool
	f.hooks.beforeApply = func(int, []db.Event) {
		if first.CompareAndSwap(false, true) {
			close(inBatch)
			<-ctx.Done()
			time.Sleep(opts.LeaseTTL) // a slow batch, not a wait for a condition
		}
	}
	require.NoError(t, f.Start(ctx))
	<-inBatch
	cancel()
	stop(t, f)
	require.True(t, b.drained(t), "Stop returned with events still pending or unread")
	_, _, byKind := b.movements(t)
	require.Equal(t, len(tokens), byKind["reserve"])
	b.requireLedgerMatchesRedis(t, "DRAIN-2", tokens)
}

var errTransient = errors.New("transient failure")

// The batch in flight at a stop fails (a timeout) and its partition backs
// off. The final drain tries it again when the backoff ends, well within
// DrainTimeout, instead of leaving the partition's events pending.
func TestFlusherStopRetriesABackedOffPartition(t *testing.T) {
	b := setup(t)
	b.product(t, "DRAIN-3", 2000)
	tokens := b.reserveMany(t, "DRAIN-3", 500, time.Hour)
	opts := fastConfig("retrier").Options
	opts.LeaseTTL = 10 * time.Second // as in TestFlusherStopDrains
	f := NewFlusher(FlusherConfig{Options: opts, BatchSize: 50},
		b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	inBatch := make(chan struct{})
	var first atomic.Bool
	f.hooks.beforeAck = func(int, []db.Event) error {
		if first.CompareAndSwap(false, true) {
			close(inBatch)
			<-ctx.Done()
			return errTransient
		}
		return nil
	}
	require.NoError(t, f.Start(ctx))
	<-inBatch
	cancel()
	stop(t, f)
	require.True(t, b.drained(t), "Stop returned with events still pending or unread")
	_, _, byKind := b.movements(t)
	require.Equal(t, len(tokens), byKind["reserve"])
	b.requireLedgerMatchesRedis(t, "DRAIN-3", tokens)
}

func principalOf(tokens []string, tok string) string {
	for i, t := range tokens {
		if t == tok {
			return "u" + itoa(i)
		}
	}
	return ""
}

// Redis delivers a batch to the flusher's consumer and the reply is lost:
// the Redis client sends the read again and the flusher gets the next
// entries, with no error, while the lost ones stay pending on its own
// consumer. The flusher finds them by itself within a claim interval, long
// before they would be idle enough to be claimed (ClaimIdle, a minute here).
func TestFlusherFindsEntriesWhoseReadLostItsReply(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.product(t, "LOST-READ", 1000)
	p := inventory.PartitionOf("LOST-READ")
	tokens := b.reserveMany(t, "LOST-READ", 300, time.Hour)
	opts := fastConfig("reader").Options
	f := NewFlusher(FlusherConfig{Options: opts, BatchSize: 50, ClaimIdle: time.Minute, ClaimInterval: 100 * time.Millisecond},
		b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
	var first atomic.Bool
	stolen := make(chan error, 1)
	f.hooks.beforeApply = func(int, []db.Event) {
		if !first.CompareAndSwap(false, true) {
			return
		}
		// The delivery whose reply never reached the flusher.
		res, err := b.rdb.XReadGroup(b.ctx, &redis.XReadGroupArgs{
			Group: "dropline", Consumer: opts.Owner, Streams: []string{b.engine.Keys().Outbox(p), ">"}, Count: 50, Block: -1,
		}).Result()
		if err == nil && (len(res) != 1 || len(res[0].Messages) != 50) {
			err = fmt.Errorf("delivered %v, want 50 entries", res)
		}
		stolen <- err
	}
	f.initSignals()
	require.NoError(t, f.Start(b.ctx))
	defer stop(t, f)
	require.NoError(t, <-stolen)
	waitTotal(t, "every reserve reached the ledger, the lost delivery's too", int64(len(tokens)), counter{&f.applied, &f.total})
	_, _, byKind := b.movements(t)
	require.Equal(t, len(tokens), byKind["reserve"], "every reserve is in the ledger once")
	pending, err := b.rdb.XPending(b.ctx, b.engine.Keys().Outbox(p), "dropline").Result()
	require.NoError(t, err)
	require.Zero(t, pending.Count, "nothing is left pending: what was applied was acknowledged")
	b.requireLedgerMatchesRedis(t, "LOST-READ", tokens)
}

// The flusher's loop fails on its own while its lease keeper is well (here:
// measuring a partition's outbox fails, its dead-letter key being of the
// wrong type; in a Redis failover, any call the new primary refuses once).
// The loop is restarted and goes on flushing. It used to wait for the keeper
// to end, which renewed the leases for ever: no partition was flushed again
// by this process, nor taken over by another.
func TestFlusherLoopFailingAloneIsRestarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sku = "LOOPFAIL-1"
	b.product(t, sku, 10)
	p := inventory.PartitionOf(sku)
	g, reg := b.startGroup(t, fastConfig("loopfail"))
	waitHeld(t, g.Flusher.leases, inventory.Partitions, "the flusher holds every partition")
	first := b.reserveMany(t, sku, 1, time.Hour)
	waitTotal(t, "the first reserve is applied", 1, applied(g))

	dead := b.engine.Keys().DeadLetters(p)
	require.NoError(t, b.rdb.Set(b.ctx, dead, "not a stream", 0).Err())
	g.Flusher.restarted.Wait(t, 10*time.Second)
	require.GreaterOrEqual(t, metric(t, reg, "dropline_worker_restarts_total"), 1.0, "the flusher's loop failed and is restarted")
	require.NoError(t, b.rdb.Del(b.ctx, dead).Err())
	second := b.reserveMany(t, sku, 1, time.Hour)
	waitTotal(t, "the second reserve is applied", 2, applied(g))
	for _, tok := range append(first, second...) {
		var st string
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT status FROM reservations WHERE token = $1`, tok).Scan(&st))
		require.Equal(t, db.StatusHeld, st)
	}
	require.Len(t, g.Flusher.leases.Owned(), inventory.Partitions, "the leases stay with the restarted loop")
}

// An idle flusher reads every IdleInterval, not every PollInterval: each
// pass is a round trip to Redis that reads every owned partition. A pass
// that handled events waits PollInterval, so a flow is applied in batches
// of about PollInterval's events; once the flow stops and everything is
// acknowledged, the flusher is idle again.
func TestFlusherReadsLessOftenWhenIdle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const sku = "IDLE-1"
	b.product(t, sku, 10_000)
	const poll, idle = 10 * time.Millisecond, 300 * time.Millisecond
	// Every batch committed durably: none waits for its acknowledgement
	// after its pass, which would make the next pass wait PollInterval.
	f := NewFlusher(FlusherConfig{Options: fastConfig("idler").Options, PollInterval: poll, IdleInterval: idle, SynchronousCommit: true},
		b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
	type wait struct {
		handled int
		d       time.Duration
	}
	waits := make(chan wait, 10_000)
	f.hooks.beforeWait = func(handled int, d time.Duration) { waits <- wait{handled, d} }
	f.initSignals()
	require.NoError(t, f.Start(b.ctx))
	defer stop(t, f)
	waitHeld(t, f.leases, inventory.Partitions, "the flusher owns every partition")

	// check takes the waits chosen so far: a pass that handled events
	// waits PollInterval, one that handled none IdleInterval. It returns
	// how many passes handled events and how many did not.
	check := func() (busy, quiet int) {
		t.Helper()
		for {
			select {
			case w := <-waits:
				if w.handled > 0 {
					busy++
					require.Equal(t, poll, w.d, "a pass that handled %d events waits PollInterval", w.handled)
				} else {
					quiet++
					require.Equal(t, idle, w.d, "a pass that handled nothing waits IdleInterval")
				}
			default:
				return busy, quiet
			}
		}
	}

	time.Sleep(time.Second)
	busy, quiet := check()
	require.Zero(t, busy, "nothing was written yet")
	require.LessOrEqual(t, quiet, 5, "an idle flusher waits %s between passes: at most about 4 passes a second", idle)
	require.GreaterOrEqual(t, quiet, 1, "the idle flusher kept passing")

	// A flow: 5 holds every 5 ms for a second, so that nearly every pass
	// finds some (a pass that finds none waits IdleInterval).
	var tokens []string
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		tokens = append(tokens, b.reserveMany(t, sku, 5, time.Hour)...)
		time.Sleep(5 * time.Millisecond)
	}
	waitTotal(t, "the flow reached the ledger", int64(len(tokens)), counter{&f.applied, &f.total})
	busy, _ = check()
	require.GreaterOrEqual(t, busy, 5, "the flow was read pass after pass, %s apart", poll)

	// Idle again: the passes after the flow handle nothing.
	time.Sleep(time.Second)
	busy, quiet = check()
	require.LessOrEqual(t, busy, 1, "at most the flow's last batch was read after it stopped")
	require.LessOrEqual(t, quiet, 5, "idle again: at most about 4 passes a second")
	_, _, byKind := b.movements(t)
	require.Equal(t, len(tokens), byKind["reserve"], "every hold of the flow is in the ledger once")
}
