package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dropline/dropline/db"
	"github.com/dropline/dropline/lua"
)

// LeaseConfig names a lease and sets its duration.
type LeaseConfig struct {
	// Key holds the owner token while the lease is held, e.g.
	// "dl:{p03}:lease:sweeper". Required.
	Key string
	// FenceKey counts acquisitions; it must share Key's hash tag. Required.
	FenceKey string
	// Owner is this holder's token; it must be unique per holder. Default: random.
	Owner string
	// TTL is how long the lease lasts without renewal; default 10 seconds.
	TTL time.Duration
}

// Lease is a Redis lease with an owner token and a fencing token. It exists
// so that several server processes can share partitioned work (sweeping,
// reconciling, flushing) with one owner per partition at a time:
//
//   - Acquire succeeds only when the key is free (SET NX PX), or when the
//     key provably cannot belong to a live owner (it has no expiry at all,
//     which no writer of this code leaves). A live owner renews every TTL/3,
//     so its key never expires; once it has expired the owner stopped
//     renewing for a whole TTL and the lease is free.
//   - Renew and Release act only when the key still holds this owner's token
//     (one Lua script each), so a holder that lost its lease cannot extend or
//     delete the new owner's.
//   - Every acquisition draws a new fencing token, greater than any before
//     it under the same name. Writers pass it to Postgres (db.Fence), which
//     refuses a write carrying an older token than one it has seen: a holder
//     that was paused past its lease cannot overwrite its successor's work.
//
// The fencing counter is floored at Redis' clock in microseconds, so tokens
// keep growing even when Redis loses the counter (flush, restart, failover):
// a plain INCR would restart at 1 and every later writer would be fenced off
// by Postgres' memory of the older, larger token. (Milliseconds are too
// coarse: Postgres accepts a token equal to the last one, and two
// acquisitions within one millisecond of a flush would share a token.) This
// assumes the clock of the Redis that replaces a lost one is not behind.
//
// Locally the lease counts as held for two thirds of TTL after the last
// successful acquire or renew began, which leaves a full renewal interval of
// margin for the step in progress before anyone else can acquire it.
type Lease struct {
	cfg LeaseConfig
	rdb redis.UniversalClient
	now func() time.Time

	mu        sync.Mutex
	token     int64
	confirmed time.Time // start of the last successful acquire or renew
	held      bool
}

// NewLease returns a lease handle; it does not touch Redis.
func NewLease(rdb redis.UniversalClient, cfg LeaseConfig) *Lease {
	if cfg.Owner == "" {
		cfg.Owner = randomHex(16)
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 10 * time.Second
	}
	return &Lease{cfg: cfg, rdb: rdb, now: time.Now}
}

// The lease's scripts (lua/lease_*.lua; their headers give KEYS and ARGV).
var (
	acquireScript = redis.NewScript(lua.MustSource(lua.LeaseAcquire))
	renewScript   = redis.NewScript(lua.MustSource(lua.LeaseRenew))
	releaseScript = redis.NewScript(lua.MustSource(lua.LeaseRelease))
)

// Acquire tries to take the lease. It returns false, nil when another live
// owner holds it.
func (l *Lease) Acquire(ctx context.Context) (bool, error) {
	start := l.now()
	res, err := acquireScript.Run(ctx, l.rdb, []string{l.cfg.Key, l.cfg.FenceKey}, l.cfg.Owner, l.cfg.TTL.Milliseconds()).Int64Slice()
	if err != nil {
		return false, fmt.Errorf("acquiring lease %s: %w", l.cfg.Key, err)
	}
	if len(res) != 2 || res[0] != 1 {
		return false, nil
	}
	l.mu.Lock()
	l.token, l.confirmed, l.held = res[1], start, true
	l.mu.Unlock()
	return true, nil
}

// Renew extends a held lease. It returns false, nil when the lease is no
// longer this owner's (it expired and was taken, or Redis lost it); the
// handle then counts as not held.
func (l *Lease) Renew(ctx context.Context) (bool, error) {
	start := l.now()
	n, err := renewScript.Run(ctx, l.rdb, []string{l.cfg.Key}, l.cfg.Owner, l.cfg.TTL.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("renewing lease %s: %w", l.cfg.Key, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n != 1 {
		l.held = false
		return false, nil
	}
	l.confirmed = start
	return true, nil
}

// Release gives the lease up if this owner still holds it, so a successor
// need not wait for it to expire.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	l.held = false
	l.mu.Unlock()
	if err := releaseScript.Run(ctx, l.rdb, []string{l.cfg.Key}, l.cfg.Owner).Err(); err != nil {
		return fmt.Errorf("releasing lease %s: %w", l.cfg.Key, err)
	}
	return nil
}

// Held reports whether this owner may act under the lease now: it was
// acquired or renewed less than two thirds of TTL ago.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldLocked()
}

func (l *Lease) heldLocked() bool {
	return l.held && l.now().Sub(l.confirmed) < l.cfg.TTL*2/3
}

// RenewDue reports whether a third of TTL has passed since the lease was
// last confirmed, the renewal cadence.
func (l *Lease) RenewDue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held && l.now().Sub(l.confirmed) >= l.cfg.TTL/3
}

// Fence returns the fencing token of the current tenure for Postgres writes,
// and false when the lease is not held.
func (l *Lease) Fence() (db.Fence, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.heldLocked() {
		return db.Fence{}, false
	}
	return db.Fence{Name: l.cfg.Key, Token: l.token}, true
}

// Lost marks the lease as not held, after Postgres refused its fencing token:
// a newer owner exists, whatever this handle last heard.
func (l *Lease) Lost() {
	l.mu.Lock()
	l.held = false
	l.mu.Unlock()
}

// held0 reports whether the handle believes it holds the lease, however
// long ago it was confirmed.
func (l *Lease) held0() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}
