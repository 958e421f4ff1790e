package resolvers

import (
	"context"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// mutationLimiter is the per-principal mutation budget, a GCRA limiter in
// Redis (redis_rate), so every Dropline instance shares one budget per
// principal. redis_rate puts its own "rate:" before our key; the keys
// expire on their own once the budget is full again.
type mutationLimiter struct {
	rl     *redis_rate.Limiter
	limit  redis_rate.Limit
	prefix string
	off    bool
}

func newMutationLimiter(rdb redis.UniversalClient, prefix string, l Limits) *mutationLimiter {
	// The limiter asks Redis once per mutation, right before the mutation's
	// own script: through the client's autopipeliner, concurrent requests'
	// checks travel to Redis together, like their reserves.
	c := redis.UniversalClient(rdb)
	if ap, err := rdb.AutoPipeline(); err == nil {
		c = ap
	}
	return &mutationLimiter{
		rl:     redis_rate.NewLimiter(c),
		limit:  redis_rate.Limit{Rate: l.MutationRate, Period: l.MutationPeriod, Burst: l.MutationBurst},
		prefix: prefix + "mutations:",
		off:    l.MutationRate < 0,
	}
}

// allow spends one unit of principal's budget. When Redis cannot be asked
// the mutation goes ahead (the engine will report Redis trouble itself):
// a limiter outage must not become a full outage.
func (m *mutationLimiter) allow(ctx context.Context, principal string) (ok bool, retryAfter time.Duration) {
	if m.off {
		return true, 0
	}
	res, err := m.rl.Allow(ctx, m.prefix+principal, m.limit)
	if err != nil {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("rate limiter unavailable; allowing the mutation")
		return true, 0
	}
	return res.Allowed > 0, res.RetryAfter
}
