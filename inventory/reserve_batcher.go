package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/cpugate"
	"github.com/dropline/dropline/inventory/script"
	"github.com/dropline/dropline/lua"
)

const (
	// maxReserveBatch bounds the requests one run of reserve.lua decides:
	// Redis runs nothing else meanwhile (64 reserves are well under a
	// millisecond of its time). reserve.lua unpacks a run's holds into one
	// EXISTS (one value a hold) and its expiries into one ZADD (two a
	// hold), and Redis's Lua unpacks at most about 8,000 values, so a batch
	// must stay far below 4,000.
	maxReserveBatch = 64
	// reserveBatchesInFlight is how many batches of one partition may be on
	// their way at once: with two, Redis runs one while the replies of the
	// other travel back, and the requests that arrive meanwhile wait for the
	// next.
	reserveBatchesInFlight = 2
	// reserveBatchTimeout bounds one batch's script (its callers may stop
	// waiting sooner).
	reserveBatchTimeout = 10 * time.Second
)

// reserveBatcher is group commit for reserves: the reserves of one partition
// that arrive while earlier batches of the partition are on their way queue
// up and go to Redis together, as one run of reserve.lua that decides each
// request in turn. Redis then pays for one script call, one command and one
// reply per batch instead of per reserve, and announces each SKU once per
// batch. The decisions are those of the same requests run one after the
// other: each request is checked completely (idempotency, sale window,
// quota, stock) before its own writes, against the writes of the requests
// before it.
//
// Nothing waits for a batch to fill: a reserve that finds fewer than
// reserveBatchesInFlight batches of its partition on their way starts one at
// once, so on a quiet partition every reserve is a batch of one.
type reserveBatcher struct {
	mu    sync.Mutex
	parts map[int]*reserveQueue
}

// reserveQueue is one partition's waiting requests and how many of its
// batches are on their way.
type reserveQueue struct {
	pending  []*reserveCall
	inFlight int
}

// reserveCall is one request of a batch: its part of reserve.lua's KEYS and
// ARGV, and, once done is closed, its reply or the batch's error. left says
// its caller stopped waiting: a batch that has not left yet drops it.
type reserveCall struct {
	req  script.ReserveRequest
	done chan struct{}
	res  script.ReserveReply
	err  error
	left atomic.Bool
	// span and traceparent are the caller's, when tracing is on and the
	// caller is traced (traceOf): the batch links to the span, and
	// reserve.lua writes the traceparent into the hold's event.
	span        trace.Span
	traceparent string
}

// token is the token of the hold the request makes.
func (c *reserveCall) token() string { return c.req.Token }

// reserveInBatch runs one request of reserve.lua in partition p, batched with
// the partition's concurrent requests. It returns when its batch answered, or
// with ctx's error when ctx ends first. A request whose batch has not left
// by then is not sent; one already on its way may still be decided (the
// batch does not stop for one caller, as a lost reply would not; its token
// replays the hold on a retry).
func (e *Engine) reserveInBatch(ctx context.Context, p int, c *reserveCall) (script.ReserveReply, error) {
	c.done = make(chan struct{})
	e.traceOf(ctx, c)
	b := &e.batches
	b.mu.Lock()
	if b.parts == nil {
		b.parts = map[int]*reserveQueue{}
	}
	q := b.parts[p]
	if q == nil {
		q = &reserveQueue{}
		b.parts[p] = q
	}
	q.pending = append(q.pending, c)
	start := q.inFlight < reserveBatchesInFlight
	if start {
		q.inFlight++
	}
	b.mu.Unlock()
	if start {
		// The batch carries the starter's values, not its end: it decides
		// for every request in it.
		go e.drainReserves(cpugate.Detach(context.WithoutCancel(ctx)), p, q)
	}
	// The batch runs on another goroutine: the caller's slot of the
	// gate is free meanwhile.
	defer cpugate.Pause(ctx)()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		c.left.Store(true)
		return script.ReserveReply{}, ctx.Err()
	}
}

// drainReserves sends partition p's waiting requests in batches until none
// waits.
func (e *Engine) drainReserves(ctx context.Context, p int, q *reserveQueue) {
	b := &e.batches
	for {
		b.mu.Lock()
		if len(q.pending) == 0 {
			q.inFlight--
			q.pending = nil // let go of the backing array a burst grew
			b.mu.Unlock()
			return
		}
		n := min(len(q.pending), maxReserveBatch)
		calls := q.pending[:n:n]
		q.pending = q.pending[n:]
		b.mu.Unlock()
		// Nobody would hear of the holds of callers that left.
		calls = slices.DeleteFunc(calls, func(c *reserveCall) bool { return c.left.Load() })
		if len(calls) > 0 {
			e.runReserveBatch(ctx, p, calls)
		}
	}
}

// reserveScript is reserve.lua's call for a batch of partition p. When a
// request of the batch is traced, the requests' traceparents follow the
// requests' arguments, one each ("" for one that is not).
func (e *Engine) reserveScript(p int, calls []*reserveCall) script.Call {
	reqs := make([]script.ReserveRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
		reqs[i].Traceparent = c.traceparent
	}
	return script.Reserve{Partition: p, IdempotencyTTL: int64(e.cfg.IdempotencyTTL.Seconds()), MaxQuantity: e.cfg.MaxQuantity,
		MaxHoldMs: e.cfg.MaxHold.Milliseconds(), RejectionTTL: int64(e.cfg.RejectionTTL.Seconds()), Requests: reqs}.Call(e.keys)
}

// runReserveBatch runs one batch and hands each request its reply.
func (e *Engine) runReserveBatch(ctx context.Context, p int, calls []*reserveCall) {
	call := e.reserveScript(p, calls)
	ctx, span := e.startBatch(ctx, p, calls)
	ctx, cancel := context.WithTimeout(ctx, reserveBatchTimeout)
	res, err := e.runReplicated(ctx, call)
	cancel()
	endBatch(span, calls, err)
	e.metrics.reserveBatch.Observe(float64(len(calls)))
	var replies []script.ReserveReply
	if err == nil {
		replies, err = script.ReserveRepliesOf(res, len(calls))
	}
	for i, c := range calls {
		switch {
		case err != nil:
			c.err = err
		case replies[i].Code == string(codeReserveError):
			c.err = unavailable(fmt.Sprintf("running %s for request %d", lua.Reserve, i), errors.New(replies[i].Message))
		default:
			c.res = replies[i]
		}
		close(c.done)
	}
}
