package graphql

import (
	"context"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/dropline/dropline/auth"
	"github.com/dropline/dropline/internal/clientaddr"
)

// costBudgets are the callers' budgets of cost points, one per signed-in
// principal and one per client address (IPv6 by /64) for anonymous
// requests: each holds up to burst points and gets rate points back per
// second (a token bucket, kept as the time at which it is full again). An
// operation spends its price before it runs and gets back what it did not
// use once it has run, as Shopify's API does.
//
// They live in the process, not in Redis beside the mutation limit: what
// they protect is the process itself (its memory and CPU, which one priced
// query used to exhaust), spending costs no round trip on any operation's
// path (a reserve included), and they keep working when Redis does not.
// Each instance keeps its own, so behind a load balancer that spreads one
// client over N instances the client has N budgets. A budget is kept only
// while it is not full, so what they hold is bounded by the clients seen
// in the last burst/rate seconds.
type costBudgets struct {
	rate  float64 // points per second
	burst float64
	now   func() time.Time
	// policy is the RateLimit-Policy header's value, the same for every
	// response (never changed once made).
	policy []string

	mu    sync.Mutex
	full  map[budgetKey]time.Time // when each budget is full again; absent: full
	swept time.Time
}

// budgetKey names a budget: a principal's, or a client address' (by
// clientaddr.Key, as every per-address limit counts it: an IPv6 address by
// its /64).
type budgetKey struct {
	principal string
	addr      string
}

// budgetKeyOf names the caller's budget: its principal's when it signed
// in, its address' otherwise.
func budgetKeyOf(ctx context.Context) budgetKey {
	if p, ok := auth.PrincipalFrom(ctx); ok {
		return budgetKey{principal: p.ID}
	}
	return budgetKey{addr: clientaddr.KeyFrom(ctx)}
}

// budgetState is what a caller's budget holds, as told to the client.
type budgetState struct {
	// Available is the points the budget holds now.
	Available float64
	// UntilFull is how long until it holds burst points again.
	UntilFull time.Duration
	// RetryAfter, for a refused operation, is how long until the budget
	// holds its price.
	RetryAfter time.Duration
}

func newCostBudgets(rate, burst int, now func() time.Time) *costBudgets {
	// The policy (draft-ietf-httpapi-ratelimit-headers): burst points,
	// restored over burst/rate seconds.
	w := int(math.Ceil(float64(burst) / float64(rate)))
	policy := `"cost";q=` + strconv.Itoa(burst) + ";w=" + strconv.Itoa(w)
	return &costBudgets{rate: float64(rate), burst: float64(burst), now: now, policy: []string{policy},
		full: map[budgetKey]time.Time{}}
}

// rateLimit is the RateLimit header's value for a budget that holds st:
// the points left, and the seconds until it is full.
func (b *costBudgets) rateLimit(st budgetState) string {
	buf := make([]byte, 0, 40)
	buf = strconv.AppendInt(append(buf, `"cost";r=`...), int64(st.Available), 10)
	buf = strconv.AppendInt(append(buf, ";t="...), int64(math.Ceil(st.UntilFull.Seconds())), 10)
	return string(buf)
}

// spend takes cost points from key's budget when it holds them; ok is
// false, and nothing is taken, when it does not.
func (b *costBudgets) spend(key budgetKey, cost int) (ok bool, st budgetState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.sweep(now)
	full := b.full[key]
	if full.Before(now) {
		full = now
	}
	need := b.seconds(float64(cost))
	if full.Add(need).Sub(now) > b.seconds(b.burst) {
		st = b.state(now, full)
		st.RetryAfter = full.Add(need).Sub(now) - b.seconds(b.burst)
		return false, st
	}
	full = full.Add(need)
	b.full[key] = full
	return true, b.state(now, full)
}

// refund gives points back to key's budget, up to full.
func (b *costBudgets) refund(key budgetKey, points int) budgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	full, ok := b.full[key]
	if !ok {
		return b.state(now, now)
	}
	full = full.Add(-b.seconds(float64(points)))
	if !full.After(now) {
		delete(b.full, key)
		full = now
	} else {
		b.full[key] = full
	}
	return b.state(now, full)
}

// peek reports key's budget without spending.
func (b *costBudgets) peek(key budgetKey) budgetState {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	full := b.full[key]
	if full.Before(now) {
		full = now
	}
	return b.state(now, full)
}

func (b *costBudgets) state(now, full time.Time) budgetState {
	until := full.Sub(now)
	return budgetState{Available: math.Max(0, b.burst-until.Seconds()*b.rate), UntilFull: until}
}

// seconds is how long the budget takes to get points back.
func (b *costBudgets) seconds(points float64) time.Duration {
	return time.Duration(points / b.rate * float64(time.Second))
}

// sweep forgets the budgets that are full again, once per time it takes an
// empty one to fill: a forgotten budget is a full one.
func (b *costBudgets) sweep(now time.Time) {
	if now.Sub(b.swept) < b.seconds(b.burst) {
		return
	}
	b.swept = now
	for k, full := range b.full {
		if !full.After(now) {
			delete(b.full, k)
		}
	}
}
