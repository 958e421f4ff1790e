package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// ChildOnly wraps tp so that its tracers make a span only inside another
// one: a Redis command or a Postgres query that a traced operation, batch
// or write-behind run issues gets its span, while the workers' own polling
// (stream reads, lease renewals, sweeps: several commands a second per
// partition, none of them asked for by anyone) makes no trace of its own.
// redisotel and otelpgx are given it. Nil stays nil.
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return nil
	}
	return childOnlyProvider{tp: tp}
}

type childOnlyProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (p childOnlyProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{t: p.tp.Tracer(name, opts...)}
}

type childOnlyTracer struct {
	embedded.Tracer
	t trace.Tracer
}

var noopSpan = noop.Span{}

func (t childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, noopSpan
	}
	return t.t.Start(ctx, name, opts...)
}
