package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/internal/testenv"
)

// scale returns short in CI and long with -faults.long.
func scale(short, longer int) int {
	if *long {
		return longer
	}
	return short
}

// FLUSHALL in the middle of a drop: the engine and the rebuilder reload the
// SKU from Postgres (G7); holds whose reserve had not reached Postgres are
// lost (an edge docs/design.md states), commits are not (G2), and nothing is oversold (G1).
func TestFlushAllMidDrop(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.start("a")
	d := startDrop(s, dropConfig{SKU: "FLUSH-1", Buyers: scale(150, 600), Pace: 20 * time.Millisecond, DoubleCommit: 0.2})
	flushes := scale(1, 4)
	for i := 1; i <= flushes; i++ {
		d.waitProgress(t, d.cfg.Buyers*i/(flushes+1))
		require.NoError(t, s.RDB.FlushAll(context.Background()).Err())
	}
	d.wait(t)
	d.verify(t, verifyOpts{RedisLost: true})
	d.figures(t, "flushall", flushes, "")
}

// The private Redis is killed and started again, empty, mid-drop.
func TestRedisRestartedEmptyMidDrop(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.start("a")
	d := startDrop(s, dropConfig{SKU: "RESTART-1", Buyers: scale(150, 600), Pace: 20 * time.Millisecond})
	restarts := scale(1, 3)
	for i := 1; i <= restarts; i++ {
		d.waitProgress(t, d.cfg.Buyers*i/(restarts+1))
		s.Redis.Stop()
		time.Sleep(300 * time.Millisecond) // the outage itself, not a wait for a condition
		require.NoError(t, s.Redis.Start())
	}
	d.wait(t)
	d.verify(t, verifyOpts{RedisLost: true})
	d.figures(t, "redis-restart", restarts, "")
}

// SCRIPT FLUSH every 200 ms under load: every script call may hit NOSCRIPT
// and must reload and run exactly once.
func TestScriptFlushUnderLoad(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	s.start("a")
	d := startDrop(s, dropConfig{SKU: "NOSCRIPT-1", Buyers: scale(200, 1000), Pace: 10 * time.Millisecond, DoubleCommit: 0.2})
	flushes := 0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-d.done:
			break loop
		case <-tick.C:
			require.NoError(t, s.RDB.ScriptFlush(context.Background()).Err())
			flushes++
		}
	}
	d.wait(t)
	d.verify(t, verifyOpts{})
	d.figures(t, "script-flush", flushes, "")
}

// Postgres unreachable for several seconds mid-drop, through a proxy that
// is cut and restored: reserves and cancels go on, commits answer
// UNAVAILABLE and keep their holds, the write-behind catches up (G6).
func TestPostgresCutMidDrop(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	pg := testenv.NewProxy(t, s.PostgresVia)
	s.PostgresVia = pg.Addr
	s.start("a")
	d := startDrop(s, dropConfig{SKU: "PGCUT-1", Buyers: scale(150, 500), Pace: 20 * time.Millisecond, HoldSeconds: 20})
	cuts := scale(1, 3)
	outage := time.Duration(scale(4, 8)) * time.Second
	for i := 1; i <= cuts; i++ {
		d.waitProgress(t, d.cfg.Buyers*i/(cuts+2))
		pg.Cut()
		time.Sleep(outage) // the outage itself
		pg.Restore()
	}
	d.wait(t)
	d.verify(t, verifyOpts{})
	d.figures(t, "postgres-cut", cuts, fmt.Sprintf("outage=%s connections_cut=%d", outage, pg.Cuts.Load()))
}

// A `dropline serve` killed with SIGKILL mid-drop and started again: the
// dead consumer's pending events are claimed (XAUTOCLAIM), half-done
// commits are reconciled, nothing is lost or doubled.
func TestServerKilledAndRestarted(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	d := startDrop(s, dropConfig{SKU: "KILL-1", Buyers: scale(150, 500), Pace: 20 * time.Millisecond, DoubleCommit: 0.2})
	kills := scale(1, 3)
	for i := 1; i <= kills; i++ {
		d.waitProgress(t, d.cfg.Buyers*i/(kills+1))
		a.kill(t)
		a = s.start(fmt.Sprintf("a%d", i))
	}
	d.wait(t)
	d.verify(t, verifyOpts{})
	d.figures(t, "sigkill-restart", kills, "")
}

// Two instances; one is SIGKILLed mid-drop while the other goes on and
// takes over its partitions once its leases expire.
func TestTwoInstancesOneKilled(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	s.start("b")
	d := startDrop(s, dropConfig{SKU: "KILL-2", Buyers: scale(150, 500), Pace: 20 * time.Millisecond, DoubleCommit: 0.2})
	d.waitProgress(t, d.cfg.Buyers/3)
	a.kill(t)
	d.wait(t)
	d.verify(t, verifyOpts{})
	d.figures(t, "two-instances-one-killed", 1, "")
}

// Lost replies: a proxy between Dropline and Redis delivers every command
// but loses some answers and closes the connection, so go-redis retries
// commands Redis already ran. No double hold, no double commit.
func TestLostRedisReplies(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	rp := testenv.NewProxy(t, s.Redis.Addr)
	s.RedisVia = rp.Addr
	a := s.start("a")
	s.start("b")
	rp.LoseReplies(int64(scale(30, 50))) // per mille of reply chunks
	d := startDrop(s, dropConfig{SKU: "LOSTREPLY-1", Buyers: scale(200, 800), Pace: 10 * time.Millisecond, DoubleCommit: 0.3})
	d.wait(t)
	rp.LoseReplies(0)
	d.verify(t, verifyOpts{})
	d.figures(t, "lost-replies", int(rp.Dropped.Load()), "")
	_ = a
}

