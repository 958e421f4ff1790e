package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/inventory"
)

// applyTrace is the tracing of one write-behind batch: a span for the
// batch ("write-behind apply", a new trace, under which the Postgres
// transaction's statements are traced), linked to every traced request
// whose event it carries; and, for each such event, a span in that
// request's own trace ("write-behind record <kind>"), covering the same
// time and linked back to the batch's, so the trace of a reserve shows the
// moment its hold reached the ledger. The zero value (tracing off, or no
// traced event in the batch) does nothing.
type applyTrace struct {
	span    trace.Span
	began   time.Time
	records []applyRecord
}

type applyRecord struct {
	parent trace.SpanContext
	kind   string
	event  string
}

// startApply starts the batch's span when tracing is on and returns the
// context the batch's writes run in.
func (f *Flusher) startApply(ctx context.Context, p int, batch []inventory.OutboxEntry) (context.Context, applyTrace) {
	if f.tracer == nil {
		return ctx, applyTrace{}
	}
	var at applyTrace
	var links []trace.Link
	for _, e := range batch {
		sc := tracing.ParseTraceparent(e.Traceparent)
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
		at.records = append(at.records, applyRecord{parent: sc, kind: e.Event.Kind, event: e.Event.ID})
	}
	if len(links) == 0 {
		return ctx, applyTrace{}
	}
	at.began = time.Now()
	ctx, at.span = f.tracer.Start(ctx, "write-behind apply", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("dropline.partition", p), attribute.Int("dropline.batch.size", len(batch))))
	return ctx, at
}

// end ends the batch's span and makes each traced event's record span:
// applied says whether the batch reached the ledger.
func (f *Flusher) endApply(at applyTrace, applied int, err error) {
	if at.span == nil {
		return
	}
	at.span.SetAttributes(attribute.Int("dropline.applied", applied))
	if err != nil {
		at.span.RecordError(err)
		at.span.SetStatus(codes.Error, err.Error())
	}
	end := time.Now()
	back := trace.Link{SpanContext: at.span.SpanContext()}
	for _, r := range at.records {
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), r.parent)
		_, s := f.tracer.Start(ctx, "write-behind record "+r.kind, trace.WithTimestamp(at.began), trace.WithLinks(back),
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(attribute.String("dropline.event", r.event)))
		if err != nil {
			s.SetStatus(codes.Error, err.Error())
		}
		s.End(trace.WithTimestamp(end))
	}
	at.span.End(trace.WithTimestamp(end))
}
