package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/internal/testsignal"
	"github.com/dropline/dropline/inventory"
	"github.com/dropline/dropline/lua"
)

// leaseSet owns one worker kind's partition leases for this process. Its
// keeper loop renews held leases every TTL/3, acquires free partitions, and
// keeps this process near its fair share: with n live processes (the members
// set) it releases partitions above ceil(Partitions/n), and leaves a released
// partition alone for a few checks so another process can take it. A
// partition nobody takes is taken back, so no partition stays orphaned.
type leaseSet struct {
	kind     string
	keys     keys
	rdb      redis.UniversalClient
	opts     Options
	log      zerolog.Logger
	leases   [inventory.Partitions]*Lease
	cooldown [inventory.Partitions]time.Time // keeper goroutine only
	changes  *prometheus.CounterVec
	held     prometheus.Gauge
	failures prometheus.Counter
	// heldNow signals, to a test, how many leases the process holds after
	// each check of the keeper.
	heldNow testsignal.Signal[int]
}

func newLeaseSet(kind string, k keys, rdb redis.UniversalClient, opts Options, log zerolog.Logger, reg prometheus.Registerer) *leaseSet {
	m := newLeaseMetrics(reg)
	s := &leaseSet{kind: kind, keys: k, rdb: rdb, opts: opts, log: log, changes: m.changes, held: m.held.WithLabelValues(kind),
		failures: partitionFailuresVec(reg).WithLabelValues(kind)}
	for p := range s.leases {
		s.leases[p] = NewLease(rdb, LeaseConfig{Key: k.lease(p, kind), FenceKey: k.fence(p, kind), Owner: opts.Owner, TTL: opts.LeaseTTL})
	}
	return s
}

// Held reports whether this process may work on partition p now.
func (s *leaseSet) Held(p int) bool { return s.leases[p].Held() }

// Fence returns partition p's fencing token, false when not held.
func (s *leaseSet) Fence(p int) (db.Fence, bool) { return s.leases[p].Fence() }

// Lost records that Postgres fenced partition p off: a newer owner exists.
func (s *leaseSet) Lost(p int) {
	s.leases[p].Lost()
	s.changes.WithLabelValues(s.kind, "lost").Inc()
	s.log.Warn().Int("partition", p).Str("lease", s.kind).Msg("fenced off by a newer lease holder")
}

// Owned lists the partitions held now.
func (s *leaseSet) Owned() []int {
	var out []int
	for p, l := range s.leases {
		if l.Held() {
			out = append(out, p)
		}
	}
	return out
}

