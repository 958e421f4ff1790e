package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/inventory"
)

// FlusherConfig tunes the write-behind flusher. Zero values take the defaults
// named on each field.
type FlusherConfig struct {
	Options
	// Group is the consumer group on every outbox stream; default "dropline".
	// The consumer name is Options.Owner.
	Group string
	// BatchSize is the most events read and applied in one Postgres
	// transaction; default 500.
	BatchSize int
	// PollInterval is the wait after a pass over the owned partitions that
	// found nothing; default 50 milliseconds. Reads do not block, so one
	// goroutine serves every partition and stops promptly.
	PollInterval time.Duration
	// ClaimIdle is how long an event must have been delivered and not
	// acknowledged before it is claimed from its consumer (a dead process, or
	// an event Postgres refused); default 15 seconds.
	ClaimIdle time.Duration
	// ClaimInterval is how often pending events are looked at for claiming;
	// default 1 second.
	ClaimInterval time.Duration
	// TrimInterval is how often acknowledged events are trimmed from the
	// streams and the lag and backlog gauges refreshed; default 1 second.
	TrimInterval time.Duration
	// DrainTimeout bounds the final flush on Stop; default 5 seconds.
	DrainTimeout time.Duration
	// RefuseLimit is how many times Postgres may refuse one event on its own
	// (after its batch was split down to it) before the event is moved to
	// the partition's dead-letter stream, so it stops holding the stream's
	// trim point back; default 5 (with ClaimIdle, about 75 seconds). A
	// negative value keeps refused events pending for ever.
	RefuseLimit int
}

func (c *FlusherConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Group == "" {
		c.Group = "dropline"
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 500
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 50 * time.Millisecond
	}
	if c.ClaimIdle <= 0 {
		c.ClaimIdle = 15 * time.Second
	}
	if c.ClaimInterval <= 0 {
		c.ClaimInterval = time.Second
	}
	if c.TrimInterval <= 0 {
		c.TrimInterval = time.Second
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 5 * time.Second
	}
	if c.RefuseLimit == 0 {
		c.RefuseLimit = 5
	}
}

// Flusher is the write-behind worker: it carries every event the Lua scripts
// append to the partitions' outbox streams into the Postgres ledger.
//
// Delivery is at least once and the apply is idempotent (db.ApplyEvents keys
// movements by event id and only moves reservations forward), so every
// change lands exactly once:
//
//   - events are read with a consumer group (XREADGROUP), applied in one
//     transaction per batch, and acknowledged (XACK) only after the commit;
//     a crash in between leaves them pending, and they are applied again;
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
// decode, or whose kind this version does not know (a newer version wrote
// it during a rolling upgrade), are checked before the batch and moved to
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
	engine *inventory.Engine
	rdb    redis.UniversalClient
	keys   inventory.Keys
	wkeys  keys
	leases *leaseSet
	m      flusherMetrics
	hooks  flusherHooks
	// refusals counts, per outbox entry, how often Postgres refused it
	// alone; loop goroutine only.
	refusals map[string]int
}

// flusherHooks let tests interrupt a batch; nil hooks do nothing.
type flusherHooks struct {
	// beforeApply runs after a batch is read and before it is written.
	beforeApply func(partition int, events []db.Event)
	// beforeAck runs after a batch is committed to Postgres and before it is
	// acknowledged; an error abandons the batch unacknowledged, as a crash would.
	beforeAck func(partition int, events []db.Event) error
}

type flusherMetrics struct {
	lag          prometheus.Gauge
	backlog      prometheus.Gauge
	batchSize    prometheus.Histogram
	batchDur     prometheus.Histogram
	applied      prometheus.Counter
	deadLettered *prometheus.CounterVec
	deadLetters  prometheus.Gauge
	refused      prometheus.Counter
	claimed      prometheus.Counter
	// reconciled counts holds of rebuilt SKUs Redis was told about.
	reconciled prometheus.Counter
	failures   prometheus.Counter
}

