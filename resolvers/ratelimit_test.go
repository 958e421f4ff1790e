package resolvers_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server/graphql"
)

// scriptRuns counts the scripts a client sends to Redis (EVALSHA, EVAL and
// FCALL: reserve.lua runs as a function),
// alone or in pipelines.
type scriptRuns struct{ n *atomic.Int64 }

func (scriptRuns) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c scriptRuns) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c scriptRuns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c scriptRuns) count(cmd redis.Cmder) {
	if n := cmd.Name(); n == "evalsha" || n == "eval" || n == "fcall" {
		c.n.Add(1)
	}
}

// With the mutation rate limit on, a reserve is one script run in Redis:
// its principal's budget is spent by the run of reserve.lua that decides
// it, not by a script of its own first. The budget is the one every other
// mutation spends (TestRateLimitedMutations).
func TestReserveIsOneScriptRun(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) {
		c.Limits.MutationRate, c.Limits.MutationPeriod, c.Limits.MutationBurst = 1, time.Minute, 3
	})
	e.CreateProduct(t, map[string]any{"sku": "ONE", "stock": 100})
	alice := e.Token(t, "alice", false)
	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "ONE", "quantity": 1}).UserErrors, "the first reserve loads what it needs")

	runs := &atomic.Int64{}
	e.Redis.AddHook(scriptRuns{n: runs})
	require.Empty(t, e.Reserve(t, alice, map[string]any{"sku": "ONE", "quantity": 1}).UserErrors)
	require.EqualValues(t, 1, runs.Load(), "script runs for one reserve")
	cancelled := e.Cancel(t, alice, "r00.not-a-token")
	require.NotEmpty(t, cancelled.UserErrors)
	require.NotEqual(t, "RATE_LIMITED", cancelled.UserErrors[0].Code, "the third unit")
	only(t, e.Reserve(t, alice, map[string]any{"sku": "ONE", "quantity": 1}), "RATE_LIMITED")
	require.Equal(t, 2, e.Truth(t, "ONE").Held)
}

// A cart spends its principal's budget one unit per line, since what it
// leaves in Redis grows with its lines: a burst of 20-line carts makes no
// more holds than the burst allows (it made one cart's worth per unit, 420
// holds from 21 carts, when a cart counted as one mutation), and the
// largest cart fits the burst whole.
func TestCartSpendsTheBudgetPerLine(t *testing.T) {
	t.Parallel()
	const burst = 50
	e := setup(t, func(c *graphql.Config) {
		// A minute per unit: nothing is refilled while the test runs.
		c.Limits.MutationRate, c.Limits.MutationPeriod, c.Limits.MutationBurst = 1, time.Minute, burst
		// The mutation budget alone: 21 carts at once would spend the
		// cost budget (their price is 1558 each) before it.
		c.Limits.CostRate = -1
	})
	var skus []string
	for i := range 50 {
		sku := fmt.Sprintf("BUDGET-%02d", i)
		skus = append(skus, sku)
		e.CreateProduct(t, map[string]any{"sku": sku, "stock": 100})
	}
	cart := func(authz string, n int) cartPayload {
		lines := make([]any, n)
		for i := range lines {
			lines[i] = map[string]any{"sku": skus[i%len(skus)], "quantity": 1}
		}
		var out struct{ ReserveCart cartPayload }
		e.MustDo(t, authz, reserveCartDoc, map[string]any{"i": map[string]any{"lines": lines}}, &out)
		return out.ReserveCart
	}
	held := func() int {
		n := 0
		for _, sku := range skus {
			n += e.Truth(t, sku).Held
		}
		return n
	}

	// 21 concurrent carts of 20 lines from one buyer.
	alice := e.Token(t, "alice", false)
	answers := make([]cartPayload, 21)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = cart(alice, 20) })
	}
	wg.Wait()
	carts, limited := 0, 0
	for _, a := range answers {
		switch {
		case a.Cart != nil:
			carts++
		case len(a.UserErrors) == 1 && a.UserErrors[0].Code == "RATE_LIMITED":
			limited++
		default:
			t.Fatalf("unexpected answer %+v", a)
		}
	}
	require.Equal(t, burst/20, carts, "as many 20-line carts as the burst pays for")
	require.Equal(t, 21-burst/20, limited)
	require.Equal(t, 20*carts, held(), "holds made by the burst")
	require.LessOrEqual(t, held(), burst)

	// The largest cart fits a full budget, and spends all of it.
	bob := e.Token(t, "bob", false)
	big := cart(bob, 50)
	require.Empty(t, big.UserErrors)
	require.Len(t, big.Cart.Lines, 50)
	only(t, e.Reserve(t, bob, map[string]any{"sku": skus[0], "quantity": 1}), "RATE_LIMITED")
}

// A draw entry spends the mutation budget only when it is not a fresh
// entry: each principal's first entry in a draw runs no budget script, even
// with the budget spent, and its replays and refusals spend one unit each,
// refused RATE_LIMITED once the budget is gone.
func TestDrawEntrySpendsTheBudgetWhenNotFresh(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *graphql.Config) {
		c.Limits.MutationRate, c.Limits.MutationPeriod, c.Limits.MutationBurst = 1, time.Minute, 2
	})
	closes := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, sku := range []string{"DRAW-A", "DRAW-B"} {
		e.CreateProduct(t, map[string]any{"sku": sku, "stock": 10, "draw": map[string]any{"closesAt": closes, "winnerHoldSeconds": 600}})
	}
	const doc = `mutation($i: EnterDrawInput!) { enterDraw(input: $i) { entry { status } userErrors { code } } }`
	enter := func(who, sku string, quantity int) (status, code string) {
		var out struct {
			EnterDraw struct {
				Entry      *struct{ Status string }
				UserErrors []struct{ Code string }
			}
		}
		e.MustDo(t, who, doc, map[string]any{"i": map[string]any{"sku": sku, "quantity": quantity}}, &out)
		if p := out.EnterDraw; len(p.UserErrors) > 0 {
			return "", p.UserErrors[0].Code
		}
		return out.EnterDraw.Entry.Status, ""
	}
	alice := e.Token(t, "alice", false)
	runs := &atomic.Int64{}
	e.Redis.AddHook(scriptRuns{n: runs})
	status, code := enter(alice, "DRAW-A", 1)
	require.Equal(t, "ENTERED", status, code)
	require.Zero(t, runs.Load(), "a fresh entry runs no budget script")
	_, code = enter(alice, "DRAW-A", 0)
	require.Equal(t, "INVALID_INPUT", code, "a refusal spends the first unit")
	status, _ = enter(alice, "DRAW-A", 1)
	require.Equal(t, "ENTERED", status, "a replay spends the second")
	_, code = enter(alice, "DRAW-A", 1)
	require.Equal(t, "RATE_LIMITED", code, "the third replay finds the budget spent")
	before := runs.Load()
	status, code = enter(alice, "DRAW-B", 1)
	require.Equal(t, "ENTERED", status, "a first entry in another draw is made with the budget spent: %s", code)
	require.Equal(t, before, runs.Load())
	var n int
	require.NoError(t, e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM draw_entries WHERE principal = 'alice'`).Scan(&n))
	require.Equal(t, 2, n)
}
