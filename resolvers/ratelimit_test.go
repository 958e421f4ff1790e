package resolvers_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dropline/dropline/server/graphql"
)

// scriptRuns counts the scripts a client sends to Redis (EVALSHA and EVAL),
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
	if n := cmd.Name(); n == "evalsha" || n == "eval" {
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
