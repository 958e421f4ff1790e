package db

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/batch"
)

const (
	// maxSaleBatch bounds the sales one call of record_sales writes. Each
	// sale is a subtransaction; PostgreSQL keeps up to 64 of a transaction's
	// in shared memory before every other backend's snapshots get dearer.
	maxSaleBatch = 32
	// saleBatchesInFlight is how many batches may be on their way at once:
	// with two, one writes its rows while the other holds the products rows
	// for its updates and its commit, and the sales that arrive meanwhile
	// gather for the next.
	saleBatchesInFlight = 2
	// saleBatchTimeout bounds a batch whose callers set no deadline.
	saleBatchTimeout = 10 * time.Second
)

// saleBatcher is group commit for sales: the sales that arrive while earlier
// batches are on their way queue up and are written together, in one
// transaction (record_sales, migration 0019). The hot SKU's products row is
// then locked, and the WAL flushed, once per batch instead of once per sale,
// and the sales of one SKU no longer wait for each other one by one.
//
// Nothing waits for a batch to fill: a sale that finds fewer than
// saleBatchesInFlight batches on their way starts one at once, so on a quiet
// ledger every sale is a batch of one.
type saleBatcher struct {
	*batch.Batcher[struct{}, saleReq, Sale]
	// batches and sales count what was sent, alone the sales then written
	// one at a time (busy, or their batch refused), for tests and metrics.
	batches, sales, alone atomic.Int64
}

// saleReq is one sale of a batch: its reservation, and its caller's
// deadline and span (when it is traced).
type saleReq struct {
	r        Reservation
	deadline time.Time
	span     trace.SpanContext
}

type saleCall = batch.Call[saleReq, Sale]

// newSaleBatcher is l's sale batcher.
func newSaleBatcher(l *Ledger) *saleBatcher {
	b := &saleBatcher{}
	b.Batcher = batch.New(batch.Options{Max: maxSaleBatch, InFlight: saleBatchesInFlight,
		NotSent: func(err error) error { return &errNotSent{err} }},
		func(ctx context.Context, _ struct{}, calls []*saleCall) { l.runSaleBatch(ctx, calls) })
	return b
}

// errNotSent is the error of a sale whose caller stopped waiting before its
// batch left: nothing of it reached Postgres, so it is safe to retry (it
// satisfies pgconn.SafeToRetry).
type errNotSent struct{ err error }

func (e *errNotSent) Error() string     { return "the sale was not sent: " + e.err.Error() }
func (e *errNotSent) Unwrap() error     { return e.err }
func (e *errNotSent) SafeToRetry() bool { return true }

// SaleBatches reports how many batches of sales the ledger has sent, how
// many sales they held, and how many of those were then written alone (their
// rows were busy, or Postgres refused their batch).
func (l *Ledger) SaleBatches() (batches, sales, alone int64) {
	if l.sales == nil {
		return 0, 0, 0
	}
	return l.sales.batches.Load(), l.sales.sales.Load(), l.sales.alone.Load()
}

// recordSaleInBatch writes one sale with the concurrent ones. It returns
// when its batch answered, or when ctx ends: with an error that is safe to
// retry if the sale had not left, else with ctx's error (the sale may still
// be written: the batch does not stop for one caller).
func (l *Ledger) recordSaleInBatch(ctx context.Context, r Reservation) (Sale, error) {
	req := saleReq{r: r, span: trace.SpanContextFromContext(ctx)}
	req.deadline, _ = ctx.Deadline()
	return l.sales.Do(ctx, struct{}{}, req)
}

