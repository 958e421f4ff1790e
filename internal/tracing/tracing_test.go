package tracing_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/dropline/dropline/internal/tracing"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEnabledFollowsTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "otlp"}, true},
	} {
		require.Equal(t, tc.want, tracing.Enabled(func(k string) string { return tc.env[k] }), "%v", tc.env)
	}
}

func TestOffIsNil(t *testing.T) {
	p, err := tracing.New(context.Background(), false, "test")
	require.NoError(t, err)
	require.Nil(t, p.TracerProvider())
	require.Nil(t, tracing.Tracer(p.TracerProvider(), "x"))
	require.Nil(t, tracing.ChildOnly(nil))
	require.NoError(t, p.Shutdown(context.Background()))
}

// TestChildOnly: a span is made only under another one.
func TestChildOnly(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tracing.ChildOnly(tp).Tracer("test")

	_, s := tr.Start(context.Background(), "orphan")
	s.End()
	require.Empty(t, exp.GetSpans())

	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	_, s = tr.Start(ctx, "child")
	s.End()
	parent.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	require.Equal(t, "child", spans[0].Name)
	require.Equal(t, parent.SpanContext().SpanID(), spans[0].Parent.SpanID())
}

func TestTraceparentRoundTrip(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	ctx, s := tp.Tracer("test").Start(context.Background(), "x")
	defer s.End()
	h := tracing.Traceparent(ctx)
	require.Len(t, h, 55)
	sc := tracing.ParseTraceparent(h)
	require.Equal(t, s.SpanContext().TraceID(), sc.TraceID())
	require.Equal(t, s.SpanContext().SpanID(), sc.SpanID())
	require.True(t, sc.IsRemote())
	require.Empty(t, tracing.Traceparent(context.Background()))
	require.False(t, tracing.ParseTraceparent("garbage").IsValid())

	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx, s2 := unsampled.Tracer("test").Start(context.Background(), "y")
	defer s2.End()
	require.Empty(t, tracing.Traceparent(ctx), "an unsampled span is not carried")
}