// A server paused (SIGSTOP) for longer than its leases (10 s, not
// configurable from the environment) while another goes on, then resumed.
// Its stale writes must not land: the leases it believed it held are
// taken, and Postgres fences its flusher's batches (the fence itself is
// shown in-process in TestFencedWriterAfterPause, with a short lease).
func TestServerPausedPastLease(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	s.start("b")
	pause := time.Duration(scale(12, 20)) * time.Second
	// The drop's usual bound, and the pause: calls sent to a wait it out.
	d := startDrop(s, dropConfig{SKU: "PAUSE-1", Buyers: scale(150, 400), Pace: 40 * time.Millisecond, HoldSeconds: 2,
		Within: 40*time.Second + pause})
	d.waitProgress(t, d.cfg.Buyers/4)
	a.signal(syscall.SIGSTOP)
	time.Sleep(pause) // the pause is the fault
	a.signal(syscall.SIGCONT)
	d.wait(t)
	d.verify(t, verifyOpts{})
	fenced := strings.Count(a.log.String(), "fenced")
	d.figures(t, "sigstop-past-lease", 1, fmt.Sprintf("pause=%s fenced_log_lines=%d", pause, fenced))
}

// Commit racing expiry and cancel, many times, across two instances: each
// hold lasts one second; at its expiry (give or take 60 ms) its holder
// commits through one instance and cancels through the other while the
// sweepers of both release due holds. Exactly one of sale, cancel and
// expiry wins each hold, and the ledger records exactly one ending.
func TestCommitRacesExpiryAndCancel(t *testing.T) {
	t.Parallel()
	s := newSystem(t)
	a := s.start("a")
	b := s.start("b")
	rounds := scale(80, 400)
	d := startDrop(s, dropConfig{SKU: "RACE-1", Total: rounds, Buyers: -1, HoldSeconds: 1})
	d.wait(t)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	var wins [3]atomic.Int64 // commit, cancel, expiry
	var wg sync.WaitGroup
	sem := make(chan struct{}, 20)
	for i := 0; i < rounds; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			user := fmt.Sprintf("racer-%04d", i)
			bearer, err := s.Issuer.Mint(user, false, time.Hour)
			if err != nil {
				panic(err)
			}
			res := d.call(ctx, client, bearer, "reserve", reserveMutation, map[string]any{"input": map[string]any{
				"sku": "RACE-1", "quantity": 1, "idempotencyKey": "race-" + user, "holdSeconds": 1}})
			if !res.OK || res.Code != "" {
				t.Errorf("round %d: reserve refused: %+v", i, res)
				return
			}
			d.mu.Lock()
			d.holds[res.Token] = holdInfo{Buyer: user, Qty: 1}
			d.mu.Unlock()
			exp, err := time.Parse(time.RFC3339Nano, res.Exp)
			if err != nil {
				t.Errorf("round %d: expiresAt %q: %v", i, res.Exp, err)
				return
			}
			time.Sleep(time.Until(exp.Add(time.Duration(rand.IntN(121)-60) * time.Millisecond))) // aim at the expiry: the race is the point
			var c, x outcome
			var race sync.WaitGroup
			race.Add(2)
			go func() {
				defer race.Done()
				c = d.callOn(ctx, client, a, bearer, "commit", commitMutation, map[string]any{"token": res.Token})
			}()
			go func() {
				defer race.Done()
				x = d.callOn(ctx, client, b, bearer, "cancel", cancelMutation, map[string]any{"token": res.Token})
			}()
			race.Wait()
			d.settle(res.Token, c, "COMMITTED", d.committed)
			d.settle(res.Token, x, "CANCELLED", d.cancelled)
			cancelled := x.Code == "" && x.Status == "CANCELLED"
			if x.Code == "" && x.Status == "EXPIRED" {
				x.Code = "EXPIRED" // a cancel after expiresAt reports the expiry
			}
			switch {
			case c.Code == "" && cancelled:
				t.Errorf("round %d: commit and cancel both succeeded: %+v %+v", i, c, x)
			case c.Code == "":
				wins[0].Add(1)
				if x.Code != "ALREADY_COMMITTED" {
					t.Errorf("round %d: cancel after a sale answered %q", i, x.Code)
				}
			case cancelled:
				wins[1].Add(1)
				if c.Code != "ALREADY_CANCELLED" {
					t.Errorf("round %d: commit after a cancel answered %q", i, c.Code)
				}
			default:
				wins[2].Add(1)
				if c.Code != "EXPIRED" || x.Code != "EXPIRED" {
					t.Errorf("round %d: neither won but answers were %q / %q", i, c.Code, x.Code)
				}
			}
		}()
	}
	wg.Wait()
	d.verify(t, verifyOpts{})
	require.Equal(t, rounds, s.scalar(`SELECT count(*)::int FROM stock_movements WHERE sku = 'RACE-1' AND kind IN ('commit', 'cancel', 'expire')`),
		"every hold has exactly one ending in the ledger")
	require.Equal(t, int(wins[2].Load()), s.scalar(`SELECT count(*)::int FROM stock_movements WHERE sku = 'RACE-1' AND kind = 'expire'`))
	d.figures(t, "commit-vs-expiry-vs-cancel", rounds, fmt.Sprintf("commit_won=%d cancel_won=%d expiry_won=%d",
		wins[0].Load(), wins[1].Load(), wins[2].Load()))
}
