// Package batch is group commit: the requests that arrive while earlier
// batches are on their way queue up, and go together in the next batch.
//
// Nothing waits for a batch to fill: a request that finds fewer than
// Options.InFlight batches of its key on their way starts one at once, so on
// a quiet key every request is a batch of one. The goroutine that a request
// starts (the drainer) sends the key's waiting requests in batches of at
// most Options.Max until none waits.
package batch

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options shape a Batcher's batches.
type Options struct {
	// Max bounds the requests of one batch.
	Max int
	// InFlight bounds the batches of one key on their way at once.
	InFlight int
	// SecondWhenFull: a batch besides one on its way starts only when more
	// than a whole batch (Max) waits; the rest wait for the batch on its
	// way to come back.
	SecondWhenFull bool
	// GatherFew and GatherWait: a drainer whose batch came back to requests
	// waiting, but fewer than GatherFew, waits up to GatherWait for that
	// many before it sends. A request that finds no batch on its way never
	// waits. Zero GatherFew: never.
	GatherFew  int
	GatherWait time.Duration
	// Forget drops a key's queue once its last batch finds nothing
	// waiting: for keys that come and go.
	Forget bool
	// NotSent is the error of a caller that stopped waiting before its
	// batch took it (nothing of it was sent), from its context's error;
	// nil returns the context's error.
	NotSent func(error) error
}

// Call is one request of a batch. Run answers each call of its batch once
// (Answer).
type Call[Req, Res any] struct {
	Req   Req
	res   Res
	err   error
	done  chan struct{}
	state atomic.Int32
}

// The states of a call: waiting until a batch takes it (taken) or its
// caller stops waiting first (left): a call that left is not sent.
const (
	waiting int32 = iota
	taken
	left
)

// Answer hands the call's caller its answer.
func (c *Call[Req, Res]) Answer(res Res, err error) {
	c.res, c.err = res, err
	close(c.done)
}

// Run sends one batch of key k and answers each of its calls.
type Run[K comparable, Req, Res any] func(ctx context.Context, k K, calls []*Call[Req, Res])

// Batcher gathers concurrent requests, by key, into batches for run.
type Batcher[K comparable, Req, Res any] struct {
	opts   Options
	run    Run[K, Req, Res]
	mu     sync.Mutex
	queues map[K]*queue[Req, Res]
}

// queue is one key's waiting requests and how many of its batches are on
// their way.
type queue[Req, Res any] struct {
	pending  []*Call[Req, Res]
	inFlight int
	// gathering is set while a drainer waits for GatherFew requests; the
	// request that makes them that many signals enough.
	gathering bool
	enough    chan struct{}
}

// New is a Batcher whose batches run sends.
func New[K comparable, Req, Res any](opts Options, run Run[K, Req, Res]) *Batcher[K, Req, Res] {
	return &Batcher[K, Req, Res]{opts: opts, run: run, queues: map[K]*queue[Req, Res]{}}
}

// Do sends req in a batch of k with the concurrent requests of k. It
// returns when its batch answered, or when ctx ends first: a request whose
// batch has not left by then is not sent (Options.NotSent), one already on
// its way may still be decided (the batch does not stop for one caller, as
// a lost reply would not).
func (b *Batcher[K, Req, Res]) Do(ctx context.Context, k K, req Req) (Res, error) {
	var zero Res
	if err := ctx.Err(); err != nil {
		return zero, b.notSent(err)
	}
	c := &Call[Req, Res]{Req: req, done: make(chan struct{})}
	b.mu.Lock()
	q := b.queues[k]
	if q == nil {
		q = &queue[Req, Res]{}
		b.queues[k] = q
	}
	q.pending = append(q.pending, c)
	start := q.inFlight < b.opts.InFlight &&
		(!b.opts.SecondWhenFull || q.inFlight == 0 || len(q.pending) > b.opts.Max)
	if start {
		q.inFlight++
	}
	if q.gathering && len(q.pending) >= b.opts.GatherFew {
		q.gathering = false
		select {
		case q.enough <- struct{}{}:
		default: // a signal not taken yet: at worst a batch leaves early
		}
	}
	b.mu.Unlock()
	if start {
		// The batches carry the starter's values, not its end: they
		// decide for every request in them.
		go b.drain(context.WithoutCancel(ctx), k, q)
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(waiting, left) {
			return zero, b.notSent(ctx.Err())
		}
		return zero, ctx.Err()
	}
}

func (b *Batcher[K, Req, Res]) notSent(err error) error {
	if b.opts.NotSent == nil {
		return err
	}
	return b.opts.NotSent(err)
}

// Waiting is how many requests of k wait for a batch, and whether a
// drainer of k waits for more before it sends.
func (b *Batcher[K, Req, Res]) Waiting(k K) (n int, gathering bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[k]; q != nil {
		return len(q.pending), q.gathering
	}
	return 0, false
}

// drain sends q's waiting requests in batches until none waits.
func (b *Batcher[K, Req, Res]) drain(ctx context.Context, k K, q *queue[Req, Res]) {
	var timer *time.Timer
	busy := false // this drainer's previous batch found requests waiting after it
	for {
		b.mu.Lock()
		if len(q.pending) == 0 {
			q.inFlight--
			q.pending = nil // let go of the backing array a burst grew
			if b.opts.Forget && q.inFlight == 0 && b.queues[k] == q {
				delete(b.queues, k)
			}
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if busy && len(q.pending) < b.opts.GatherFew && !q.gathering {
			timer = b.gather(q, timer)
		}
		n := min(len(q.pending), b.opts.Max)
		calls := q.pending[:n:n]
		q.pending = q.pending[n:]
		b.mu.Unlock()
		// Nobody would hear of the requests of callers that left.
		calls = slices.DeleteFunc(calls, func(c *Call[Req, Res]) bool { return !c.state.CompareAndSwap(waiting, taken) })
		if len(calls) > 0 {
			b.run(ctx, k, calls)
		}
		if b.opts.GatherFew > 0 {
			b.mu.Lock()
			busy = len(q.pending) > 0
			b.mu.Unlock()
		}
	}
}

// gather waits, with b.mu held and given back meanwhile, up to GatherWait
// for GatherFew requests of q. It returns the timer it used, for the next.
func (b *Batcher[K, Req, Res]) gather(q *queue[Req, Res], timer *time.Timer) *time.Timer {
	if q.enough == nil {
		q.enough = make(chan struct{}, 1)
	}
	q.gathering = true
	b.mu.Unlock()
	if timer == nil {
		timer = time.NewTimer(b.opts.GatherWait)
	} else {
		timer.Reset(b.opts.GatherWait)
	}
	select {
	case <-q.enough:
		timer.Stop() // no stale tick after Stop since Go 1.23
	case <-timer.C:
	}
	b.mu.Lock()
	if q.gathering {
		q.gathering = false
	} else {
		// enough was sent, maybe after the timer fired: take it so that
		// the next gathering starts empty.
		select {
		case <-q.enough:
		default:
		}
	}
	return timer
}
