package db

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/tracing"
)

// tracerName names the ledger's spans' instrumentation scope.
const tracerName = "github.com/dropline/dropline/db"

// Traced returns the ledger with its transactions traced by tp: each
// transaction run inside a traced operation (a commit, a write-behind batch,
// a restock) gets one span, "transaction <name>", around its statements,
// whose own spans (otelpgx, on the pool) are its children. Outside a traced
// operation no span is made (tracing.ChildOnly). A nil tp returns l as it
// is: no span, no context value, no allocation, the transaction run as
// before. The traced ledger gathers its sales into batches of its own.
func (l *Ledger) Traced(tp trace.TracerProvider) *Ledger {
	if tp == nil {
		return l
	}
	c := *l
	c.tracer = tracing.Tracer(tracing.ChildOnly(tp), tracerName)
	c.sales = newSaleBatcher(&c)
	return &c
}

// inTx runs fn in one transaction (pgx.BeginTxFunc: committed when fn
// returns nil, rolled back otherwise), under its span when the ledger is
// traced. fn receives the context its statements run under: the span's.
func (l *Ledger) inTx(ctx context.Context, name string, opts pgx.TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if l.tracer == nil {
		return pgx.BeginTxFunc(ctx, l.pool, opts, func(tx pgx.Tx) error { return fn(ctx, tx) })
	}
	ctx, span := l.startTx(ctx, name)
	err := pgx.BeginTxFunc(ctx, l.pool, opts, func(tx pgx.Tx) error { return fn(ctx, tx) })
	endTx(span, err)
	return err
}

// startTx starts the span of one transaction; the caller ends it with
// endTx. Only for a traced ledger.
func (l *Ledger) startTx(ctx context.Context, name string) (context.Context, trace.Span) {
	return l.tracer.Start(ctx, "transaction "+name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system", "postgresql"), attribute.String("db.operation.name", name)))
}

func endTx(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "rolled back")
	}
	span.End()
}
