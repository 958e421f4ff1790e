package inventory

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dropline/dropline/internal/tracing"
	"github.com/dropline/dropline/lua"
)

// tracerName names the engine's spans' instrumentation scope.
const tracerName = "github.com/dropline/dropline/inventory"

// startScript starts the span of one run of script name inside ctx's span:
// "script reserve". Without a tracer (tracing off) or a span to hang it
// under (a worker's own polling) it does nothing and costs a nil check.
func (e *Engine) startScript(ctx context.Context, name string) (context.Context, trace.Span) {
	if e.tracer == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	return e.tracer.Start(ctx, "script "+name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system", "redis"), attribute.String("dropline.script", name)))
}

// endSpan ends span (nil: none was started), marking it failed with err.
func endSpan(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// traceOf is what a reserve carries of its caller's trace into its batch:
// the caller's span, to link the batch to and from, and its traceparent,
// which reserve.lua writes into the hold's outbox event so the write-behind
// continues the trace. Empty when tracing is off or the caller has no span.
func (e *Engine) traceOf(ctx context.Context, c *reserveCall) {
	if e.tracer == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.SpanContext().IsValid() {
		return
	}
	c.span = span
	c.traceparent = tracing.Traceparent(ctx)
}

// startBatch starts the span of one run of reserve.lua for a batch of
// reserves: under the span of the reserve that started it (ctx), linked to
// the span of every reserve it decides, and each of those is linked back to
// it when it ends (endBatch). Nil when tracing is off or no reserve of the
// batch is traced.
func (e *Engine) startBatch(ctx context.Context, p int, calls []*reserveCall) (context.Context, trace.Span) {
	if e.tracer == nil {
		return ctx, nil
	}
	var links []trace.Link
	for _, c := range calls {
		if c.span != nil {
			links = append(links, trace.Link{SpanContext: c.span.SpanContext()})
		}
	}
	if len(links) == 0 {
		return ctx, nil
	}
	return e.tracer.Start(ctx, "script "+lua.Reserve, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("db.system", "redis"), attribute.String("dropline.script", lua.Reserve),
			attribute.Int("dropline.partition", p), attribute.Int("dropline.batch.size", len(calls))))
}

// endBatch links each traced reserve of the batch back to its span and ends
// it. It runs before the reserves are told their replies, so their spans
// are still open.
func endBatch(span trace.Span, calls []*reserveCall, err error) {
	if span == nil {
		return
	}
	link := trace.Link{SpanContext: span.SpanContext()}
	for _, c := range calls {
		if c.span != nil {
			c.span.AddLink(link)
		}
	}
	endSpan(span, err)
}
