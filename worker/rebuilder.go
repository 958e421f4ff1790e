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
	"github.com/dropline/dropline/internal/testsignal"
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
	engine   *inventory.Maintenance
	rdb      redis.UniversalClient
	keys     keys
	rebuilds prometheus.Counter
	losses   prometheus.Counter
	failures prometheus.Counter

	mu   sync.Mutex // guards seen, owed, reload and retry across loop restarts
	seen [inventory.Partitions]string
	owed [inventory.Partitions]bool // a rebuild was due and has not completed
	// reload is, per partition, the replication id of the new primary this
	// process reloads the partition's SKUs for, after a promotion (rebuilt
	// even when present); "" when it reloads none.
	reload [inventory.Partitions]string
	retry  partitionBackoff // after a rebuild that left SKUs out

	failovers prometheus.Counter
	hooks     rebuilderHooks
	// checked signals, to a test, each check of the epochs and the primary
	// that finished without an error; rebuilt, each SKU it reloaded; and
	// reloaded, the primary's replication id once the reload after its
	// promotion is recorded as done.
	checked  testsignal.Signal[struct{}]
	rebuilt  testsignal.Signal[string]
	reloaded testsignal.Signal[string]
}

// rebuilderHooks let tests interrupt the rebuilder; nil hooks do nothing.
type rebuilderHooks struct {
	// claimedReload runs once this process has claimed the reload after a
	// promotion, before it reloads anything.
	claimedReload func()
}