// run is the keeper loop; it checks at once, then every LeaseCheck.
func (s *leaseSet) run(ctx context.Context) error {
	t := time.NewTicker(s.opts.LeaseCheck)
	defer t.Stop()
	for {
		if err := s.check(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// membersScript records this process as live for one TTL, forgets lapsed
// members and returns how many are live (lua/lease_members.lua).
var membersScript = redis.NewScript(lua.MustSource(lua.LeaseMembers))

func (s *leaseSet) check(ctx context.Context) error {
	sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
	live, err := membersScript.Run(sctx, s.rdb, []string{s.keys.members(s.kind)}, s.opts.Owner, s.opts.LeaseTTL.Milliseconds()).Int()
	cancel()
	if err != nil {
		return fmt.Errorf("recording %s membership: %w", s.kind, err)
	}
	share := (inventory.Partitions + max(live, 1) - 1) / max(live, 1)
	now := time.Now()
	held := 0
	for p, l := range s.leases {
		if !l.Held() {
			if l.held0() {
				s.changes.WithLabelValues(s.kind, "lost").Inc()
				s.log.Warn().Int("partition", p).Str("lease", s.kind).Msg("lease lapsed without renewal")
				l.Lost()
			}
			continue
		}
		if !l.RenewDue() {
			held++
			continue
		}
		sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
		ok, err := l.Renew(sctx)
		cancel()
		if err != nil {
			return err
		}
		if !ok {
			s.changes.WithLabelValues(s.kind, "lost").Inc()
			s.log.Warn().Int("partition", p).Str("lease", s.kind).Msg("lease lost: another owner holds it")
			continue
		}
		held++
	}
	// Above the fair share: hand partitions over, highest first.
	for p := inventory.Partitions - 1; p >= 0 && held > share; p-- {
		l := s.leases[p]
		if !l.Held() {
			continue
		}
		sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
		err := l.Release(sctx)
		cancel()
		if err != nil {
			return err
		}
		held--
		s.cooldown[p] = now.Add(3 * s.opts.LeaseCheck)
		s.changes.WithLabelValues(s.kind, "released").Inc()
		s.log.Debug().Int("partition", p).Str("lease", s.kind).Int("share", share).Msg("lease handed over to balance the work")
	}
	for p, l := range s.leases {
		if l.Held() || now.Before(s.cooldown[p]) {
			continue
		}
		sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
		ok, err := l.Acquire(sctx)
		cancel()
		if err != nil {
			return err
		}
		if ok {
			held++
			s.changes.WithLabelValues(s.kind, "acquired").Inc()
			s.log.Debug().Int("partition", p).Str("lease", s.kind).Msg("lease acquired")
		}
	}
	s.held.Set(float64(held))
	s.heldNow.Signal(held)
	return nil
}

// releaseAll gives every lease of this owner up, on a clean stop, so other
// processes take the partitions over at once instead of after a TTL. The
// membership goes too.
//
// It asks for every partition, not only those the handles count as held: a
// handle can say "not held" while Redis still has the lease as this owner's,
// when the stop canceled a release (a hand-over to balance the work) or an
// acquire in flight, or when the lease's local validity ran out before a
// renewal. The release script deletes only this owner's lease. Once a
// release has failed (Redis does not answer, and each ask waits out its
// timeout), only the leases the handles hold are still asked for: the others
// are left to lapse rather than hold the stop sixteen times as long.
func (s *leaseSet) releaseAll(ctx context.Context) {
	failed := false
	for p, l := range s.leases {
		held := l.held0()
		if failed && !held {
			continue
		}
		sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
		if err := l.Release(sctx); err != nil {
			failed = true
			s.log.Warn().Err(err).Int("partition", p).Str("lease", s.kind).Msg("could not release lease; it expires on its own")
		} else if held {
			s.changes.WithLabelValues(s.kind, "released").Inc()
		}
		cancel()
	}
	sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
	s.rdb.ZRem(sctx, s.keys.members(s.kind), s.opts.Owner)
	cancel()
	s.held.Set(0)
}

// keepHeld renews the leases held now, every LeaseCheck, until ctx ends,
// and takes no new ones: it keeps a stopping worker's last work (the
// flusher's final drain) under its leases once the keeper loop has stopped.
// A lease whose renewal fails is left to lapse, and then counts as not held.
func (s *leaseSet) keepHeld(ctx context.Context) {
	t := time.NewTicker(s.opts.LeaseCheck)
	defer t.Stop()
	for {
		for p, l := range s.leases {
			// RenewDue, not Held: a lease whose local validity ran out
			// while this process was starved is still renewed when Redis
			// still has it as this owner's (the script checks), so the drain
			// does not lose it to a slow tick.
			if !l.RenewDue() {
				continue
			}
			sctx, cancel := stepContext(ctx, s.opts.StepTimeout)
			ok, err := l.Renew(sctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.log.Warn().Err(err).Int("partition", p).Str("lease", s.kind).Msg("could not renew a lease while stopping; it lapses")
			} else if err == nil && !ok {
				s.changes.WithLabelValues(s.kind, "lost").Inc()
				s.log.Warn().Int("partition", p).Str("lease", s.kind).Msg("lease lost while stopping: another owner holds it")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// everyTick keeps the set's leases and, every interval, calls step for each
// partition it owns, until ctx ends or the keeper fails. It is the loop of
// every worker that shares its work by partition. A step that fails is
// logged and counted, and its partition is left alone for a doubling backoff
// (MinRestartBackoff to MaxRestartBackoff); the other partitions go on at
// every tick, and the loop keeps running.
func (s *leaseSet) everyTick(ctx context.Context, interval time.Duration, step func(ctx context.Context, p int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.run(ctx) })
	g.Go(func() error {
		t := time.NewTicker(interval)
		defer t.Stop()
		var failing [inventory.Partitions]partitionBackoff
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			for _, p := range s.Owned() {
				if !failing[p].due() {
					continue
				}
				err := step(ctx, p)
				if ctx.Err() != nil {
					return nil
				}
				s.settle(p, &failing[p], err)
			}
		}
	})
	return g.Wait()
}

// settle logs a partition's failure and backs it off, or notes its recovery.
func (s *leaseSet) settle(p int, b *partitionBackoff, err error) {
	if err == nil {
		if b.failures > 0 {
			s.log.Info().Int("partition", p).Str("lease", s.kind).Int("failures", b.failures).Msg("partition works again")
		}
		*b = partitionBackoff{}
		return
	}
	delay := b.fail(s.opts)
	s.failures.Inc()
	s.log.Error().Err(err).Int("partition", p).Str("lease", s.kind).Int("failures", b.failures).Dur("backoff", delay).
		Msg("a partition's step failed; it is retried after a backoff, the other partitions go on")
}

// partitionBackoff spaces the retries of one failing partition.
type partitionBackoff struct {
	failures int
	retryAt  time.Time
}

func (b *partitionBackoff) due() bool { return !time.Now().Before(b.retryAt) }

// fail records a failure and returns the wait before the next try.
func (b *partitionBackoff) fail(o Options) time.Duration {
	d := backoff(o.MinRestartBackoff, o.MaxRestartBackoff, b.failures)
	b.failures++
	b.retryAt = time.Now().Add(d)
	return d
}
