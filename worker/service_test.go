package worker

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/inventory"
)

// A loop that panics, then fails, is restarted each time with a backoff, and
// Stop still stops it and waits.
func TestServiceRestartsAFailedLoop(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var runs atomic.Int32
	steady := make(chan struct{})
	s := newService("flaky", Options{MinRestartBackoff: 10 * time.Millisecond, MaxRestartBackoff: 20 * time.Millisecond},
		zerolog.New(zerolog.NewTestWriter(t)), reg, nil, func(ctx context.Context) error {
			switch runs.Add(1) {
			case 1:
				panic("boom")
			case 2:
				return errors.New("redis went away")
			case 3:
				return nil // returning without being stopped is a failure too
			}
			close(steady)
			<-ctx.Done()
			return nil
		})
	require.NoError(t, s.Start(context.Background()))
	require.NoError(t, s.Start(context.Background()), "starting a started worker does nothing")
	select {
	case <-steady:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop was not restarted")
	}
	require.Equal(t, 3.0, metric(t, reg, "dropline_worker_restarts_total"))
	stop(t, s)
	stop(t, s)
	require.Equal(t, int32(4), runs.Load())
}

func TestBackoffDoublesUpToTheCap(t *testing.T) {
	t.Parallel()
	require.InDelta(t, float64(100*time.Millisecond), float64(backoff(100*time.Millisecond, time.Second, 0)), float64(21*time.Millisecond))
	require.InDelta(t, float64(400*time.Millisecond), float64(backoff(100*time.Millisecond, time.Second, 2)), float64(81*time.Millisecond))
	require.LessOrEqual(t, backoff(100*time.Millisecond, time.Second, 50), time.Second)
}

// A clean stop releases every lease Redis still has as this owner's, also
// those its handles no longer count as held: a hand-over (a release to
// balance the work) that the stop canceled in flight, and a lease whose local
// validity ran out before its renewal (the keeper marks it lost, and Redis
// keeps it until its TTL). They would otherwise stay taken for a TTL after
// the stop.
func TestCleanStopReleasesLeasesItsHandlesGaveUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := newKeys(b.engine.Keys())
	opts := fastConfig("stopping").Options
	opts.LeaseTTL = time.Minute // nothing lapses on its own while the test looks
	opts.setDefaults()
	s := newLeaseSet("reconciler", k, b.rdb, opts, b.log, prometheus.NewRegistry())
	require.NoError(t, s.check(b.ctx))
	require.Len(t, s.Owned(), inventory.Partitions)

	canceled, cancel := context.WithCancel(b.ctx)
	cancel()
	require.Error(t, s.leases[3].Release(canceled), "the stop cancels a hand-over in flight")
	s.leases[5].Lost() // as the keeper does when a lease's local validity ran out
	for _, p := range []int{3, 5} {
		owner, err := b.rdb.Get(b.ctx, k.lease(p, "reconciler")).Result()
		require.NoError(t, err)
		require.Equal(t, "stopping", owner, "partition %d is still this owner's in Redis", p)
	}

	s.releaseAll(b.ctx)
	for p := range inventory.Partitions {
		n, err := b.rdb.Exists(b.ctx, k.lease(p, "reconciler")).Result()
		require.NoError(t, err)
		require.Zero(t, n, "partition %d's lease outlived the clean stop", p)
	}
}

// A clean stop while Redis does not answer asks it for the leases its
// handles no longer count as held only until one ask has failed: each ask
// waits out a StepTimeout, so asking for all sixteen partitions of each
// worker would hold the stop for minutes (sixteen times five seconds)
// where leaving a lease it does not hold costs nothing.
func TestCleanStopAsksAnUnreachableRedisOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A Redis that takes connections and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, ReadTimeout: 50 * time.Millisecond})
	t.Cleanup(func() {
		_ = rdb.Close()
		_ = ln.Close()
		<-accepted
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	var asks atomic.Int64
	rdb.AddHook(scriptCounter{n: &asks})

	opts := fastConfig("unreachable").Options
	opts.StepTimeout = 50 * time.Millisecond
	opts.setDefaults()
	s := newLeaseSet("reconciler", newKeys(b.engine.Keys()), rdb, opts, b.log, prometheus.NewRegistry())
	s.releaseAll(b.ctx)
	require.EqualValues(t, 1, asks.Load(), "lease releases sent to a Redis that does not answer")
}

// scriptCounter counts the scripts a client sends (EVALSHA and EVAL).
type scriptCounter struct{ n *atomic.Int64 }

func (scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A stopped worker's loop releases the partition leases it took, so another
// process takes over at once; a worker whose context ends without a stop
// (a crash) leaves them to lapse.
func TestLeasesAreReleasedOnAStopAndKeptOnACrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	k := newKeys(b.engine.Keys())
	leaseKeys := func() int {
		n := 0
		for p := range inventory.Partitions {
			owner, err := b.rdb.Get(b.ctx, k.lease(p, "reconciler")).Result()
			if err == nil && owner != "" {
				n++
			}
		}
		return n
	}
	start := func(ctx context.Context, owner string) *CommitReconciler {
		opts := fastConfig(owner).Options
		opts.LeaseTTL = time.Minute // nothing here may lapse while the test looks, however slow the machine
		w := NewCommitReconciler(CommitReconcilerConfig{Options: opts}, b.engine.Maintenance(), b.rdb, b.log, prometheus.NewRegistry())
		w.leases.heldNow.Init()
		require.NoError(t, w.Start(ctx))
		waitHeld(t, w.leases, inventory.Partitions, owner+" owns every partition")
		return w
	}

	crashCtx, crash := context.WithCancelCause(b.ctx)
	crashed := start(crashCtx, "crashed")
	crash(errCrashed)
	stop(t, crashed)
	require.Equal(t, inventory.Partitions, leaseKeys(), "a crashed loop releases nothing")
	for p := range inventory.Partitions {
		require.NoError(t, b.rdb.Del(b.ctx, k.lease(p, "reconciler")).Err())
	}

	stopped := start(b.ctx, "stopped")
	stop(t, stopped)
	require.Zero(t, leaseKeys(), "a stopped loop released every lease it took")
	members, err := b.rdb.ZRange(b.ctx, k.members("reconciler"), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"crashed"}, members, "the stopped one left the members, the crashed one lapses")
}
