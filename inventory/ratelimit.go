package inventory

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/dropline/dropline/inventory/core"
	"github.com/dropline/dropline/inventory/script"
)

// RateLimit is one principal's mutation budget (see core.RateLimit).
type RateLimit = core.RateLimit

// rateLimited decodes the seconds to wait that a script answered.
func rateLimited(retryAfter string) error {
	f, err := strconv.ParseFloat(retryAfter, 64)
	if err != nil {
		return fmt.Errorf("rate limit: unreadable retry delay %q: %w", retryAfter, err)
	}
	return &RateLimitedError{RetryAfter: time.Duration(f * float64(time.Second))}
}

// SpendRateLimit spends one unit of a budget in its own script run
// (rate_limit.lua, through the autopipeliner): nil when the mutation may go
// ahead, *RateLimitedError when it may not. When Redis cannot be asked the
// mutation goes ahead, with a warning in the request's log: a limiter outage
// must not become a full outage (the mutation reports Redis trouble itself).
// A reserve given its budget (ReserveRequest.RateLimit) spends it itself, in
// the same run of reserve.lua when it can, and so does a cart
// (CartRequest.RateLimit), one unit per line.
func (e *Engine) SpendRateLimit(ctx context.Context, l RateLimit) error {
	return e.spendUnits(ctx, l, 1)
}

// spendUnits is SpendRateLimit of cost units at once (at most l.Burst).
func (e *Engine) spendUnits(ctx context.Context, l RateLimit, cost int) error {
	err := e.spendRateLimit(ctx, l, cost)
	if err != nil && !errors.Is(err, ErrRateLimited) {
		zerolog.Ctx(ctx).Warn().Err(err).Msg("rate limiter unavailable; allowing the mutation")
		return nil
	}
	return err
}

func (e *Engine) spendRateLimit(ctx context.Context, l RateLimit, cost int) error {
	c := script.RateLimit{Key: l.Key, Budget: l.Args(), Cost: cost}.Call(e.keys)
	out, err := e.scripts[c.Script].Run(ctx, e.hot, c.Keys, c.Argv...).Slice()
	if err != nil {
		return unavailable("running "+c.Script, err)
	}
	if len(out) == 0 {
		return fmt.Errorf("script %s returned nothing", c.Script)
	}
	res := script.RateLimitReplyOf(out)
	if res.Spent {
		return nil
	}
	if res.RetryAfter == "" {
		return fmt.Errorf("script %s answered %v", c.Script, out)
	}
	return rateLimited(res.RetryAfter)
}

// foldsRateLimit says whether reserve.lua can spend a budget in the same
// run: only a single Redis holds the budget's key next to the SKU's.
func (e *Engine) foldsRateLimit() bool {
	_, cluster := e.rdb.(*redis.ClusterClient)
	return !cluster
}
