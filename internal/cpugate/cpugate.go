// Package cpugate bounds how many requests run on the CPU at once, so that
// the few that must not wait (a commit is money) find the cores free.
//
// Go runs every runnable goroutine in turn: with two cores and two hundred
// requests in flight, a request woken by its socket, by Redis or by
// PostgreSQL waits behind all the others at every step. A Gate has a fixed
// number of slots; an ordinary request holds one while it computes and
// gives it back while it waits on the network (Pause, which the Redis hook
// and the waits of the engine call), so the requests actually on the CPU
// stay few and the rest wait parked, not runnable, in the order they came.
// A request that is exempt (Ticket.Exempt) never takes a slot: it runs
// beside at most the gate's slots of ordinary ones.
//
// A request that comes back from a wait is served before one that has not
// started: it has a slot's worth of work done and answers sooner, and the
// new requests are served as soon as the admitted ones are done or waiting.
package cpugate

import (
	"container/list"
	"context"
	"errors"
	"sync"
	"time"
)

// Gate is a bounded set of slots with two queues of waiters: those coming
// back from a wait first, then new ones, each in the order they came.
type Gate struct {
	mu      sync.Mutex
	slots   int
	inUse   int
	resumed list.List // of *waiter
	fresh   list.List // of *waiter
}

type waiter struct {
	ready   chan struct{}
	granted bool
}

// New makes a gate of slots (at least 1).
func New(slots int) *Gate { return &Gate{slots: max(slots, 1)} }

// Slots is the gate's size.
func (g *Gate) Slots() int { return g.slots }

// InUse is how many slots are held.
func (g *Gate) InUse() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inUse
}

// Waiting is how many wait for a slot (new and coming back).
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resumed.Len() + g.fresh.Len()
}

// ErrTimeout is Acquire's error when the wait was longer than allowed.
var ErrTimeout = errors.New("cpugate: waited too long for a slot")

// acquire takes a slot, waiting in q's order until ctx is done or timeout
// (nil: no bound) fires. It reports whether it had to wait.
func (g *Gate) acquire(ctx context.Context, resumed bool, timeout <-chan time.Time) (waited bool, err error) {
	g.mu.Lock()
	if g.inUse < g.slots && g.resumed.Len() == 0 && (resumed || g.fresh.Len() == 0) {
		g.inUse++
		g.mu.Unlock()
		return false, nil
	}
	w := &waiter{ready: make(chan struct{})}
	q := &g.fresh
	if resumed {
		q = &g.resumed
	}
	e := q.PushBack(w)
	g.mu.Unlock()
	select {
	case <-w.ready:
		return true, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = ErrTimeout
	}
	g.mu.Lock()
	if w.granted {
		// Handed a slot as it gave up: pass it on.
		g.releaseLocked()
	} else {
		q.Remove(e)
	}
	g.mu.Unlock()
	return true, err
}

// release gives a slot back, to the first waiter if there is one.
func (g *Gate) release() {
	g.mu.Lock()
	g.releaseLocked()
	g.mu.Unlock()
}

func (g *Gate) releaseLocked() {
	for _, q := range []*list.List{&g.resumed, &g.fresh} {
		if e := q.Front(); e != nil {
			w := q.Remove(e).(*waiter)
			w.granted = true
			close(w.ready)
			return // the slot passes to w: inUse is unchanged
		}
	}
	g.inUse--
}

// Ticket is one request's place at a gate: whether it holds a slot, is
// waiting on the network (paused), or is exempt. Its methods may be called
// from the request's goroutines at once (gqlgen resolves some fields
// concurrently): the slot is given back while any of them waits and taken
// again when the last wait ends.
type Ticket struct {
	g      *Gate
	mu     sync.Mutex
	held   bool
	exempt bool
	pauses int  // waits under way
	retake bool // a slot was given back for them: take one when they end
}

// NewTicket is a ticket of g holding nothing yet.
func (g *Gate) NewTicket() *Ticket { return &Ticket{g: g} }

// Acquire takes a slot for t, waiting behind the requests that came first
// for at most wait (0: as long as ctx lasts). It reports whether it waited.
// An exempt ticket, or one holding a slot, returns at once.
func (t *Ticket) Acquire(ctx context.Context, wait time.Duration) (waited bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exempt || t.held {
		return false, nil
	}
	var timeout <-chan time.Time
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		timeout = timer.C
	}
	waited, err = t.g.acquire(ctx, false, timeout)
	t.held = err == nil
	return waited, err
}

// Held reports whether t holds a slot.
func (t *Ticket) Held() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held
}

// Exempt gives t's slot back for good: its request runs without one.
func (t *Ticket) Exempt() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.exempt = true
	t.giveBackLocked()
}

// Leave gives t's slot back at the end of its request.
func (t *Ticket) Leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.giveBackLocked()
	t.exempt = true // nothing is taken again
}

func (t *Ticket) giveBackLocked() {
	if t.held {
		t.held = false
		t.g.release()
	}
}

// pause marks the start of a wait: the first gives the slot back, and a
// slot held then is taken again when the last wait ends (resume).
func (t *Ticket) pause() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pauses++
	if t.pauses == 1 && t.held {
		t.held, t.retake = false, true
		t.g.release()
	}
}

// resume ends a wait; the last one takes a slot again, ahead of the
// requests that have not started, unless ctx is done (the request is
// ending: it finishes without one).
func (t *Ticket) resume(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pauses--
	if t.pauses > 0 || !t.retake {
		return
	}
	t.retake = false
	if t.exempt {
		return
	}
	if _, err := t.g.acquire(ctx, true, nil); err == nil {
		t.held = true
	}
}

type ticketKey struct{}

// WithTicket carries t in ctx, for Pause.
func WithTicket(ctx context.Context, t *Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// FromContext is the ticket ctx carries, or nil.
func FromContext(ctx context.Context) *Ticket {
	t, _ := ctx.Value(ticketKey{}).(*Ticket)
	return t
}

// Detach is ctx without its ticket: for work that another goroutine does
// on behalf of the request and of others (a batch), which must never wait
// for the request's slot.
func Detach(ctx context.Context) context.Context {
	if FromContext(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, ticketKey{}, (*Ticket)(nil))
}

func noop() {}

// Pause gives back the slot of ctx's request for a wait on the network or
// on another goroutine; the function it returns ends the wait, taking a
// slot again. Without a ticket in ctx both do nothing.
//
//	defer cpugate.Pause(ctx)()
func Pause(ctx context.Context) (resume func()) {
	t := FromContext(ctx)
	if t == nil {
		return noop
	}
	t.pause()
	return func() { t.resume(ctx) }
}
