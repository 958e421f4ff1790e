package graphql

import (
	"context"

	gqlgen "github.com/99designs/gqlgen/graphql"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// operationTracer makes one span per GraphQL response: the whole of a query
// or a mutation (parsing is cached, so it is the run of its resolvers, with
// the Redis and Postgres spans they cause beneath it), and each event of a
// subscription. It continues the trace of the request's traceparent (the
// server's middleware put it in the context). The span is named after the
// operation ("mutation Reserve"); the document and the variables are not
// recorded: they carry buyers' data and tokens. It is installed only when
// tracing is on.
type operationTracer struct {
	tracer trace.Tracer
}

var _ interface {
	gqlgen.HandlerExtension
	gqlgen.ResponseInterceptor
} = operationTracer{}

func (operationTracer) ExtensionName() string                  { return "OperationTracer" }
func (operationTracer) Validate(gqlgen.ExecutableSchema) error { return nil }
func (t operationTracer) InterceptResponse(ctx context.Context, next gqlgen.ResponseHandler) *gqlgen.Response {
	// A body gqlgen cannot decode reaches here with no operation at all.
	if !gqlgen.HasOperationContext(ctx) {
		return next(ctx)
	}
	oc := gqlgen.GetOperationContext(ctx)
	kind := "operation"
	if oc.Operation != nil {
		kind = string(oc.Operation.Operation)
	}
	name := kind
	if oc.OperationName != "" {
		name += " " + oc.OperationName
	} else if oc.Operation != nil && oc.Operation.Name != "" {
		name += " " + oc.Operation.Name
	}
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("graphql.operation.type", kind),
			attribute.String("graphql.operation.name", operationName(oc))))
	defer span.End()
	resp := next(ctx)
	if resp != nil && len(resp.Errors) > 0 {
		span.SetAttributes(attribute.Int("graphql.errors", len(resp.Errors)))
		span.SetStatus(codes.Error, resp.Errors[0].Message)
	}
	return resp
}

func operationName(oc *gqlgen.OperationContext) string {
	if oc.OperationName != "" {
		return oc.OperationName
	}
	if oc.Operation != nil {
		return oc.Operation.Name
	}
	return ""
}
