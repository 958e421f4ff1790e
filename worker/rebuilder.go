package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/internal/prom"
	"github.com/dropline/dropline/inventory"
)

// RebuilderConfig tunes the rebuilder. Zero values take the defaults named on
// each field.
type RebuilderConfig struct {
	Options
	// Interval is how often the epoch keys are checked; default 1 second.
	Interval time.Duration
	// PageSize is how many products are listed from Postgres at a time;
	// default 100.
	PageSize int
	// Concurrency is how many SKUs are rebuilt at once; default 4. Each
	// rebuild holds one Postgres connection and the product's row lock.
	Concurrency int
}

func (c *RebuilderConfig) setDefaults() {
	c.Options.setDefaults()
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.PageSize <= 0 {
		c.PageSize = 100
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
}

// Rebuilder notices that Redis lost its data and reloads every product from
// Postgres at once, instead of waiting for each SKU's next request to do it
// (the engine's lazy read-repair, which stays the safety net).
//
// Detection: each partition has an epoch key set once with a random value
// (SET NX). Redis data loss takes it away (FLUSHALL, a restart without
// persistence, failover to an empty replica; with Redis Cluster, per shard,
// which is why there is one per partition). The process whose SET NX
// recreates a vanished epoch rebuilds that partition's SKUs; a process that
// sees an epoch change under it rebuilds too, which costs one EXISTS per SKU
// when the winner was faster. Each rebuild is the engine's Rebuild: atomic per
// SKU under the product's Postgres row lock, and a no-op when the SKU is
// present, so racing the lazy path or another process is safe.
type Rebuilder struct {
	*service
	cfg      RebuilderConfig
	engine   *inventory.Engine
	rdb      redis.UniversalClient
	keys     keys
	rebuilds prometheus.Counter
	losses   prometheus.Counter
	failures prometheus.Counter

	mu    sync.Mutex // guards seen, owed, stale and retry across loop restarts
	seen  [inventory.Partitions]string
	owed  [inventory.Partitions]bool // a rebuild was due and has not completed
	stale bool                       // a promotion was seen: rebuild SKUs even when present
	retry partitionBackoff           // after a rebuild that left SKUs out

	failovers prometheus.Counter
}

// NewRebuilder builds a rebuilder; Start runs it.
func NewRebuilder(cfg RebuilderConfig, engine *inventory.Engine, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Rebuilder {
	cfg.setDefaults()
	log = log.With().Str("owner", cfg.Owner).Logger()
	w := &Rebuilder{
		cfg: cfg, engine: engine, rdb: rdb, keys: newKeys(engine.Keys()),
		rebuilds: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_rebuilds_total",
			Help: "SKUs the rebuilder reloaded into Redis from Postgres after Redis lost its data.",
		})),
		losses: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_redis_data_losses_total",
			Help: "Partitions whose Redis epoch key was missing or changed: a new Redis (first start), or one that lost its data (flush, restart without persistence, failover). Their SKUs are rebuilt from Postgres.",
		})),
		failures: partitionFailuresVec(reg).WithLabelValues("rebuilder"),
		failovers: prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dropline_redis_failovers_total",
			Help: "Changes of the Redis primary's replication id seen by this instance (a promoted replica, or a primary restarted from its files); every SKU is then rebuilt from Postgres.",
		})),
	}
	w.service = newService("rebuilder", cfg.Options, log, reg, nil, w.run)
	return w
}