// NewFlusher builds a flusher; Start runs it.
func NewFlusher(cfg FlusherConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Flusher {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	f := &Flusher{
		cfg: cfg, engine: engine, rdb: rdb, keys: engine.Keys(), wkeys: newKeys(engine.Keys()),
		leases:   newLeaseSet("flusher", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
		refusals: map[string]int{},
		m: flusherMetrics{
			lag: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "dropline_writebehind_lag_seconds",
				Help: "Age of the oldest outbox event not yet applied to Postgres, over the partitions this process flushes.",
			})),
			backlog: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "dropline_writebehind_backlog",
				Help: "Outbox events not yet applied to Postgres (pending plus undelivered), over the partitions this process flushes.",
			})),
			batchSize: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "dropline_writebehind_batch_size",
				Help:    "Events per write-behind batch.",
				Buckets: []float64{1, 5, 10, 25, 50, 100, 250, 500, 1000},
			})),
			batchDur: register(reg, prometheus.NewHistogram(prometheus.HistogramOpts{
				Name:    "dropline_writebehind_batch_duration_seconds",
				Help:    "Time to apply and acknowledge one write-behind batch.",
				Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
			})),
			applied: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_applied_total",
				Help: "Outbox events applied to Postgres and acknowledged (repeats of an event count again).",
			})),
			deadLettered: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "dropline_writebehind_dead_lettered_total",
				Help: "Outbox entries moved to their partition's dead-letter stream instead of the ledger, by reason: malformed (undecodable), unknown_kind (written by a newer version), refused (Postgres refused the event alone RefuseLimit times).",
			}, []string{"reason"})),
			deadLetters: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "dropline_writebehind_dead_letters",
				Help: "Entries in the dead-letter streams of the partitions this process flushes (they wait for an operator, see docs/operations.md).",
			})),
			refused: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_refused_total",
				Help: "Times Postgres refused one event on its own, after its batch was split; it stays pending and is retried every ClaimIdle.",
			})),
			failures: partitionFailuresVec(reg).WithLabelValues("flusher"),
			claimed: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_claimed_total",
				Help: "Pending events claimed from an idle consumer with XAUTOCLAIM.",
			})),
			reconciled: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_holds_reconciled_total",
				Help: "Holds of SKUs rebuilt while their events were in flight that Redis was told the ledger's state of (released, adopted or closed).",
			})),
		},
	}
	f.service = newService("flusher", cfg.Options, log, reg, f.run)
	return f
}

// Stop stops reading, applies and acknowledges what was read, flushes what
// is left for up to DrainTimeout, and releases the leases.
func (f *Flusher) Stop() {
	f.service.Stop()
	f.leases.releaseAll(context.Background())
}

// partitionState is what one run of the loop knows of a partition.
type partitionState struct {
	ownPending bool // re-read this consumer's pending events first
	partitionBackoff
}

func (f *Flusher) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return f.leases.run(gctx) })
	g.Go(func() error { return f.loop(gctx, ctx) })
	return g.Wait()
}

