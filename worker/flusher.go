package worker

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/inventory"
)

// Flusher is the write-behind worker: it carries every event the Lua scripts
// append to the partitions' outbox streams into the Postgres ledger.
//
// Delivery is at least once and the apply is idempotent (db.ApplyEvents keys
// movements by event id and only moves reservations forward), so every
// change lands exactly once:
//
//   - events are read with a consumer group (XREADGROUP), applied in one
//     transaction per batch, and acknowledged (XACK) only after the commit
//     is durable; a crash in between leaves them pending, and they are
//     applied again. A batch of fresh holds is committed without waiting
//     for the WAL flush and acknowledged by a later batch or pass, once
//     PostgreSQL shows its commit flushed (flusher_unflushed.go), so that
//     a PostgreSQL crash losing the commit leaves its events pending too.
//     The transaction is one round trip (db.Ledger.ApplyEvents), and so is
//     the acknowledgement when no SKU of the batch was rebuilt since its
//     events were written (inventory.Outbox.AckApplied); when one was,
//     Redis is told what the ledger says of its holds first;
//   - on every (re)start the flusher first re-reads its own pending events;
//     events pending on another consumer for longer than ClaimIdle (a dead
//     process) are claimed with XAUTOCLAIM;
//   - a stream is trimmed only below its lowest pending event (or below the
//     last delivered one when none is pending), so nothing unapplied is
//     ever trimmed;
//   - a Redis flush removes the group; NOGROUP recreates it from the start
//     of whatever the stream holds.
//
// An entry no batch could apply never stops the flow. Entries that do not
// decode, or whose kind or version (inventory.EventVersion) this version
// does not know (a newer version wrote it during a rolling upgrade), are checked before the batch and moved to
// the partition's dead-letter stream (<prefix>{pNN}:outbox:dead, the entry's
// fields as they were plus dead_entry, dead_reason and dead_error) in the
// same MULTI that acknowledges them. A batch Postgres refuses on its values
// (db.ErrRefused) is split in halves until the refused events are alone;
// the rest is applied, the refused ones stay pending, are retried every
// ClaimIdle and after RefuseLimit refusals are dead-lettered too. Every dead
// letter is logged and counted (dropline_writebehind_dead_lettered_total).
// A partition whose flush fails otherwise (Postgres or Redis unreachable, a
// timeout) is logged and retried after its own doubling backoff, while the
// other partitions go on in the same pass.
//
// A process flushes only partitions whose "flusher" lease it holds, and each
// batch carries the lease's fencing token, so a paused former owner's late
// batch is refused by Postgres (db.ErrFenced) instead of racing its
// successor. While Postgres is down, every partition's batches fail and back
// off, and events wait in Redis; they drain when it returns.
type Flusher struct {
	*service
	cfg    FlusherConfig
	engine *inventory.Maintenance
	outbox *inventory.Outbox
	leases *leaseSet
	m      flusherMetrics
	hooks  flusherHooks
	// applied signals, to a test, the events this flusher has applied and
	// acknowledged so far (a running total), once they are counted.
	applied testsignal.Signal[int64]
	total   atomic.Int64
	// caughtUp signals, to a test, that a pass of the loop found nothing
	// to read or claim after one that handled entries (and after its first
	// pass): a moment the outbox may be drained, which the test then checks.
	caughtUp testsignal.Signal[struct{}]
	// measured signals, to a test, that the lag, backlog and dead-letter
	// gauges were just set.
	measured testsignal.Signal[struct{}]
	// refusals counts, per outbox entry, how often Postgres refused it
	// alone; loop goroutine only.
	refusals map[string]int
	// unflushed are, per partition, the applied batches whose commit may
	// not be durable yet, in order, and unflushedIDs their entries
	// (flusher_unflushed.go); loop goroutine only.
	unflushed    [inventory.Partitions][]unflushedBatch
	unflushedIDs map[string]struct{}
	// tracer is nil when tracing is off (Options.Tracer).
	tracer trace.Tracer
}

// flusherHooks let tests interrupt a batch; nil hooks do nothing.
type flusherHooks struct {
	// beforeApply runs after a batch is read and before it is written.
	beforeApply func(partition int, events []db.Event)
	// beforeAck runs after a batch is committed to Postgres and before it is
	// acknowledged; an error abandons the batch unacknowledged, as a crash would.
	beforeAck func(partition int, events []db.Event) error
	// beforeWait runs when the loop is about to wait between two passes,
	// with what the pass before handled (Flusher.pass) and how long the
	// loop will wait.
	beforeWait func(handled int, wait time.Duration)
}

// NewFlusher builds a flusher; Start runs it. rdb carries the leases; the
// outbox is read through the engine (inventory.Outbox).
func NewFlusher(cfg FlusherConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Flusher {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	f := &Flusher{
		cfg: cfg, engine: engine, outbox: engine.Outbox(cfg.Group, cfg.Owner),
		leases:   newLeaseSet("flusher", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		refusals: map[string]int{}, unflushedIDs: map[string]struct{}{},
		m:      newFlusherMetrics(reg),
		tracer: tracing.Tracer(cfg.Tracer, "github.com/dropline/dropline/worker"),
	}
	f.service = newService("flusher", cfg.Options, log, reg, f.leases, f.run)
	return f
}

// run runs the lease keeper and the loop. The loop stops on a stop or a
// keeper failure. On a stop the keeper goes on renewing the leases held then
// (taking no new ones) until the loop has finished the batch in flight and
// the final drain, which work under those leases: without it they lapse
// (Lease.Held is false two thirds of a TTL after the last renewal) while the
// drain still has events to flush, and the drain ends with them unread. A
// loop that fails on its own (a Redis call refused while the keeper's
// succeed, as around a failover) stops the keeper too, so that run returns
// and is restarted: a keeper left running would renew the leases for ever
// with no loop flushing their partitions, and no other process could take
// them over.
func (f *Flusher) run(ctx context.Context) error {
	lctx, stopLoop := context.WithCancel(ctx)
	defer stopLoop()
	kctx, stopKeeper := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeeper()
	keeperErr := make(chan error, 1)
	go func() {
		err := f.leases.run(lctx)
		stopLoop()
		if ctx.Err() != nil {
			f.leases.keepHeld(kctx)
		}
		keeperErr <- err
	}()
	err := f.loop(lctx, ctx)
	stopLoop()
	stopKeeper()
	if kerr := <-keeperErr; err == nil {
		err = kerr
	}
	return err
}