func (w *Rebuilder) run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		if err := w.check(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// check reads every epoch, claims vanished ones, and rebuilds the partitions
// that lost their data.
func (w *Rebuilder) check(ctx context.Context) error {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	defer cancel()
	gets := make([]*redis.StringCmd, inventory.Partitions)
	_, err := w.rdb.Pipelined(sctx, func(p redis.Pipeliner) error {
		for i := range gets {
			gets[i] = p.Get(sctx, w.keys.epoch(i))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("reading epochs: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var lostNow []int
	for p, g := range gets {
		cur, err := g.Result()
		if errors.Is(err, redis.Nil) {
			fresh := randomHex(8)
			won, err := w.rdb.SetNX(sctx, w.keys.epoch(p), fresh, 0).Result()
			if err != nil {
				return fmt.Errorf("setting epoch of partition %d: %w", p, err)
			}
			if !won {
				continue // another process recreated it; read it next time
			}
			cur = fresh
			w.owed[p] = true
		} else if err != nil {
			return fmt.Errorf("reading epoch of partition %d: %w", p, err)
		} else if w.seen[p] != "" && cur != w.seen[p] {
			w.owed[p] = true
		}
		if w.owed[p] && w.seen[p] != cur {
			w.losses.Inc()
			lostNow = append(lostNow, p)
		}
		w.seen[p] = cur
	}
	if len(lostNow) > 0 {
		w.log.Warn().Ints("partitions", lostNow).
			Msg("Redis is new or lost its data (epoch missing or changed); rebuilding these partitions' SKUs from Postgres")
	}
	promoted, err := w.checkPrimary(sctx)
	if err != nil {
		return err
	}
	if promoted {
		w.failovers.Inc()
		w.log.Warn().Msg("the Redis primary changed (a replica was promoted, or it restarted from its files): it may lack the last writes before the switch, so every SKU is rebuilt from Postgres")
		w.stale = true
		for p := range w.owed {
			if !w.owed[p] {
				w.owed[p] = true
				lostNow = append(lostNow, p)
			}
		}
	}
	var lost []bool
	for _, owed := range w.owed {
		if owed {
			lost = w.owed[:]
			break
		}
	}
	// A rebuild that left SKUs out is tried again after a backoff, or at once
	// when another loss is seen.
	if lost == nil || (len(lostNow) == 0 && !w.retry.due()) {
		return nil
	}
	failed, err := w.rebuild(ctx, lost)
	if err != nil {
		return err
	}
	for p := range w.owed {
		w.owed[p] = failed[p]
	}
	w.stale = w.stale && slices.Contains(failed[:], true)
	if slices.Contains(failed[:], true) {
		delay := w.retry.fail(w.cfg.Options)
		w.log.Warn().Dur("retry_in", delay).Msg("rebuild left SKUs out; they are retried after a backoff (and rebuilt on their next request)")
	} else {
		w.retry = partitionBackoff{}
	}
	return nil
}

// rebuild reloads every product of the lost partitions, paging through the
// catalogue by SKU. A SKU that fails is logged and counted, and the others
// go on; failed names the partitions with a SKU left out. Only a failure to
// list the catalogue is an error.
func (w *Rebuilder) rebuild(ctx context.Context, lost []bool) (failed [inventory.Partitions]bool, err error) {
	after := ""
	n := 0
	for {
		sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
		page, err := w.engine.Products(sctx, after, w.cfg.PageSize)
		cancel()
		if err != nil {
			return failed, fmt.Errorf("listing products to rebuild: %w", err)
		}
		var g errgroup.Group
		g.SetLimit(w.cfg.Concurrency)
		var mu sync.Mutex
		for _, prod := range page {
			if !lost[w.engine.Keys().PartitionOf(prod.SKU)] {
				continue
			}
			sku := prod.SKU
			stale := w.stale
			g.Go(func() error {
				rebuilt, err := w.rebuildSKU(ctx, sku, stale)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					if rebuilt {
						n++
					}
				case ctx.Err() == nil:
					failed[w.engine.Keys().PartitionOf(sku)] = true
					w.failures.Inc()
					w.log.Error().Err(err).Str("sku", sku).Msg("rebuilding a SKU failed; the others go on")
				}
				return nil
			})
		}
		_ = g.Wait() // each SKU's failure is handled above
		if ctx.Err() != nil {
			return failed, ctx.Err()
		}
		if len(page) < w.cfg.PageSize {
			break
		}
		after = page[len(page)-1].SKU
	}
	w.log.Info().Int("skus", n).Msg("rebuild from Postgres finished")
	return failed, nil
}

// rebuildSKU reloads one SKU unless it is present already (or, after a
// promotion, although it is), and says whether it did.
func (w *Rebuilder) rebuildSKU(ctx context.Context, sku string, stale bool) (bool, error) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	defer cancel()
	if stale {
		if err := w.engine.RebuildStale(sctx, sku); err != nil {
			return false, err
		}
		w.rebuilds.Inc()
		return true, nil
	}
	rebuilt, err := w.engine.RebuildMissing(sctx, sku)
	if err != nil {
		return false, err
	}
	if rebuilt {
		w.rebuilds.Inc()
	}
	return rebuilt, nil
}

// checkPrimary compares the replication id of the Redis primary with the one
// recorded in Redis, and reports whether this process is the one that saw it
// change: the record is swapped with SET ... GET, so of several instances
// exactly one finds the old id there. A first sight records the id. Redis
// Cluster has an id per shard and is not followed here (an empty shard is
// still found by its epochs).
func (w *Rebuilder) checkPrimary(ctx context.Context) (bool, error) {
	if _, cluster := w.rdb.(*redis.ClusterClient); cluster {
		return false, nil
	}
	info, err := w.rdb.Info(ctx, "replication").Result()
	if err != nil {
		return false, fmt.Errorf("reading the primary's replication id: %w", err)
	}
	id, role := infoField(info, "master_replid"), infoField(info, "role")
	if id == "" || role != "master" {
		return false, nil // not a primary (yet): the client follows the switch
	}
	prev, err := w.rdb.Get(ctx, w.keys.primary()).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return false, w.rdb.SetNX(ctx, w.keys.primary(), id, 0).Err()
	case err != nil:
		return false, fmt.Errorf("reading the recorded primary: %w", err)
	case prev == id:
		return false, nil
	}
	old, err := w.rdb.SetArgs(ctx, w.keys.primary(), id, redis.SetArgs{Get: true}).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("recording the new primary: %w", err)
	}
	return old != id, nil
}

// infoField reads "name:value" from an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
