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
// A process flushes only partitions whose "flusher" lease it holds, and each
// batch carries the lease's fencing token, so a paused former owner's late
// batch is refused by Postgres (db.ErrFenced) instead of racing its
// successor. While Postgres is down, batches fail, the loop restarts with
// backoff, and events wait in Redis; they drain when it returns.
type Flusher struct {
	*service
	cfg    FlusherConfig
	engine *inventory.Engine
	rdb    redis.UniversalClient
	keys   inventory.Keys
	leases *leaseSet
	m      flusherMetrics
	hooks  flusherHooks
}

// flusherHooks let tests interrupt a batch; nil hooks do nothing.
type flusherHooks struct {
	// beforeAck runs after a batch is committed to Postgres and before it is
	// acknowledged; an error abandons the batch unacknowledged, as a crash would.
	beforeAck func(partition int, events []db.Event) error
}

type flusherMetrics struct {
	lag       prometheus.Gauge
	backlog   prometheus.Gauge
	batchSize prometheus.Histogram
	batchDur  prometheus.Histogram
	applied   prometheus.Counter
	malformed prometheus.Counter
	refused   prometheus.Counter
	claimed   prometheus.Counter
}

// NewFlusher builds a flusher; Start runs it.
func NewFlusher(cfg FlusherConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Flusher {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	f := &Flusher{
		cfg: cfg, engine: engine, rdb: rdb, keys: engine.Keys(),
		leases: newLeaseSet("flusher", newKeys(engine.Keys()), rdb, cfg.Options, log, reg),
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
			malformed: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_malformed_total",
				Help: "Outbox entries that could not be decoded; they are logged and acknowledged.",
			})),
			refused: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_refused_total",
				Help: "Events Postgres refused on their own (constraint); they stay pending and are retried every ClaimIdle.",
			})),
			claimed: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
				Name: "dropline_writebehind_events_claimed_total",
				Help: "Pending events claimed from an idle consumer with XAUTOCLAIM.",
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
}

func (f *Flusher) run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return f.leases.run(gctx) })
	g.Go(func() error { return f.loop(gctx, ctx) })
	return g.Wait()
}

// loop flushes until stopped. gctx ends on a stop or a keeper failure; stop
// ends only on a stop, which is when the final drain runs.
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
		n, err := f.pass(gctx, &state)
		if err != nil {
			if gctx.Err() != nil {
				continue
			}
			return err
		}
		if time.Since(lastClaim) >= f.cfg.ClaimInterval {
			lastClaim = time.Now()
			c, err := f.claimAll(gctx)
			if err != nil && gctx.Err() == nil {
				return err
			}
			n += c
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
		n, err := f.pass(ctx, state)
		if err != nil {
			f.log.Warn().Err(err).Msg("final flush stopped early; the rest stays pending in Redis")
			return nil
		}
		if n == 0 {
			return nil
		}
	}
	f.log.Warn().Msg("final flush ran out of time; the rest stays pending in Redis")
	return nil
}

