package resolvers

import (
	"context"
	"errors"
	"time"

	"github.com/dropline/dropline/inventory"
)

// mutationLimiter is the per-principal mutation budget, a GCRA limiter in
// Redis (inventory.RateLimit), so every Dropline instance shares one budget
// per principal. Its keys expire on their own once the budget is full again.
type mutationLimiter struct {
	engine *inventory.Engine
	limits Limits
	prefix string
	off    bool
}

func newMutationLimiter(engine *inventory.Engine, prefix string, l Limits) *mutationLimiter {
	return &mutationLimiter{
		engine: engine,
		limits: l,
		prefix: "rate:" + prefix + "budget:",
		off:    l.MutationRate < 0,
	}
}

// budget is principal's budget, or nil when the limit is off. A reserve is
// given it (inventory.ReserveRequest.RateLimit) and spends it in its own
// script run; every other mutation asks allow first.
func (m *mutationLimiter) budget(principal string) *inventory.RateLimit {
	if m.off {
		return nil
	}
	return &inventory.RateLimit{Key: m.prefix + principal, Rate: m.limits.MutationRate,
		Period: m.limits.MutationPeriod, Burst: m.limits.MutationBurst}
}

// allow spends one unit of principal's budget (inventory's SpendRateLimit:
// through the client's autopipeliner, so concurrent requests' checks travel
// together; a limiter outage lets the mutation go ahead).
func (m *mutationLimiter) allow(ctx context.Context, principal string) (ok bool, retryAfter time.Duration) {
	l := m.budget(principal)
	if l == nil {
		return true, 0
	}
	var limited *inventory.RateLimitedError
	if errors.As(m.engine.SpendRateLimit(ctx, *l), &limited) {
		return false, limited.RetryAfter
	}
	return true, 0
}