// runSaleBatch writes one batch and hands each sale its answer. When
// Postgres refuses the batch as a whole (a SKU's sales together would
// oversell, a deadlock, a value of one sale it rejects), nothing of it was
// written, and each sale is written alone with record_sale, which answers
// for that sale only.
func (l *Ledger) runSaleBatch(ctx context.Context, calls []*saleCall) {
	// SKU then token: the order two batches, or a batch and a cart, take
	// the rows they share.
	slices.SortFunc(calls, func(a, b *saleCall) int {
		return strings.Compare(a.Req.r.SKU+"\x00"+a.Req.r.Token, b.Req.r.SKU+"\x00"+b.Req.r.Token)
	})
	deadline := time.Now().Add(saleBatchTimeout)
	if latest := slices.MaxFunc(calls, func(a, b *saleCall) int { return a.Req.deadline.Compare(b.Req.deadline) }).Req.deadline; !latest.IsZero() {
		deadline = latest
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var span trace.Span
	if l.tracer != nil {
		ctx, span = l.startSaleBatch(ctx, calls)
	}
	l.sales.batches.Add(1)
	l.sales.sales.Add(int64(len(calls)))
	answers, err := l.writeSales(ctx, calls)
	for _, a := range answers {
		if a.busy {
			l.sales.alone.Add(1)
		}
	}

	if span != nil {
		endTx(span, err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// The transaction rolled back: each sale on its own.
		l.sales.alone.Add(int64(len(calls)))
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Go(func() { c.Answer(recordSale(ctx, l.salePool, c.Req.r, "")) })
		}
		wg.Wait()
		return
	}
	var wg sync.WaitGroup
	for i, c := range calls {
		switch {
		case err != nil:
			c.Answer(Sale{}, err)
		case answers[i].busy:
			// Another transaction held its rows: alone, it may wait for
			// them without holding anything of the others.
			wg.Go(func() { c.Answer(recordSale(ctx, l.salePool, c.Req.r, "")) })
		default:
			c.Answer(answers[i].sale, answers[i].err)
		}
	}
	wg.Wait()
}

// saleAnswer is record_sales's answer for one sale.
type saleAnswer struct {
	sale Sale
	err  error
	// busy says another transaction held the sale's rows: nothing of it
	// was written.
	busy bool
}

// writeSales calls record_sales for calls, and returns its answers in the
// calls' order.
func (l *Ledger) writeSales(ctx context.Context, calls []*saleCall) ([]saleAnswer, error) {
	n := len(calls)
	tokens, skus, principals := make([]string, n), make([]string, n), make([]string, n)
	quantities := make([]int32, n)
	idem, req := make([]string, n), make([]string, n)
	expires, created := make([]time.Time, n), make([]time.Time, n)
	for i, c := range calls {
		r := c.Req.r
		tokens[i], skus[i], principals[i], quantities[i] = r.Token, r.SKU, r.Principal, int32(r.Quantity)
		idem[i], req[i], expires[i], created[i] = r.IdempotencyHash, r.RequestHash, r.ExpiresAt, r.CreatedAt
	}
	rows, err := l.salePool.Query(ctx, `SELECT sold_token, outcome, sold_sku, sold_principal, sold_quantity, sold_at, detail
		FROM record_sales($1, $2, $3, $4, $5, $6, $7, $8)`,
		tokens, skus, principals, quantities, idem, req, expires, created)
	if err != nil {
		return nil, err
	}
	// One row a sale, in the order sent (a token sent twice is answered
	// twice: the second time as replayed).
	answers := make([]saleAnswer, n)
	i := 0
	for rows.Next() {
		var (
			token, outcome       string
			sku, principal, note *string
			quantity             *int32
			at                   *time.Time
		)
		if err := rows.Scan(&token, &outcome, &sku, &principal, &quantity, &at, &note); err != nil {
			rows.Close()
			return nil, err
		}
		if i >= n || token != tokens[i] {
			rows.Close()
			return nil, fmt.Errorf("record_sales answered for %s out of turn", token)
		}
		switch outcome {
		case "sold", "replayed":
			if sku == nil || principal == nil || quantity == nil || at == nil {
				rows.Close()
				return nil, fmt.Errorf("record_sales answered %s for %s without its sale", outcome, token)
			}
			answers[i].sale = Sale{Token: token, SKU: *sku, Principal: *principal, Quantity: int(*quantity), CommittedAt: *at}
		case "ended":
			status := ""
			if note != nil {
				status = *note
			}
			answers[i].err = &EndedError{Status: status}
		case "busy":
			answers[i].busy = true
		default:
			rows.Close()
			return nil, fmt.Errorf("record_sales answered %q for %s", outcome, token)
		}
		i++
	}
	// The commit is the end of the statement: its error (a failed flush,
	// the DL004 of the products' updates) comes here.
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if i != n {
		return nil, fmt.Errorf("record_sales answered %d sales of %d", i, n)
	}
	return answers, nil
}

// startSaleBatch starts a batch's transaction span: in its caller's trace
// when the batch is one sale, else in a trace of its own linking the traced
// callers.
func (l *Ledger) startSaleBatch(ctx context.Context, calls []*saleCall) (context.Context, trace.Span) {
	if len(calls) == 1 {
		return l.startTx(trace.ContextWithSpanContext(ctx, calls[0].Req.span), "record_sale")
	}
	var links []trace.Link
	for _, c := range calls {
		if c.Req.span.IsValid() {
			links = append(links, trace.Link{SpanContext: c.Req.span})
		}
	}
	return l.tracer.Start(ctx, "transaction record_sale", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system", "postgresql"), attribute.String("db.operation.name", "record_sale"),
			attribute.Int("dropline.sales", len(calls))))
}