// pass reads and applies one batch from every owned partition.
func (f *Flusher) pass(ctx context.Context, state *[inventory.Partitions]partitionState) (int, error) {
	total := 0
	for p := range inventory.Partitions {
		if !f.leases.Held(p) {
			continue
		}
		n, err := f.flushPartition(ctx, p, &state[p])
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (f *Flusher) flushPartition(ctx context.Context, p int, st *partitionState) (int, error) {
	if st.ownPending {
		msgs, err := f.read(ctx, p, "0")
		if err != nil {
			return 0, err
		}
		if len(msgs) > 0 {
			applied, err := f.apply(ctx, p, msgs)
			if applied < len(msgs) {
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

// apply writes msgs to Postgres in one fenced transaction and acknowledges
// them after the commit. It returns how many were applied and acknowledged.
// The write and the acknowledgement run on a context detached from a stop,
// so a batch that was read is finished, not abandoned, on shutdown.
func (f *Flusher) apply(ctx context.Context, p int, msgs []redis.XMessage) (int, error) {
	began := time.Now()
	fence, ok := f.leases.Fence(p)
	if !ok {
		return 0, nil // lost the lease since the read; the events stay pending
	}
	events := make([]db.Event, 0, len(msgs))
	ids := make([]string, 0, len(msgs))
	var bad []string
	for _, m := range msgs {
		ev, err := inventory.ParseEvent(m)
		if err != nil {
			f.log.Error().Err(err).Int("partition", p).Str("entry", m.ID).Msg("dropping a malformed outbox entry")
			bad = append(bad, m.ID)
			continue
		}
		events = append(events, ev)
		ids = append(ids, m.ID)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.StepTimeout)
	defer cancel()
	if len(bad) > 0 {
		f.m.malformed.Add(float64(len(bad)))
		if err := f.ack(wctx, p, bad); err != nil {
			return 0, err
		}
	}
	if len(events) == 0 {
		return 0, nil
	}
	err := f.engine.Ledger().ApplyEvents(wctx, &fence, events)
	switch {
	case errors.Is(err, db.ErrFenced):
		f.leases.Lost(p)
		return 0, nil
	case errors.Is(err, db.ErrNotFound) || errors.Is(err, db.ErrInvalid):
		// A constraint refused the batch: one event is poison. Apply them
		// one by one so the rest get through.
		return f.applyEach(wctx, p, fence, events, ids)
	case err != nil:
		return 0, fmt.Errorf("applying partition %d: %w", p, err)
	}
	if h := f.hooks.beforeAck; h != nil {
		if err := h(p, events); err != nil {
			return 0, err
		}
	}
	if err := f.ack(wctx, p, ids); err != nil {
		return 0, err
	}
	f.m.applied.Add(float64(len(events)))
	f.m.batchSize.Observe(float64(len(events)))
	f.m.batchDur.Observe(time.Since(began).Seconds())
	return len(events), nil
}

func (f *Flusher) applyEach(ctx context.Context, p int, fence db.Fence, events []db.Event, ids []string) (int, error) {
	var done []string
	for i, ev := range events {
		err := f.engine.Ledger().ApplyEvents(ctx, &fence, []db.Event{ev})
		switch {
		case err == nil:
			done = append(done, ids[i])
		case errors.Is(err, db.ErrFenced):
			f.leases.Lost(p)
			return 0, nil
		case errors.Is(err, db.ErrNotFound) || errors.Is(err, db.ErrInvalid):
			f.m.refused.Inc()
			f.log.Error().Err(err).Int("partition", p).Str("event", ev.ID).Str("entry", ids[i]).
				Msg("Postgres refused an outbox event; it stays pending and is retried")
		default:
			return 0, fmt.Errorf("applying partition %d: %w", p, err)
		}
	}
	if err := f.ack(ctx, p, done); err != nil {
		return 0, err
	}
	f.m.applied.Add(float64(len(done)))
	return len(done), nil
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
// of the owned partitions, and applies them.
func (f *Flusher) claimAll(ctx context.Context) (int, error) {
	total := 0
	for p := range inventory.Partitions {
		if !f.leases.Held(p) {
			continue
		}
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
	var backlog int64
	for p := range inventory.Partitions {
		if !f.leases.Held(p) {
			continue
		}
		s, err := f.streamState(ctx, p)
		if err != nil {
			return err
		}
		backlog += s.unapplied
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
	return nil
}

// streamState is what the group has and has not applied of one stream.
type streamState struct {
	unapplied int64  // pending plus not yet delivered
	oldest    string // id of the oldest unapplied event, "" when none
	trimBelow string // entries below this id are all acknowledged
}

func (f *Flusher) streamState(ctx context.Context, p int) (streamState, error) {
	stream := f.keys.Outbox(p)
	sctx, cancel := stepContext(ctx, f.cfg.StepTimeout)
	defer cancel()
	groups, err := f.rdb.XInfoGroups(sctx, stream).Result()
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return streamState{}, nil
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
		return streamState{}, nil
	}
	var s streamState
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