// loop flushes until stopped. gctx ends on a stop or a keeper failure; stop
// ends only on a stop, which is when the final drain runs. A partition's
// failure never ends the loop (see pass); only Redis failing the
// measurement, which every partition needs, does.
func (f *Flusher) loop(gctx, stop context.Context) error {
	var state [inventory.Partitions]partitionState
	for p := range state {
		state[p].ownPending = true
	}
	var lastClaim, lastTrim time.Time
	for {
		if gctx.Err() != nil {
			if stop.Err() != nil {
				return f.drain(stop, &state)
			}
			return nil
		}
		// Measure first: the lag and backlog matter most when Postgres is
		// down and every pass fails.
		if time.Since(lastTrim) >= f.cfg.TrimInterval {
			lastTrim = time.Now()
			if err := f.trimAndMeasure(gctx); err != nil && gctx.Err() == nil {
				return err
			}
		}
		n := f.pass(gctx, &state)
		if time.Since(lastClaim) >= f.cfg.ClaimInterval {
			lastClaim = time.Now()
			n += f.claimAll(gctx, &state)
		}
		if n == 0 {
			t := time.NewTimer(f.cfg.PollInterval)
			select {
			case <-gctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

// drain flushes what is left after a stop, for up to DrainTimeout.
func (f *Flusher) drain(stop context.Context, state *[inventory.Partitions]partitionState) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(stop), f.cfg.DrainTimeout)
	defer cancel()
	for ctx.Err() == nil {
		if f.pass(ctx, state) == 0 {
			for p := range state {
				if state[p].failures > 0 && f.leases.Held(p) {
					f.log.Warn().Int("partition", p).Msg("final flush skipped a failing partition; its events stay pending in Redis")
				}
			}
			return nil
		}
	}
	f.log.Warn().Msg("final flush ran out of time; the rest stays pending in Redis")
	return nil
}

// pass reads and applies one batch from every owned partition and returns
// how many entries it handled. A partition that fails is logged and left
// alone for a backoff; the others go on in the same pass.
func (f *Flusher) pass(ctx context.Context, state *[inventory.Partitions]partitionState) int {
	total := 0
	for p := range inventory.Partitions {
		st := &state[p]
		if !f.leases.Held(p) || !st.due() {
			continue
		}
		n, err := f.flushPartition(ctx, p, st)
		total += n
		f.settle(ctx, p, st, err)
	}
	return total
}

// settle records the outcome of one partition's flush: a failure is logged
// and counted, and the partition backs off (doubling, MinRestartBackoff to
// MaxRestartBackoff) while the others go on.
func (f *Flusher) settle(ctx context.Context, p int, st *partitionState, err error) {
	if err == nil {
		if st.failures > 0 {
			f.log.Info().Int("partition", p).Int("failures", st.failures).Msg("partition flushes again")
		}
		st.partitionBackoff = partitionBackoff{}
		return
	}
	// What this consumer read stays pending on it: read it again first.
	st.ownPending = true
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return // a stop interrupted it: the final drain goes again at once
	}
	delay := st.fail(f.cfg.Options)
	f.m.failures.Inc()
	f.log.Error().Err(err).Int("partition", p).Int("failures", st.failures).Dur("backoff", delay).
		Msg("flushing a partition failed; its events stay pending, the other partitions go on")
}

func (f *Flusher) flushPartition(ctx context.Context, p int, st *partitionState) (int, error) {
	if st.ownPending {
		msgs, err := f.read(ctx, p, "0")
		if err != nil {
			return 0, err
		}
		if len(msgs) > 0 {
			applied, err := f.apply(ctx, p, msgs)
			if err == nil && applied < len(msgs) {
				// Some were refused or fenced: leave them to XAUTOCLAIM
				// rather than re-reading them on every pass.
				st.ownPending = false
			}
			return len(msgs), err
		}
		st.ownPending = false
	}
	msgs, err := f.read(ctx, p, ">")
	if err != nil || len(msgs) == 0 {
		return 0, err
	}
	_, err = f.apply(ctx, p, msgs)
	return len(msgs), err
}

// read fetches up to BatchSize entries without blocking: id ">" for new
// events, "0" for this consumer's pending ones. A missing group (a new
// stream, or Redis lost its data) is created and the read retried.
func (f *Flusher) read(ctx context.Context, p int, id string) ([]redis.XMessage, error) {
	stream := f.keys.Outbox(p)
	for attempt := 0; ; attempt++ {
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		res, err := f.rdb.XReadGroup(sctx, &redis.XReadGroupArgs{
			Group: f.cfg.Group, Consumer: f.cfg.Owner, Streams: []string{stream, id},
			Count: int64(f.cfg.BatchSize), Block: -1, // -1: no BLOCK argument
		}).Result()
		cancel()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, nil
		case err != nil && isNoGroup(err) && attempt == 0:
			if err := f.createGroup(ctx, p); err != nil {
				return nil, err
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("reading outbox of partition %d: %w", p, err)
		}
		if len(res) == 0 {
			return nil, nil
		}
		return res[0].Messages, nil
	}
}

// createGroup creates the consumer group at the start of the stream (so
// events written before it, e.g. by a rebuild right after a flush, are
// read), and the stream itself when missing.
func (f *Flusher) createGroup(ctx context.Context, p int) error {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	err := f.rdb.XGroupCreateMkStream(sctx, f.keys.Outbox(p), f.cfg.Group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("creating consumer group on partition %d: %w", p, err)
	}
	if err == nil {
		f.log.Info().Int("partition", p).Msg("created the outbox consumer group")
	}
	return nil
}

func isNoGroup(err error) bool { return redis.HasErrorPrefix(err, "NOGROUP") }

// entry is one decoded outbox entry of a batch.
type entry struct {
	msg redis.XMessage
	ev  db.Event
}

// Reasons an entry is moved to the dead-letter stream.
const (
	deadMalformed   = "malformed"
	deadUnknownKind = "unknown_kind"
	deadRefused     = "refused"
)

// deadLetter is an entry set aside, and why.
type deadLetter struct {
	msg    redis.XMessage
	reason string
	err    error
}

// apply writes msgs to Postgres and acknowledges what it applied. Entries
// that cannot be applied by any batch (undecodable, or of a kind this
// version does not know) are dead-lettered first; the rest go in one fenced
// transaction, split while Postgres refuses it (applySplit). It returns how
// many were applied and acknowledged. The writes and acknowledgements run on
// a context detached from a stop, so a batch that was read is finished, not
// abandoned, on shutdown.
func (f *Flusher) apply(ctx context.Context, p int, msgs []redis.XMessage) (int, error) {
	began := time.Now()
	fence, ok := f.leases.Fence(p)
	if !ok {
		return 0, nil // lost the lease since the read; the events stay pending
	}
	wctx := context.WithoutCancel(ctx)
	batch := make([]entry, 0, len(msgs))
	var dead []deadLetter
	for _, m := range msgs {
		ev, err := inventory.ParseEvent(m)
		reason := deadMalformed
		if err == nil {
			err = ev.Validate()
			if errors.Is(err, db.ErrUnknownKind) {
				reason = deadUnknownKind
			}
		}
		if err != nil {
			dead = append(dead, deadLetter{msg: m, reason: reason, err: err})
			continue
		}
		batch = append(batch, entry{msg: m, ev: ev})
	}
	if err := f.deadLetter(wctx, p, dead); err != nil {
		return 0, err
	}
	if len(batch) == 0 {
		return 0, nil
	}
	if h := f.hooks.beforeApply; h != nil {
		evs := make([]db.Event, len(batch))
		for i, e := range batch {
			evs[i] = e.ev
		}
		h(p, evs)
	}
	done, refused, err := f.applySplit(wctx, p, fence, batch)
	if errors.Is(err, db.ErrFenced) {
		f.leases.Lost(p)
		err = nil // the events stay pending for the new owner
	}
	if len(done) > 0 {
		evs := make([]db.Event, len(done))
		for i, e := range done {
			evs[i] = e.ev
		}
		// Redis hears what the ledger now says before anything is
		// acknowledged: if it cannot, the batch is read, applied (a no-op)
		// and reconciled again.
		if rerr := f.reconcile(wctx, p, evs); rerr != nil {
			return 0, errors.Join(err, rerr)
		}
		if h := f.hooks.beforeAck; err == nil && h != nil {
			if err := h(p, evs); err != nil {
				return 0, err
			}
		}
	}
	// What Postgres has is acknowledged even when the rest failed.
	ids := make([]string, len(done))
	for i, e := range done {
		ids[i] = e.msg.ID
		delete(f.refusals, e.msg.ID)
	}
	actx, cancel := stepContext(wctx, f.cfg.StepTimeout)
	ackErr := f.ack(actx, p, ids)
	cancel()
	if ackErr != nil {
		return 0, errors.Join(err, ackErr)
	}
	if len(done) > 0 {
		f.m.applied.Add(float64(len(done)))
		f.m.batchSize.Observe(float64(len(done)))
		f.m.batchDur.Observe(time.Since(began).Seconds())
	}
	if err != nil {
		return len(done), err
	}
	return len(done), f.refuse(wctx, p, refused)
}

// applySplit applies batch in one fenced transaction. When Postgres refuses
// it (db.ErrRefused: the same batch would fail again), it applies each half
// on its own, down to single events, so only the events at fault are left
// out: a batch of n with one bad event takes about 2·log2(n) transactions.
// It returns what was applied, what Postgres refused alone, and the first
// other error (an outage or a timeout, or db.ErrFenced), which stops it.
func (f *Flusher) applySplit(ctx context.Context, p int, fence db.Fence, batch []entry) (done, refused []entry, err error) {
	evs := make([]db.Event, len(batch))
	for i, e := range batch {
		evs[i] = e.ev
	}
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	err = f.engine.Ledger().ApplyEvents(sctx, &fence, evs)
	cancel()
	switch {
	case err == nil:
		return batch, nil, nil
	case !errors.Is(err, db.ErrRefused) || errors.Is(err, db.ErrFenced):
		return nil, nil, fmt.Errorf("applying partition %d: %w", p, err)
	case len(batch) == 1:
		f.m.refused.Inc()
		f.log.Error().Err(err).Int("partition", p).Str("event", batch[0].ev.ID).Str("entry", batch[0].msg.ID).
			Msg("Postgres refused an outbox event; it stays pending and is retried, the rest of its batch is applied")
		return nil, batch, nil
	}
	mid := len(batch) / 2
	done, refused, err = f.applySplit(ctx, p, fence, batch[:mid])
	if err != nil {
		return done, refused, err
	}
	d2, r2, err := f.applySplit(ctx, p, fence, batch[mid:])
	return append(done, d2...), append(refused, r2...), err
}

// refuse counts the refusals of events Postgres refused alone and
// dead-letters those refused RefuseLimit times; the others stay pending.
func (f *Flusher) refuse(ctx context.Context, p int, refused []entry) error {
	if len(f.refusals) > 10*f.cfg.BatchSize {
		clear(f.refusals) // entries another process took over; start counting afresh
	}
	var dead []deadLetter
	for _, e := range refused {
		f.refusals[e.msg.ID]++
		if f.cfg.RefuseLimit > 0 && f.refusals[e.msg.ID] >= f.cfg.RefuseLimit {
			dead = append(dead, deadLetter{msg: e.msg, reason: deadRefused,
				err: fmt.Errorf("refused by Postgres %d times: event %s", f.refusals[e.msg.ID], e.ev.ID)})
		}
	}
	if err := f.deadLetter(ctx, p, dead); err != nil {
		return err
	}
	for _, d := range dead {
		delete(f.refusals, d.msg.ID)
	}
	return nil
}

// deadLetter moves entries out of the way of the flow: each is appended to
// partition p's dead-letter stream with its fields as they were plus
// dead_entry (its outbox id), dead_reason and dead_error, and acknowledged,
// in one MULTI (both keys share the partition's hash tag), so an entry is
// never both dropped and not recorded. An operator can put an entry back in
// the outbox once it can be applied (docs/operations.md); the apply is
// idempotent on the event id.
func (f *Flusher) deadLetter(ctx context.Context, p int, dead []deadLetter) error {
	if len(dead) == 0 {
		return nil
	}
	ids := make([]string, len(dead))
	for i, d := range dead {
		ids[i] = d.msg.ID
	}
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	_, err := f.rdb.TxPipelined(sctx, func(pipe redis.Pipeliner) error {
		for _, d := range dead {
			vals := make(map[string]any, len(d.msg.Values)+3)
			for k, v := range d.msg.Values {
				vals[k] = v
			}
			vals["dead_entry"], vals["dead_reason"], vals["dead_error"] = d.msg.ID, d.reason, d.err.Error()
			pipe.XAdd(sctx, &redis.XAddArgs{Stream: f.wkeys.deadLetters(p), Values: vals})
		}
		pipe.XAck(sctx, f.keys.Outbox(p), f.cfg.Group, ids...)
		return nil
	})
	if err != nil && !isNoGroup(err) { // NOGROUP: Redis lost the stream; nothing to acknowledge
		return fmt.Errorf("dead-lettering on partition %d: %w", p, err)
	}
	for _, d := range dead {
		f.m.deadLettered.WithLabelValues(d.reason).Inc()
		f.log.Error().Err(d.err).Int("partition", p).Str("entry", d.msg.ID).Str("reason", d.reason).
			Str("dead_letters", f.wkeys.deadLetters(p)).
			Msg("outbox entry cannot be applied; moved to the dead-letter stream, the rest of the flow goes on")
	}
	return nil
}

// reconcile tells Redis what an applied batch changed in the ledger for holds
// whose SKU was rebuilt since their events were written (see
// inventory.Engine.ReconcileApplied).
func (f *Flusher) reconcile(ctx context.Context, p int, events []db.Event) error {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	n, err := f.engine.ReconcileApplied(sctx, p, events)
	f.m.reconciled.Add(float64(n))
	if err != nil {
		return fmt.Errorf("reconciling partition %d with the ledger: %w", p, err)
	}
	return nil
}

func (f *Flusher) ack(ctx context.Context, p int, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	err := f.rdb.XAck(ctx, f.keys.Outbox(p), f.cfg.Group, ids...).Err()
	if err != nil && !isNoGroup(err) { // NOGROUP: Redis lost the stream; nothing to acknowledge
		return fmt.Errorf("acknowledging partition %d: %w", p, err)
	}
	return nil
}

// claimAll takes over events pending longer than ClaimIdle on any consumer
// of the owned partitions, and applies them. A partition that fails backs
// off like in pass; the others go on.
func (f *Flusher) claimAll(ctx context.Context, state *[inventory.Partitions]partitionState) int {
	total := 0
	for p := range inventory.Partitions {
		st := &state[p]
		if !f.leases.Held(p) || !st.due() {
			continue
		}
		n, err := f.claimPartition(ctx, p)
		total += n
		if err != nil {
			f.settle(ctx, p, st, err)
		}
	}
	return total
}

func (f *Flusher) claimPartition(ctx context.Context, p int) (int, error) {
	total := 0
	start := "0-0"
	for range 10 { // bounded per pass; the next pass goes on
		sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
		msgs, next, err := f.rdb.XAutoClaim(sctx, &redis.XAutoClaimArgs{
			Stream: f.keys.Outbox(p), Group: f.cfg.Group, Consumer: f.cfg.Owner,
			MinIdle: f.cfg.ClaimIdle, Start: start, Count: int64(f.cfg.BatchSize),
		}).Result()
		cancel()
		if isNoGroup(err) || errors.Is(err, redis.Nil) {
			break
		}
		if err != nil {
			return total, fmt.Errorf("claiming pending events of partition %d: %w", p, err)
		}
		if len(msgs) > 0 {
			f.m.claimed.Add(float64(len(msgs)))
			f.log.Info().Int("partition", p).Int("events", len(msgs)).Msg("claimed pending events from an idle consumer")
			if _, err := f.apply(ctx, p, msgs); err != nil {
				return total, err
			}
			total += len(msgs)
		}
		if next == "0-0" || next == "" {
			break
		}
		start = next
	}
	return total, nil
}

// trimAndMeasure trims each owned stream below what is acknowledged and
// refreshes the lag and backlog gauges.
func (f *Flusher) trimAndMeasure(ctx context.Context) error {
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	now, err := f.rdb.Time(sctx).Result()
	cancel()
	if err != nil {
		return fmt.Errorf("reading Redis time: %w", err)
	}
	var lag time.Duration
	var backlog, dead int64
	for p := range inventory.Partitions {
		if !f.leases.Held(p) {
			continue
		}
		s, err := f.streamState(ctx, p)
		if err != nil {
			return err
		}
		backlog += s.unapplied
		dead += s.deadLetters
		if s.oldest != "" {
			lag = max(lag, now.Sub(time.UnixMilli(idMillis(s.oldest))))
		}
		if s.trimBelow != "" {
			sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
			err := f.rdb.XTrimMinID(sctx, f.keys.Outbox(p), s.trimBelow).Err()
			cancel()
			if err != nil {
				return fmt.Errorf("trimming outbox of partition %d: %w", p, err)
			}
		}
	}
	f.m.lag.Set(max(lag, 0).Seconds())
	f.m.backlog.Set(float64(backlog))
	f.m.deadLetters.Set(float64(dead))
	return nil
}

// streamState is what the group has and has not applied of one stream.
type streamState struct {
	unapplied int64  // pending plus not yet delivered
	oldest    string // id of the oldest unapplied event, "" when none
	trimBelow string // entries below this id are all acknowledged
	// deadLetters is the length of the partition's dead-letter stream.
	deadLetters int64
}

func (f *Flusher) streamState(ctx context.Context, p int) (streamState, error) {
	stream := f.keys.Outbox(p)
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	dead, err := f.rdb.XLen(sctx, f.wkeys.deadLetters(p)).Result()
	if err != nil {
		return streamState{}, fmt.Errorf("reading dead letters of partition %d: %w", p, err)
	}
	groups, err := f.rdb.XInfoGroups(sctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return streamState{deadLetters: dead}, nil
		}
		return streamState{}, fmt.Errorf("reading outbox group of partition %d: %w", p, err)
	}
	var g *redis.XInfoGroup
	for i := range groups {
		if groups[i].Name == f.cfg.Group {
			g = &groups[i]
		}
	}
	if g == nil {
		return streamState{deadLetters: dead}, nil
	}
	s := streamState{deadLetters: dead}
	if g.Pending > 0 {
		pend, err := f.rdb.XPending(sctx, stream, f.cfg.Group).Result()
		if err != nil {
			return streamState{}, fmt.Errorf("reading pending events of partition %d: %w", p, err)
		}
		s.oldest, s.trimBelow = pend.Lower, pend.Lower
	} else if g.LastDeliveredID != "0-0" {
		s.trimBelow = g.LastDeliveredID
	}
	undelivered := g.Lag
	if undelivered != 0 && s.oldest == "" {
		next, err := f.rdb.XRangeN(sctx, stream, "("+g.LastDeliveredID, "+", 1).Result()
		if err != nil {
			return streamState{}, fmt.Errorf("reading outbox of partition %d: %w", p, err)
		}
		if len(next) > 0 {
			s.oldest = next[0].ID
		}
	}
	if undelivered < 0 { // Redis cannot tell; count what is past the last delivery
		n, err := f.rdb.XLen(sctx, stream).Result()
		if err != nil {
			return streamState{}, fmt.Errorf("reading outbox length of partition %d: %w", p, err)
		}
		undelivered = max(n-g.Pending, 0)
	}
	s.unapplied = g.Pending + undelivered
	return s, nil
}

// idMillis is the creation time (Redis clock, ms) in a stream entry id.
func idMillis(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}
