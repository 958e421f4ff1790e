package inventory

import (
	"sync"
	"time"
)

// SoldOutMemory is what a process knows, without asking Redis, of SKUs that
// are sold out: no unit available and none held (so none can come back by a
// cancel or an expiry). Package live's hub is one: it watches each such SKU's
// announcements and re-reads it on a short period. With one set
// (Engine.RememberSoldOut), a reserve of such a SKU is answered OUT_OF_STOCK
// from memory, without a script run, when nothing else could have answered it
// differently: the request carries no idempotency key (whose first refusal
// Redis must record for replay, and whose earlier hold must be replayed) and
// the memory vouches for the SKU's policy (sold first come, no per-person
// limit, no drop, its window open).
type SoldOutMemory interface {
	// SoldOut reports whether sku is known, now, to have nothing available
	// and nothing held, and a policy under which any buyer asking for it
	// would be answered OUT_OF_STOCK.
	SoldOut(sku string) bool
	// Refused says that Redis just answered OUT_OF_STOCK for sku: a SKU worth
	// watching.
	Refused(sku string)
	// Adding says that units of sku may be added (a restock, a product
	// update, a rebuild) by this process: SoldOut answers false from now on,
	// until done is called and the SKU has been read again after it.
	Adding(sku string) (done func())
}

// RememberSoldOut makes the engine answer reserves of SKUs m knows are sold
// out without asking Redis (see SoldOutMemory), and tell m what it learns.
// Set it before serving; nil turns it off.
func (e *Engine) RememberSoldOut(m SoldOutMemory) {
	if m == nil {
		e.soldOut.Store(nil)
		return
	}
	e.soldOut.Store(&m)
}

func (e *Engine) soldOutMemory() SoldOutMemory {
	if m := e.soldOut.Load(); m != nil {
		return *m
	}
	return nil
}

// adding tells the memory, if any, that units of sku may be added; the
// returned func says it is over.
func (e *Engine) adding(sku string) func() {
	if m := e.soldOutMemory(); m != nil {
		return m.Adding(sku)
	}
	return func() {}
}

// localBudgets spends the budgets of reserves answered from memory, which
// reach no script: a GCRA per budget key with the budget's own parameters,
// kept in this process. A principal asking for a sold-out SKU faster than
// its budget allows is answered RATE_LIMITED, as Redis would answer it.
// The state of a key is its theoretical arrival time; a key whose time has
// passed is as good as new and is forgotten when the table is full.
type localBudgets struct {
	mu  sync.Mutex
	tat map[string]time.Time
}

// maxLocalBudgets bounds localBudgets' table; past it (after forgetting
// every spent-out key), a reserve goes to Redis as if nothing were known.
const maxLocalBudgets = 1 << 17

// spend spends one unit of l at now. ok is false when the table is full (the
// caller asks Redis instead); otherwise err is nil or *RateLimitedError.
func (b *localBudgets) spend(l RateLimit, now time.Time) (ok bool, err error) {
	if l.Rate <= 0 || l.Period <= 0 || l.Burst <= 0 {
		return true, nil
	}
	step := l.Period / time.Duration(l.Rate)
	tolerance := step * time.Duration(l.Burst)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tat == nil {
		b.tat = map[string]time.Time{}
	}
	tat, known := b.tat[l.Key]
	if !known && len(b.tat) >= maxLocalBudgets {
		for k, t := range b.tat {
			if !t.After(now) {
				delete(b.tat, k)
			}
		}
		if len(b.tat) >= maxLocalBudgets {
			return false, nil
		}
	}
	if tat.Before(now) {
		tat = now
	}
	next := tat.Add(step)
	if wait := next.Sub(now) - tolerance; wait > 0 {
		return true, &RateLimitedError{RetryAfter: wait}
	}
	b.tat[l.Key] = next
	return true, nil
}

// reserveFromMemory answers a checked reserve from the sold-out memory when
// it can: answered is false when Redis must decide.
func (e *Engine) reserveFromMemory(req ReserveRequest, now time.Time) (answered bool, err error) {
	if req.IdempotencyKey != "" {
		return false, nil
	}
	m := e.soldOutMemory()
	if m == nil || !m.SoldOut(req.SKU) {
		return false, nil
	}
	if req.RateLimit != nil {
		ok, err := e.budgets.spend(*req.RateLimit, now)
		if !ok {
			return false, nil
		}
		if err != nil {
			return true, err
		}
	}
	e.metrics.soldOutFromMemory.Inc()
	return true, &OutOfStockError{Available: 0}
}

// KnownSoldOut reports whether the sold-out memory, if one is set, vouches
// now that sku is sold out (SoldOutMemory.SoldOut): a hint for a caller
// deciding whether to try ReserveFromMemory. It spends nothing.
func (e *Engine) KnownSoldOut(sku string) bool {
	m := e.soldOutMemory()
	return m != nil && m.SoldOut(sku)
}

// ReserveFromMemory is Reserve for a request the sold-out memory answers
// alone, with Reserve's checks, budget and metrics: its error is what
// Reserve would return (*OutOfStockError, or *RateLimitedError when the
// caller's budget is spent). answered is false when the memory cannot
// answer (an invalid request, an idempotency key, a SKU it does not vouch
// for): then nothing was spent or counted, and Reserve must decide.
func (e *Engine) ReserveFromMemory(p Principal, req ReserveRequest) (answered bool, err error) {
	began := time.Now()
	if _, cerr := e.checkReserve(p, req); cerr != nil {
		return false, nil
	}
	if answered, err = e.reserveFromMemory(req, began); !answered {
		return false, nil
	}
	e.metrics.reserveOutcome(err)
	e.metrics.reserveDur.Observe(time.Since(began).Seconds())
	return true, err
}