// NewRebuilder builds a rebuilder; Start runs it.
func NewRebuilder(cfg RebuilderConfig, engine *inventory.Maintenance, rdb redis.UniversalClient, log zerolog.Logger, reg prometheus.Registerer) *Rebuilder {
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
			Help: "Changes of a Redis primary's replication id (a promoted replica, or a primary restarted from its files) for which this instance claimed the reload of its SKUs from Postgres (every SKU; on a cluster, those of the shard's partitions).",
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
		w.checked.Signal(struct{}{})
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
	claims, err := w.checkPrimaries(sctx)
	if err != nil {
		return err
	}
	for p, id := range claims {
		if id != "" && !slices.Contains(w.reload[:], id) && !slices.Contains(claims[:p], id) {
			w.failovers.Inc()
			w.log.Warn().Str("primary", id).Ints("partitions", partitionsOf(claims, id)).
				Msg("the Redis primary of these partitions changed (a replica was promoted, or it restarted from its files): it may lack the last writes before the switch, so their SKUs are rebuilt from Postgres")
			if h := w.hooks.claimedReload; h != nil {
				h()
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	// A partition without a claim has nothing to reload, or another process
	// reloads it.
	w.reload = claims
	for p, id := range claims {
		if id != "" && !w.owed[p] {
			w.owed[p] = true
			lostNow = append(lostNow, p)
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
	// Only now is a reload recorded as done, per record (one for a single
	// primary, one per partition on a cluster), once every partition it
	// covers is: a process that dies before this leaves the record as it
	// was, and its claim expires, so another process reloads what it left.
	for p, id := range w.reload {
		scope := w.scope(p)
		if id == "" || p != scope {
			continue
		}
		done := true
		for q, qid := range w.reload {
			if qid == id && w.scope(q) == scope && failed[q] {
				done = false
			}
		}
		if !done {
			continue
		}
		fctx, fcancel := stepContext(ctx, w.cfg.StepTimeout)
		err := w.finishReload(fctx, scope, id)
		fcancel()
		if err != nil {
			return err
		}
		for q, qid := range w.reload {
			if qid == id && w.scope(q) == scope {
				w.reload[q] = ""
			}
		}
		w.reloaded.Signal(id)
	}
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
		page, err := w.engine.Engine().Catalog().Products(sctx, after, w.cfg.PageSize)
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
			p := w.engine.Keys().PartitionOf(sku)
			reload, scope := w.reload[p], w.scope(p)
			g.Go(func() error {
				rebuilt, err := w.rebuildSKU(ctx, sku, scope, reload)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					if rebuilt {
						n++
						w.rebuilt.Signal(sku)
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

// rebuildSKU reloads one SKU unless it is present already, and says whether
// it did. During the reload after a promotion to the primary reload (its
// replication id, recorded in partition scope), it reloads the SKU although
// it is present, unless a process reloaded it for that primary already, and
// renews the claim.
func (w *Rebuilder) rebuildSKU(ctx context.Context, sku string, scope int, reload string) (bool, error) {
	sctx, cancel := stepContext(ctx, w.cfg.StepTimeout)
	defer cancel()
	if reload != "" {
		done, err := w.rdb.SIsMember(sctx, w.keys.reloaded(scope, reload), sku).Result()
		if err != nil {
			return false, fmt.Errorf("reading the SKUs reloaded for the new primary: %w", err)
		}
		if done {
			return false, nil
		}
		if err := w.engine.RebuildStale(sctx, sku); err != nil {
			return false, err
		}
		w.rebuilds.Inc()
		_, err = w.rdb.TxPipelined(sctx, func(p redis.Pipeliner) error {
			p.SAdd(sctx, w.keys.reloaded(scope, reload), sku)
			p.Expire(sctx, w.keys.reloaded(scope, reload), reloadRecordTTL)
			p.PExpire(sctx, w.keys.reloadClaim(scope, reload), w.claimTTL())
			return nil
		})
		if err != nil {
			return true, fmt.Errorf("recording %s as reloaded for the new primary: %w", sku, err)
		}
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

// checkPrimaries reads the replication id of the Redis primary of every
// partition and compares it with the one recorded in Redis, which is the id
// of the primary the partition's SKUs were last reloaded for. A single
// primary (or Sentinel's) serves every partition: its id is recorded once,
// in partition 0, and a new one reloads every SKU. On a cluster each shard's
// master has its own id, recorded per partition, and a promotion reloads
// the SKUs of the partitions that master serves. A first sight records the
// id. When the id is new, the SKUs must be reloaded from Postgres by one
// process: the first to claim the reload for that id (SET NX with an
// expiry, renewed as each SKU is reloaded) does it, and records the id only
// once every SKU is reloaded (finishReload). A process that dies meanwhile
// leaves the record as it was: its claim expires and another process claims
// it and reloads the SKUs the first did not (those it did are listed per
// id). claims holds, per partition, the id this process claimed the reload
// for, or "".
func (w *Rebuilder) checkPrimaries(ctx context.Context) (claims [inventory.Partitions]string, err error) {
	cc, cluster := w.rdb.(*redis.ClusterClient)
	if !cluster {
		id, err := replicationID(ctx, w.rdb)
		if err != nil || id == "" {
			return claims, err
		}
		claimed, err := w.claimReload(ctx, 0, id)
		if err != nil || !claimed {
			return claims, err
		}
		for p := range claims {
			claims[p] = id
		}
		return claims, nil
	}
	ids := map[string]string{} // master address -> its replication id
	for p := range claims {
		master, err := cc.MasterForKey(ctx, w.keys.primary(p))
		if err != nil {
			return claims, fmt.Errorf("finding the master of partition %d: %w", p, err)
		}
		addr := master.Options().Addr
		id, seen := ids[addr]
		if !seen {
			if id, err = replicationID(ctx, master); err != nil {
				return claims, err
			}
			ids[addr] = id
		}
		if id == "" {
			continue
		}
		claimed, err := w.claimReload(ctx, p, id)
		if err != nil {
			return claims, err
		}
		if claimed {
			claims[p] = id
		}
	}
	return claims, nil
}

// replicationID reads the replication id of a primary; "" when the server
// is not a primary (yet: the client follows the switch).
func replicationID(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", fmt.Errorf("reading the primary's replication id: %w", err)
	}
	if infoField(info, "role") != "master" {
		return "", nil
	}
	return infoField(info, "master_replid"), nil
}

// claimReload compares id with the primary recorded in partition scope and
// says whether this process holds the claim to reload for it: recording id
// when nothing is recorded, claiming (or renewing its own claim) when the
// recorded id differs.
func (w *Rebuilder) claimReload(ctx context.Context, scope int, id string) (bool, error) {
	prev, err := w.rdb.Get(ctx, w.keys.primary(scope)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return false, w.rdb.SetNX(ctx, w.keys.primary(scope), id, 0).Err()
	case err != nil:
		return false, fmt.Errorf("reading the recorded primary: %w", err)
	case prev == id:
		return false, nil
	}
	won, err := w.rdb.SetNX(ctx, w.keys.reloadClaim(scope, id), w.cfg.Owner, w.claimTTL()).Result()
	if err != nil {
		return false, fmt.Errorf("claiming the reload for the new primary: %w", err)
	}
	if !won {
		owner, err := w.rdb.Get(ctx, w.keys.reloadClaim(scope, id)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, fmt.Errorf("reading the reload claim: %w", err)
		}
		if owner != w.cfg.Owner {
			return false, nil // another process reloads; its claim expires if it dies
		}
		if err := w.rdb.PExpire(ctx, w.keys.reloadClaim(scope, id), w.claimTTL()).Err(); err != nil {
			return false, fmt.Errorf("renewing the reload claim: %w", err)
		}
	}
	return true, nil
}

// scope is the partition whose keys record partition p's primary: 0 for a
// single primary, which serves them all, p itself on a cluster.
func (w *Rebuilder) scope(p int) int {
	if _, cluster := w.rdb.(*redis.ClusterClient); cluster {
		return p
	}
	return 0
}

// partitionsOf lists the partitions claimed for id.
func partitionsOf(claims [inventory.Partitions]string, id string) []int {
	var out []int
	for p, c := range claims {
		if c == id {
			out = append(out, p)
		}
	}
	return out
}

// finishReload records that every SKU recorded in partition scope was
// reloaded for the primary id.
func (w *Rebuilder) finishReload(ctx context.Context, scope int, id string) error {
	_, err := w.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, w.keys.primary(scope), id, 0)
		p.Del(ctx, w.keys.reloadClaim(scope, id))
		return nil
	})
	if err != nil {
		return fmt.Errorf("recording the reload for the new primary: %w", err)
	}
	w.log.Info().Str("primary", id).Int("record", scope).Msg("the SKUs are reloaded from Postgres for the new Redis primary")
	return nil
}

// claimTTL is how long a reload claim outlives the last SKU its owner
// reloaded: a process silent that long is taken for dead.
func (w *Rebuilder) claimTTL() time.Duration { return 3 * w.cfg.LeaseTTL }

// reloadRecordTTL bounds the list of SKUs reloaded for one primary; a reload
// takes minutes at most.
const reloadRecordTTL = 24 * time.Hour

// infoField reads "name:value" from an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
